"""directload.graph's files: graph.json checked as a whole and each part's .npy header against it, in both
mmap modes, every refusal a GraphError naming the file and the field; the digest kept and checked."""

import json

import numpy as np
import pytest
import torch

from directload.graph import CSCGraph, GraphError


@pytest.fixture
def saved(tmp_path):
    edge_index = torch.tensor([[0, 2, 1, 3, 0], [1, 0, 3, 1, 2]])  # unsorted: eids are kept
    g = CSCGraph.from_edge_index(edge_index, 4, edge_weight=torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    g.save(tmp_path, source="five edges")
    return tmp_path, g


def _manifest(where):
    return json.loads((where / "graph.json").read_text())


def _write_manifest(where, value):
    (where / "graph.json").write_text(json.dumps(value))


@pytest.mark.parametrize("mmap", [True, False])
def test_a_saved_graph_loads_whole_with_its_digest(saved, mmap):
    where, g = saved
    meta = _manifest(where)
    assert meta["format"] == 2 and meta["digest"] == g.digest() and meta["source"] == "five edges"
    h = CSCGraph.load(where, mmap=mmap, affinity="host", source="five edges")
    for a, b in zip(g.numpy(), h.numpy()):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert h.digest() == g.digest() and h.device.type == "cpu"


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("text,match", [
    ("[]", "a JSON array, not an object"),
    ("null", "a JSON null, not an object"),
    ("1", "a JSON number, not an object"),
    ('"graph"', "a JSON string, not an object"),
    ("{", "not JSON"),
    ("\xff", "not JSON"),
    ("{}", "field 'format' is None"),
])
def test_a_manifest_that_is_not_an_object_is_a_graph_error(saved, mmap, text, match):
    where, _ = saved
    (where / "graph.json").write_bytes(text.encode("latin1"))
    with pytest.raises(GraphError, match=match) as info:
        CSCGraph.load(where, mmap=mmap, affinity="host")
    assert str(where / "graph.json") in str(info.value)


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("field,value,match", [
    ("format", 99, "field 'format' is 99; this directload reads formats 1, 2"),
    ("format", True, "field 'format' is True"),
    ("format", "2", "field 'format' is '2'"),
    ("format", 2.0, "field 'format' is 2.0"),
    ("parts", "indptr", "field 'parts' is 'indptr'; it is a list of part names"),
    ("parts", ["indptr", 1], "field 'parts' is"),
    ("parts", ["indptr", "indices", "labels"], "field 'parts' names an unknown part 'labels'"),
    ("parts", ["indptr", "indices", "eids", "eids", "weights"], "field 'parts' names 'eids' twice"),
    ("parts", ["indptr"], "field 'parts' lacks 'indices'"),
    ("num_nodes", -1, "field 'num_nodes' is -1; it is a count"),
    ("num_nodes", True, "field 'num_nodes' is True"),
    ("num_edges", 5.0, "field 'num_edges' is 5.0"),
    ("num_src_nodes", None, "field 'num_src_nodes' is None"),
    ("source", 5, "field 'source' is 5; it is a string or null"),
    ("digest", "XYZ", "field 'digest' is 'XYZ'; it is 8 lowercase hex digits"),
    ("digest", None, "field 'digest' is None"),
    ("extra", 1, "field 'extra' is not one of format 2's"),
])
def test_every_field_of_the_manifest_is_checked(saved, mmap, field, value, match):
    where, _ = saved
    meta = _manifest(where)
    meta[field] = value
    _write_manifest(where, meta)
    with pytest.raises(GraphError, match=match) as info:
        CSCGraph.load(where, mmap=mmap, affinity="host")
    assert str(where / "graph.json") in str(info.value)


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("field", ["format", "parts", "num_nodes", "num_src_nodes", "num_edges", "source", "digest"])
def test_a_missing_field_is_named(saved, mmap, field):
    where, _ = saved
    meta = _manifest(where)
    del meta[field]
    _write_manifest(where, meta)
    with pytest.raises(GraphError, match=f"field '{field}' is"):
        CSCGraph.load(where, mmap=mmap, affinity="host")


@pytest.mark.parametrize("mmap", [True, False])
def test_a_format_1_manifest_without_a_digest_still_loads(saved, mmap):
    where, g = saved
    meta = _manifest(where)
    meta["format"] = 1
    del meta["digest"]
    _write_manifest(where, meta)
    h = CSCGraph.load(where, mmap=mmap, affinity="host")
    assert h.digest() == g.digest()
    meta["digest"] = g.digest()  # format 1 has no digest field
    _write_manifest(where, meta)
    with pytest.raises(GraphError, match="field 'digest' is not one of format 1's"):
        CSCGraph.load(where, mmap=mmap, affinity="host")


def _edit_header(path, old, new):
    data = path.read_bytes()
    head, body = data[:128], data[128:]
    assert old in head and len(old) == len(new)
    path.write_bytes(head.replace(old, new) + body)


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("part,old,new,match", [
    # the same bytes read as int32: twice the entries, garbage edge ids, unless the size is checked
    ("eids", b"'<i8'", b"'<i4'", "longer than its header says"),
    ("eids", b"'<i8'", b"'<f8'", "its header says <f8 of shape \\(5,\\); the part 'eids' is a 1-d array of int32 or"),
    ("eids", b"'<i8'", b"'>i8'", "its header says >i8"),
    ("eids", b"'<i8'", b"'<u8'", "its header says <u8"),
    ("weights", b"'<f4'", b"'<i4'", "the part 'weights' is a 1-d array of float32 or float64"),
    ("indices", b"(5,)", b"(4,)", "truncated|longer"),
])
def test_a_part_whose_header_was_edited_is_refused_in_both_modes(saved, mmap, part, old, new, match):
    where, _ = saved
    _edit_header(where / f"{part}.npy", old, new)
    with pytest.raises(GraphError, match=match) as info:
        CSCGraph.load(where, mmap=mmap, affinity="host")
    assert f"{part}.npy" in str(info.value)


@pytest.mark.parametrize("mmap", [True, False])
def test_a_part_of_another_length_than_the_manifest_says_is_refused(saved, mmap):
    where, _ = saved
    np.save(where / "eids.npy", np.arange(4, dtype=np.int64))  # a whole .npy, one entry short
    with pytest.raises(GraphError, match="eids.npy: 4 entries, and graph.json field 'num_edges' \\(5\\) gives"):
        CSCGraph.load(where, mmap=mmap, affinity="host")
    np.save(where / "indptr.npy", np.array([0, 5], dtype=np.int32))
    with pytest.raises(GraphError, match="indptr.npy: 2 entries, and graph.json field 'num_nodes' \\(4\\) gives"):
        CSCGraph.load(where, mmap=mmap, affinity="host")


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("part", ["indptr", "eids"])
def test_an_empty_or_missing_part_file_is_a_graph_error(saved, mmap, part):
    where, _ = saved
    (where / f"{part}.npy").write_bytes(b"")
    with pytest.raises(GraphError, match=f"{part}.npy: not a valid .npy file"):
        CSCGraph.load(where, mmap=mmap, affinity="host")
    (where / f"{part}.npy").unlink()
    with pytest.raises(GraphError, match=f"{part}.npy: missing, and graph.json field 'parts' names '{part}'"):
        CSCGraph.load(where, mmap=mmap, affinity="host")


@pytest.mark.parametrize("mmap", [True, False])
def test_a_part_changed_after_the_save_is_caught_by_the_digest(saved, mmap):
    where, g = saved
    eids = np.load(where / "eids.npy")
    eids[[0, 1]] = eids[[1, 0]]  # still a CSC: only the digest tells
    np.save(where / "eids.npy", eids)
    with pytest.raises(GraphError, match=f"graph.json: field 'digest' is {g.digest()}, the parts' digest is"):
        CSCGraph.load(where, mmap=mmap, affinity="host")
    trusted = CSCGraph.load(where, mmap=mmap, affinity="host", check=False)  # check=False trusts the files
    assert trusted.eids.tolist() == eids.tolist()


def test_load_names_another_source(saved):
    where, _ = saved
    with pytest.raises(GraphError, match="field 'source' is 'five edges', not 'six edges'"):
        CSCGraph.load(where, source="six edges")


def test_a_manifest_that_is_not_a_regular_file_is_refused_without_blocking(saved):
    import os

    where, _ = saved
    (where / "graph.json").unlink()
    os.mkfifo(where / "graph.json")  # opening a FIFO without a writer would wait for ever
    with pytest.raises(GraphError, match="a FIFO, not a regular file"):
        CSCGraph.load(where)


def test_save_takes_a_string_source(tmp_path):
    with pytest.raises(TypeError, match="source must be a str or None, got int"):
        CSCGraph(torch.tensor([0, 0]), torch.tensor([], dtype=torch.int64)).save(tmp_path, source=5)
