"""Fuzzed store files (hypothesis): any mutation of a store's header, sidecar or id map is refused with a
CorruptFileError, or, when harmless, reads exactly the true rows; no other exception, no wrong row, no
hang.  A plain .npy mutated anywhere in its header reads as numpy reads it, or is refused."""

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from directload.files import CorruptFileError
from directload.stores import DiskStore, read_layout, renumber, verify, write_disk_store
from directload.stores.disk_format import sidecar_crc
from directload.stores.generations import id_map_path, sidecar_path

ROWS = 60
TABLE = torch.arange(ROWS * 5, dtype=torch.float32).view(ROWS, 5)
FUZZ = settings(max_examples=int(os.environ.get("DIRECTLOAD_FUZZ_EXAMPLES", 150)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A plain store, a packed one and a plain .npy, made once and copied for every example."""
    base = tmp_path_factory.mktemp("stores")
    write_disk_store(TABLE, base / "plain.npy", progress=False, chunk_bytes=256)
    renumber(base / "plain.npy", base / "packed.npy", np.arange(ROWS) % 7, progress=False)
    np.save(base / "numpy.npy", TABLE.numpy())
    return base


@contextlib.contextmanager
def copy_of(base):
    """A scratch copy of the stores under ``base`` (links kept), removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        shutil.copytree(base, work, symlinks=True, dirs_exist_ok=True)
        yield work
    finally:
        shutil.rmtree(work)


def outcome(path):
    """The rows every id reads and verify's report, or the CorruptFileError that refused the store.
    Any other exception fails the test."""
    def run():
        with DiskStore(path, direct=False) as store:
            rows = store.read(torch.arange(store.num_rows)) if store.num_rows else None
        return rows, verify(path, progress=False) if read_layout(path).sidecar else None

    try:
        return within(20, run)
    except CorruptFileError:
        return None


def mutate(data, edits):
    out = bytearray(data)
    for kind, pos, value in edits:
        if not out:
            break
        pos %= len(out) + (kind == "insert")
        if kind == "set":
            out[pos % len(out)] = value
        elif kind == "insert":
            out[pos:pos] = bytes([value])
        elif kind == "delete":
            del out[pos % len(out)]
        else:  # truncate
            del out[pos % len(out):]
    return bytes(out)


EDITS = st.lists(st.tuples(st.sampled_from(["set", "set", "set", "insert", "delete", "truncate"]),
                           st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)
# mostly the header (the first 4 KiB), sometimes the rows
HEADER_EDITS = st.lists(st.tuples(st.sampled_from(["set", "set", "set", "insert", "delete", "truncate"]),
                                  st.one_of(st.integers(0, 160), st.integers(0, 4200)), st.integers(0, 255)),
                        min_size=1, max_size=6)


@FUZZ
@given(edits=HEADER_EDITS, which=st.sampled_from(["plain.npy", "packed.npy"]))
def test_a_mutated_store_header_is_refused_or_reads_the_true_rows(stores, edits, which):
    with copy_of(stores) as work:
        data = read_layout(work / which).path
        data.write_bytes(mutate(data.read_bytes(), edits))
        got = outcome(work / which)
        if got is not None and not torch.equal(got[0], TABLE):
            # reads do not checksum rows (a 4 KiB read would cost a 4 MiB chunk): verify finds the damage
            assert got[1]["bad_chunks"], "rows changed and verify saw nothing"


@FUZZ
@given(edits=HEADER_EDITS)
def test_a_mutated_plain_npy_reads_as_numpy_reads_it_or_is_refused(stores, edits):
    with copy_of(stores) as work:
        path = work / "numpy.npy"
        path.write_bytes(mutate(path.read_bytes(), edits))
        got = outcome(path)
        if got is not None:
            want = np.load(path)  # numpy accepts what we accept (we are stricter)
            rows = got[0]
            if rows is None:
                assert want.size == 0 or want.shape[0] == 0
            else:
                assert rows.numpy().tobytes() == np.ascontiguousarray(want).tobytes()


JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False)
                    | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4),
                    max_leaves=12)
KEYS = st.sampled_from(["format", "version", "generation", "token", "data", "dtype", "npy_descr", "shape",
                        "data_offset", "file_bytes", "chunk_bytes", "checksum", "chunks", "source", "id_map",
                        "id_map.file", "id_map.rows", "id_map.crc32c", "sidecar_crc32c", "new-key"])


@FUZZ
@given(changes=st.lists(st.tuples(KEYS, st.one_of(st.just("<delete>"), JSON)), min_size=1, max_size=4),
       forge=st.booleans(), which=st.sampled_from(["plain.npy", "packed.npy"]))
def test_a_mutated_sidecar_is_refused_or_reads_the_true_rows(stores, changes, forge, which):
    with copy_of(stores) as work:
        side = sidecar_path(read_layout(work / which).path)
        meta = json.loads(side.read_text())
        for key, value in changes:
            parent, _, leaf = key.rpartition(".")
            target = meta.get(parent) if parent else meta
            if not isinstance(target, dict):
                continue
            if value == "<delete>":
                target.pop(leaf, None)
            else:
                target[leaf] = value
        if forge:
            meta["sidecar_crc32c"] = sidecar_crc(meta)
        side.write_text(json.dumps(meta))
        got = outcome(work / which)
        if got is not None:
            assert torch.equal(got[0], TABLE)


@FUZZ
@given(content=st.binary(max_size=300))
def test_arbitrary_bytes_as_a_sidecar_are_refused(stores, content):
    with copy_of(stores) as work:
        sidecar_path(read_layout(work / "plain.npy").path).write_bytes(content)
        assert outcome(work / "plain.npy") is None


@FUZZ
@given(edits=EDITS)
def test_a_mutated_id_map_is_refused_or_reads_the_true_rows(stores, edits):
    with copy_of(stores) as work:
        path = id_map_path(read_layout(work / "packed.npy").path)
        path.write_bytes(mutate(path.read_bytes(), edits))
        got = outcome(work / "packed.npy")
        if got is not None:
            assert torch.equal(got[0], TABLE)
