"""Stores of compressed rows: the disk format's version 3 (the codec in the checksummed sidecar), writing codes
(``write_disk_store(codec=)``), caches whose capacity counts code bytes, and ``StoreSpec(codec=)``'s rules."""

import json

import numpy as np
import pytest
import torch

from directload.codecs import CodecError, CodecValueError, codec, encode
from directload.files import CorruptFileError
from directload.stores import (
    DecodingStore,
    DiskStore,
    HostCache,
    StoreSpec,
    TensorStore,
    open_store,
    read_layout,
    renumber,
    verify,
    write_disk_store,
)
from directload.stores.disk_format import CODEC_VERSION, VERSION, sidecar_crc
from directload.stores.generations import sidecar_path

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def table():
    return torch.from_numpy(np.random.default_rng(3).standard_normal((500, 100)).astype(np.float32))


@pytest.fixture
def coded(tmp_path, table):
    return write_disk_store(table, tmp_path / "codes.npy", codec="int8", progress=False)


def edit_sidecar(path, change, *, forge=True):
    side = sidecar_path(read_layout(path).path)
    meta = json.loads(side.read_text())
    change(meta)
    if forge:
        meta["sidecar_crc32c"] = sidecar_crc(meta)
    side.write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["int8", "float16", "bfloat16"])
def test_a_store_of_codes_is_version_3_and_names_its_codec(tmp_path, table, name):
    path = write_disk_store(table, tmp_path / "f.npy", codec=name, progress=False)
    layout = read_layout(path)
    chosen = codec(name)
    assert (layout.sidecar["version"], layout.codec, layout.dtype) == (CODEC_VERSION, name, chosen.code_dtype)
    assert layout.shape == chosen.code_shape(500, 100) and layout.row_nbytes == chosen.row_bytes(100)
    assert verify(path, progress=False)["bad_chunks"] == []
    with DiskStore(path) as store:
        assert store.codec == name
        ids = torch.tensor([499, 0, 7, 7])
        assert torch.equal(store.read(ids), chosen.encode(table[ids]))


def test_a_plain_store_stays_version_2_with_no_codec(tmp_path, table):
    layout = read_layout(write_disk_store(table, tmp_path / "f.npy", progress=False))
    assert (layout.sidecar["version"], layout.codec, "codec" in layout.sidecar) == (VERSION, None, False)


def test_the_codec_field_is_checksummed(coded):
    edit_sidecar(coded, lambda m: m.update(codec="float16"), forge=False)
    with pytest.raises(CorruptFileError, match="checksum"):
        read_layout(coded)


def test_an_unknown_codec_is_refused_with_a_codec_error(coded):
    edit_sidecar(coded, lambda m: m.update(codec="int4"))  # a newer directload's store, checksum whole
    with pytest.raises(CodecError, match="'int4' codes, which this directload cannot decode"):
        DiskStore(coded)


@pytest.mark.parametrize("change, match", [
    (lambda m: m.update(codec="float16"), "codes are 2-D rows of torch.float16"),  # uint8 codes named float16
    (lambda m: m.update(codec=7), "not a codec's name"),
    (lambda m: m.update(version=2), "field 'codec' in a version 2 sidecar"),
    (lambda m: m.pop("codec"), "not a codec's name"),
])
def test_a_sidecar_whose_codec_disagrees_with_the_file_is_corrupt(coded, change, match):
    edit_sidecar(coded, change)
    with pytest.raises(CorruptFileError, match=match):
        read_layout(coded)


def test_writing_codes_refuses_what_a_codec_cannot_take_and_leaves_nothing(tmp_path, table):
    with pytest.raises(CodecError, match="no codec"):
        write_disk_store(table, tmp_path / "a.npy", codec="zstd", progress=False)
    with pytest.raises(CodecError, match="2-D table of floats"):
        write_disk_store(torch.zeros(4, 3, dtype=torch.int32), tmp_path / "b.npy", codec="int8", progress=False)
    bad = table.clone()
    bad[321, 5] = float("inf")
    with pytest.raises(CodecValueError, match="row 321 holds \\+infinity"):
        write_disk_store(bad, tmp_path / "c.npy", codec="int8", progress=False, chunk_bytes=4096)
    coded = write_disk_store(table, tmp_path / "d.npy", codec="int8", progress=False)
    with pytest.raises(CodecError, match="holds int8 codes already"):
        write_disk_store(coded, tmp_path / "e.npy", codec="int8", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npy", "d.npy.g1", "d.npy.g1.dlstore.json"]


def test_a_packed_store_of_codes_reads_by_the_old_ids(tmp_path, table):
    order = np.random.default_rng(0).permutation(500)
    path = write_disk_store(table, tmp_path / "p.npy", codec="int8", order=order, progress=False)
    ids = torch.tensor([3, 499, 0])
    with DiskStore(path) as store:
        assert store.id_map is not None and torch.equal(store.read(ids), codec("int8").encode(table[ids]))


def test_a_cache_of_codes_holds_the_rows_of_their_bytes(table):
    """The same bytes hold 3.7x the rows at 100 features in int8 (108 B against 400 B a row)."""
    budget = 40_000
    plain = HostCache(TensorStore(table), budget)
    small = HostCache(TensorStore(encode(table, "int8").codes), budget)
    assert (plain.stats()["host"]["capacity_rows"], small.stats()["host"]["capacity_rows"]) == (100, 370)
    store = DecodingStore(small, "int8")
    ids = torch.arange(0, 500, 3)
    assert torch.equal(store.read(ids), codec("int8").decode(codec("int8").encode(table[ids])))
    assert store.encoded_row_nbytes == 108 and store.row_nbytes == 400


def test_a_decoding_store_refuses_rows_that_are_not_its_codes(table):
    with pytest.raises(CodecError, match="does not hold int8 codes"):
        DecodingStore(TensorStore(table), "int8")
    with pytest.raises(CodecError, match="float64"):
        DecodingStore(TensorStore(encode(table, "int8").codes), "int8", dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_decoding_store_reads_in_the_dtype_asked(table, dtype):
    store = DecodingStore(TensorStore(encode(table, "int8").codes), "int8", dtype=dtype)
    got = store.read([4, 2])
    assert got.dtype == dtype and torch.equal(got, codec("int8").decode(codec("int8").encode(table[[4, 2]]), dtype))


def test_a_spec_reads_the_codec_from_the_store_and_refuses_another(coded, tmp_path, table):
    with open_store(StoreSpec(str(coded), host_bytes=10_000)) as store:
        assert store.dtype == torch.float32 and store.shape == (500, 100)
        assert torch.equal(store.read([9]), codec("int8").decode(codec("int8").encode(table[[9]])))
    with pytest.raises(CodecError, match="holds int8 codes, not float16"):
        open_store(StoreSpec(str(coded), codec="float16"))
    plain = write_disk_store(table, tmp_path / "plain.npy", progress=False)
    with pytest.raises(CodecError, match="holds plain rows"):
        open_store(StoreSpec(str(plain), codec="int8"))
    with pytest.raises(CodecError, match="codec must be one of"):
        StoreSpec(table, codec="int4").check()


def test_a_spec_with_a_codec_is_data(coded):
    spec = StoreSpec(str(coded), codec="int8", host_bytes="1M")
    assert StoreSpec.from_dict(spec.to_dict()).codec == "int8"


def test_a_spec_over_a_store_of_codes_decodes_it_and_leaves_it_open(coded, table):
    disk = DiskStore(coded)
    with open_store(StoreSpec(disk, tiers=False)) as store:
        assert torch.equal(store.read([1]), codec("int8").decode(codec("int8").encode(table[[1]])))
    assert not disk.closed
    disk.close()


@pytest.mark.parametrize("source", ["disk", "tensor"])
@pytest.mark.parametrize("tiers", [False, True])
def test_a_spec_that_does_not_decode_reads_the_code_rows_themselves(coded, table, source, tiers):
    # what a server sends on and a partitioned store decodes above itself: code rows, through every tier
    spec = StoreSpec(str(coded) if source == "disk" else table, codec="int8", decode=False, tiers=tiers,
                     host_bytes=10_800 if tiers else 0)  # 100 code rows of 108 bytes
    want = encode(table[[7, 3]], "int8").codes
    with open_store(spec) as store:
        assert store.dtype == torch.uint8 and store.shape == (500, 108)
        assert torch.equal(store.read([7, 3]), want)
    assert StoreSpec.from_dict(spec.to_dict() if source == "disk" else {"decode": False}).decode is False
    with pytest.raises(TypeError, match="decode must be True or False"):
        StoreSpec(table, codec="int8", decode="no").check()


@pytest.mark.parametrize("name", ["int8", "bfloat16"])
def test_a_store_of_codes_renumbered_stays_a_store_of_the_same_codes(tmp_path, table, name):
    # before: the copy was written as plain rows of uint8, and a spec over it read codes as features
    src = write_disk_store(table, tmp_path / "codes.npy", codec=name, progress=False)
    counts = np.random.default_rng(1).integers(0, 50, 500)
    packed = renumber(src, tmp_path / "packed.npy", counts, progress=False)
    assert read_layout(packed).codec == name and read_layout(packed).packed
    ids = torch.tensor([0, 499, 17, 17])
    with DiskStore(src) as a, DiskStore(packed) as b:
        assert b.codec == name and torch.equal(a.read(ids), b.read(ids))
    with open_store(StoreSpec(str(packed), host_bytes=20_000)) as store:  # decoded, as the store it came from
        want = codec(name).decode(codec(name).encode(table[ids]))
        assert store.dtype == torch.float32 and torch.equal(store.read(ids), want)
