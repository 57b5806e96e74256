"""The codecs (directload.codecs): each one's layout, its round trip within its documented error bound across row
widths, constant rows and extreme values, its refusals (NaN, infinities, float16's range) as typed errors before
anything is written, and the streaming encode: chunk by chunk from a memmap, never two full copies."""

import math
import tracemalloc

import numpy as np
import pytest
import torch

from directload.codecs import CODECS, INT8_TAIL, Codec, CodecError, CodecValueError, codec
from directload.errors import DirectloadError

WIDTHS = (1, 2, 7, 100, 513)


def _table(rows, dim, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * scale
    if rows > 3:
        x[1] = 3.25  # a constant row: int8's zero scale
        x[2, : max(1, dim // 2)] = -1e-30  # tiny values beside large ones
    return x


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("dim", WIDTHS)
def test_the_round_trip_is_within_the_documented_bound(name, dim):
    c = codec(name)
    x = _table(64, dim, seed=dim)
    codes = c.encode(x)
    assert codes.dtype == c.code_dtype and tuple(codes.shape) == c.code_shape(64, dim)
    assert codes.element_size() * codes.shape[1] == c.row_bytes(dim)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        decoded = c.decode(codes, dtype)
        assert decoded.dtype == dtype and tuple(decoded.shape) == (64, dim)
    err = (c.decode(codes) - x).abs()
    bound = c.error_bound(x)
    assert bound.shape == (64,) and bool((err <= bound[:, None]).all()), (err.amax(1) / bound).max()
    if name == "int8" and dim > 1:
        assert torch.equal(c.decode(codes)[1], x[1])  # a constant row decodes exactly


def test_int8_rows_hold_their_codes_then_scale_and_offset_as_fbgemms_fused_rowwise_rows():
    x = torch.tensor([[-1.0, 0.0, 1.0, 3.0]])
    codes = codec("int8").encode(x)
    assert tuple(codes.shape) == (1, 4 + INT8_TAIL) and codec("int8").row_bytes(100) == 108
    scale, offset = codes[0, 4:].view(torch.float32).tolist()
    assert offset == -1.0 and scale == pytest.approx(4.0 / 255)
    assert codes[0, :4].tolist() == [0, round(1 / scale), round(2 / scale), 255]
    assert codec("float16").row_bytes(100) == 200 and codec("bfloat16").row_bytes(100) == 200


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("bad,what", [(float("nan"), "NaN"), (float("inf"), r"\+infinity"),
                                      (float("-inf"), "-infinity")])
def test_values_that_are_not_finite_are_refused_naming_the_row(name, bad, what):
    x = torch.zeros(10, 4)
    x[7, 2] = bad
    with pytest.raises(CodecValueError, match=rf"row 7 holds {what}, which {name} cannot encode") as info:
        codec(name).encode(x, chunk_rows=3)
    assert isinstance(info.value, DirectloadError) and isinstance(info.value, ValueError)


def test_float16_refuses_values_beyond_its_range_and_bfloat16_takes_them():
    x = torch.ones(5, 3)
    x[4, 1] = 1e6
    with pytest.raises(CodecValueError, match="row 4 holds 1e\\+06, beyond float16's range"):
        codec("float16").encode(x)
    back = codec("bfloat16").decode(codec("bfloat16").encode(x))
    assert abs(back[4, 1].item() - 1e6) <= 1e6 * 2**-8


def test_tables_and_codecs_that_do_not_fit_are_typed_errors_before_any_work():
    with pytest.raises(CodecError, match="no codec 'int4'"):
        codec("int4")
    with pytest.raises(CodecError, match="2-D table of floats"):
        codec("int8").encode(torch.zeros(3, dtype=torch.float32))
    with pytest.raises(CodecError, match="2-D table of floats"):
        codec("float16").encode(torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(CodecError, match="2-D float tensor or array"):
        codec("float16").encode([[1.0]])
    with pytest.raises(CodecError, match="out must be a torch.uint8 tensor of shape"):
        codec("int8").encode(torch.zeros(3, 2), out=torch.empty(3, 2, dtype=torch.uint8))
    with pytest.raises(CodecError, match="decodes to float32, float16 or bfloat16"):
        codec("int8").decode(torch.zeros(1, 9, dtype=torch.uint8), torch.float64)
    with pytest.raises(CodecError, match="codes are a 2-D torch.float16 table"):
        codec("float16").decode(torch.zeros(2, 2))
    with pytest.raises(CodecError, match="too short"):
        codec("int8").decode(torch.zeros(1, 3, dtype=torch.uint8))
    assert codec(CODECS["int8"]) is CODECS["int8"] and isinstance(CODECS["int8"], Codec)


@pytest.mark.parametrize("name", list(CODECS))
def test_an_encode_in_chunks_equals_one_in_one_go_and_fills_the_callers_out(name):
    c = codec(name)
    x = _table(1000, 37, seed=5)
    whole = c.encode(x, chunk_rows=10**6)
    out = torch.full(c.code_shape(1000, 37), 7, dtype=c.code_dtype)
    assert c.encode(x.numpy(), out=out, chunk_rows=97) is out
    assert torch.equal(out.view(torch.uint8), whole.view(torch.uint8))
    assert tuple(c.encode(torch.zeros(0, 5)).shape) == c.code_shape(0, 5)
    assert tuple(c.encode(torch.zeros(3, 0)).shape) == c.code_shape(3, 0)


def test_a_large_table_streams_from_disk_and_is_never_held_twice(tmp_path):
    rows, dim, chunk = 1 << 16, 256, 1 << 12  # 64 MiB of float32 in a memmap, 16.5 MiB of int8 codes
    src = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
    for start in range(0, rows, chunk):
        src[start:start + chunk] = np.random.default_rng(start).standard_normal((chunk, dim), np.float32)
    src.flush()
    table = np.load(tmp_path / "x.npy", mmap_mode="r")
    c = codec("int8")
    out = torch.empty(c.code_shape(rows, dim), dtype=torch.uint8)
    tracemalloc.start()
    c.encode(table, out=out, chunk_rows=chunk)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * chunk * dim * 4  # a few chunks' worth, far below the table's 64 MiB
    probe = np.asarray(table[12345:12347])
    err = (c.decode(out[12345:12347]) - torch.from_numpy(probe)).abs()
    assert bool((err <= c.error_bound(probe)[:, None]).all())


def test_the_error_bounds_are_the_documented_ones():
    x = torch.tensor([[1.0, -2.0, 4.0], [0.0, 0.0, 0.0]])
    assert codec("float16").error_bound(x).tolist() == [4 * 2**-11, 2**-25]
    assert codec("bfloat16").error_bound(x).tolist() == [4 * 2**-8, 2**-134]
    int8 = codec("int8").error_bound(x)
    assert int8[0].item() == pytest.approx(6 / 255 / 2 + 4 * 6 * 2**-23, rel=1e-5)  # plus the decode's rounding
    assert int8[1].item() == 0.0
    assert math.isclose(codec("int8").row_bytes(100) / 400, 0.27)
