"""The decoding gather (``gather`` over an EncodedTable): every path against the reference decode, into poisoned
outputs, bit for bit: the CPU kernel on torch's team, torch's path, and gather.cu's ``gather_decode`` built for the
host (its accesses checked).  The Numba CUDA kernel has its own test in tests/cudasim."""

import numpy as np
import pytest
import torch
from numba import njit

from directload.codecs import CodecError, EncodedTable, codec, encode
from directload.kernels import decode, gather, gather_async, host_emu
from directload.kernels.decode_cpu import float_to_bfloat, float_to_half
from directload.kernels.loads import KernelLoads

CODECS = ("int8", "float16", "bfloat16")
OUTS = (torch.float32, torch.float16, torch.bfloat16)
DIMS = (0, 1, 3, 4, 5, 63, 64, 100, 129)
CLEAN = host_emu.AccessCounts(0, 0, 0)


@pytest.fixture(scope="module", autouse=True)
def _kernels_loaded():
    decode.prepare_decode(dtypes=OUTS, background=False)


def _bits(t):
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _table(rng, rows, dim, name):
    x = torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32)) * 4 + 1
    if rows > 3 and dim:
        x[3] = 2.5  # a constant row: zero scale in int8
        x[1, 0] = 1e-6  # a small value beside large ones
    return encode(x, name)


def _poisoned(n, dim, dtype):
    return torch.full((n, dim), float("nan"), dtype=dtype)


def _expect(table, ids, dtype):
    return table.codec.decode(table.codes[ids.long()], dtype)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", OUTS, ids=str)
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dim", DIMS)
def test_the_cpu_kernel_matches_the_reference_decode(dim, name, dtype, index_dtype, rng):
    table = _table(rng, 80, dim, name)
    ids = torch.from_numpy(rng.integers(0, 80, 150)).to(index_dtype)
    out = _poisoned(150, dim, dtype)
    assert decode.decode_ready(name, dtype, ids.element_size())
    assert gather(table, ids, out=out) is out
    assert torch.equal(_bits(out), _bits(_expect(table, ids, dtype)))


@pytest.mark.parametrize("name", CODECS)
def test_a_big_gather_runs_on_the_team_and_matches(name, rng):
    """Outputs of 256 KiB and more run on several threads: their shares meet exactly."""
    table = _table(rng, 5000, 100, name)
    ids = torch.from_numpy(rng.integers(0, 5000, 4001))
    got = gather(table, ids)
    assert got.dtype == torch.float32 and got.device.type == "cpu"
    assert torch.equal(got, _expect(table, ids, torch.float32))


@pytest.mark.parametrize("dtype", OUTS, ids=str)
@pytest.mark.parametrize("name", CODECS)
def test_torchs_path_matches_the_kernel(name, dtype, rng):
    table = _table(rng, 60, 37, name)
    ids = torch.from_numpy(rng.integers(0, 60, 90))
    kernel, torch_path = gather(table, ids, out=_poisoned(90, 37, dtype)), _poisoned(90, 37, dtype)
    assert decode.torch_path(table, ids, torch_path) == -1
    assert torch.equal(_bits(kernel), _bits(torch_path))


def test_every_half_decodes_as_torch_converts_it():
    """All 65536 float16 bit patterns (subnormals, infinities, NaN payloads) to float32 and to bfloat16, and all
    bfloat16 patterns to float16 (overflow, underflow, subnormal rounding): torch's conversions, bit for bit."""
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).reshape(-1, 1)
    ids = torch.arange(65536)
    halves = EncodedTable(every.view(torch.float16).contiguous(), "float16")
    got, want = gather(halves, ids), every.view(torch.float16).float()
    nan = want.isnan()
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan]) and bool(got[nan].isnan().all())
    got = gather(halves, ids, out=_poisoned(65536, 1, torch.bfloat16))
    want = every.view(torch.float16).to(torch.bfloat16)
    nan = want.isnan()
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan]) and bool(got[nan].isnan().all())
    brains = EncodedTable(every.view(torch.bfloat16).contiguous(), "bfloat16")
    got = gather(brains, ids, out=_poisoned(65536, 1, torch.float16))
    want = every.view(torch.bfloat16).to(torch.float16)
    nan = want.isnan()
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan]) and bool(got[nan].isnan().all())


@njit
def _round_all(x, half, brain):
    for i in range(x.shape[0]):
        half[i] = float_to_half(x[i])
        brain[i] = float_to_bfloat(x[i])


def test_float_rounding_matches_torch_on_random_bit_patterns(rng):
    """float32 to float16 and bfloat16 over random bits, exact ties and the edges of float16's range."""
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([65504.0, 65519.99, 65520.0, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-14, 1 + 2.0**-11,
                      1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 0.0, -0.0, np.inf, -np.inf], np.float32)
    x = np.concatenate([bits.view(np.float32), edges, -edges])
    half, brain = np.empty(x.shape, np.uint16), np.empty(x.shape, np.uint16)
    _round_all(x, half, brain)
    t = torch.from_numpy(x)
    for got, dtype in ((half, torch.float16), (brain, torch.bfloat16)):
        want = t.to(dtype)
        nan = want.isnan().numpy()
        assert np.array_equal(got[~nan], want.view(torch.int16).numpy().view(np.uint16)[~nan])
        assert bool(torch.from_numpy(got[nan].view(np.int16)).view(dtype).isnan().all())


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", OUTS, ids=str)
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dim", DIMS)
def test_the_cuda_c_kernel_matches_the_reference_decode(dim, name, dtype, index_dtype, rng):
    """gather.cu's gather_decode on the host: every code and output access aligned for its width and inside its
    buffer (odd dims take the element-by-element loads and stores), every result the reference decode's."""
    table = _table(rng, 70, dim, name)
    ids = rng.integers(0, 70, 97).astype(index_dtype)
    out = _poisoned(97, dim, dtype)
    host_emu.reset_counters()
    host_emu.launch_decode(_np_bits(table.codes), ids, _np_bits(out), codec=f"{name}->{str(dtype)[6:]}", grid=3,
                           block=64)
    assert host_emu.counters() == CLEAN
    assert torch.equal(_bits(out), _bits(_expect(table, torch.from_numpy(ids), dtype)))


def _np_bits(t):
    return t.numpy() if t.dtype in (torch.uint8, torch.float32) else t.view(torch.int16).numpy()


def test_the_cuda_c_kernel_flags_and_clamps_a_bad_id(rng):
    table = _table(rng, 10, 8, "int8")
    out, err = _poisoned(3, 8, torch.float32), np.zeros(1, np.uint64)
    host_emu.launch_decode(table.codes.numpy(), np.array([2, 10, -1]), out.numpy(), codec="int8", grid=1, err=err,
                           stamp=9)
    assert int(err[0]) == 9
    assert torch.equal(out, table.decode()[[2, 9, 0]])


@pytest.mark.parametrize("name", CODECS)
def test_a_bad_id_raises_and_writes_nothing(name, rng):
    table = _table(rng, 20, 6, name)
    out = _poisoned(3, 6, torch.float32)
    with pytest.raises(IndexError, match="20 is out of range"):
        gather(table, torch.tensor([0, 20, 1]), out=out)
    assert bool(out.isnan().all())
    with pytest.raises(IndexError, match="-1"):
        gather(table, torch.tensor([-1]))


def test_bad_arguments_are_refused_before_any_work(rng):
    table = _table(rng, 20, 6, "int8")
    ids = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        gather(table, ids, out=torch.empty(2, 6, dtype=torch.float64))
    with pytest.raises(TypeError):
        gather(table, ids, out=torch.empty(2, 6, dtype=torch.float16).view(torch.int16))
    with pytest.raises(ValueError, match="shape"):
        gather(table, ids, out=torch.empty(2, 7))
    with pytest.raises(ValueError, match="variant"):
        gather(table, ids, variant="rowvec16x8")
    with pytest.raises(TypeError):
        gather(table, torch.tensor([1.0]))
    with pytest.raises(TypeError, match="dtype"):
        decode.gather_encoded(table, ids, out=torch.empty(2, 6), dtype=torch.float16)
    with pytest.raises(CodecError, match="float64"):
        decode.gather_encoded(table, ids, dtype=torch.float64)


def test_an_encoded_table_checks_its_codes():
    with pytest.raises(CodecError, match="2-D torch.uint8"):
        EncodedTable(torch.zeros(4, 10), "int8")
    with pytest.raises(CodecError, match="too short"):
        EncodedTable(torch.zeros(4, 7, dtype=torch.uint8), "int8")
    with pytest.raises(CodecError, match="contiguous"):
        EncodedTable(torch.zeros(10, 4, dtype=torch.float16).t(), "float16")
    with pytest.raises(CodecError, match="no codec"):
        EncodedTable(torch.zeros(4, 10, dtype=torch.uint8), "int4")
    table = EncodedTable(codec("int8").encode(torch.ones(3, 4)), "int8")
    assert (table.shape, table.row_bytes, table.nbytes, len(table)) == ((3, 4), 12, 36, 3)


def test_empty_gathers_and_rows_of_no_features(rng):
    table = _table(rng, 5, 0, "int8")
    assert gather(table, torch.tensor([4, 0])).shape == (2, 0)
    with pytest.raises(IndexError):
        gather(table, torch.tensor([5]))
    assert gather(_table(rng, 5, 3, "float16"), torch.tensor([], dtype=torch.int64)).shape == (0, 3)


def test_a_background_gather_decodes_on_the_worker(rng):
    table = _table(rng, 40, 9, "bfloat16")
    ids = torch.from_numpy(rng.integers(0, 40, 30))
    assert torch.equal(gather_async(table, ids, background=True).wait(), _expect(table, ids, torch.float32))


@pytest.mark.parametrize("dim", [1, 2, 3, 5])
def test_one_row_of_an_odd_width_decodes_on_every_path(dim, rng):
    """A one-row slice of int8 codes is contiguous at an offset float32 cannot view: the reference decode and
    torch's path used to raise there (a RuntimeError from ``view``)."""
    table = _table(rng, 4, dim, "int8")
    ids = torch.tensor([2])
    want = table.codec.decode(table.codes[2:3])
    assert torch.equal(want, table.codec.decode(table.codes)[2:3])
    out = _poisoned(1, dim, torch.float32)
    assert decode.torch_path(table, ids, out) == -1 and torch.equal(out, want)
    assert torch.equal(gather(table, ids), want)


def test_the_portable_half_conversions_match_torch():
    """kernels/half_bits.py as the simulator runs it (NumPy's bit casts): every float16 to float32, and float32 to
    float16 and bfloat16 over random bits and the edges of float16's range, bit for bit with torch (NaN as NaN)."""
    from directload.kernels import half_bits

    halves = np.arange(65536, dtype=np.uint16)
    got = np.array([half_bits.half_to_float(h) for h in halves], np.float32)
    want = torch.from_numpy(halves.view(np.int16)).view(torch.float16).float().numpy()
    nan = np.isnan(want)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan]) and np.isnan(got[nan]).all()
    bits = np.random.default_rng(5).integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([65504.0, 65519.99, 65520.0, 2.0**-24, 2.0**-25, 2.0**-14, 1 + 2.0**-11, 1 + 3 * 2.0**-11,
                      1 + 2.0**-8, 1 + 3 * 2.0**-8, 0.0, -0.0, np.inf, -np.inf, 6e-8, 3e-5], np.float32)
    x = np.concatenate([bits.view(np.float32), edges, -edges])
    for convert, dtype in ((half_bits.float_to_half, torch.float16), (half_bits.float_to_bfloat, torch.bfloat16)):
        got = np.array([convert(v) for v in x], np.uint16)
        want = torch.from_numpy(x).to(dtype)
        nan = want.isnan().numpy()
        assert np.array_equal(got[~nan], want.view(torch.int16).numpy().view(np.uint16)[~nan]), dtype
        assert bool(torch.from_numpy(got[nan].view(np.int16)).view(dtype).isnan().all())


def test_torchs_path_starts_the_kernel_load_after_about_a_second(monkeypatch, rng):
    """Torch's path decodes at 0.08-0.83x the kernel's rows/s, so the load starts after LOAD_AFTER_S (1 s) of it,
    not after the plain gather's 5 s (a 3-epoch run gathered int8 rows 5.6x slower than float32 rows waiting)."""
    calls = []
    loads = KernelLoads(lambda key: None, name="test-decode-load")  # this process as if it had loaded none
    monkeypatch.setattr(loads, "prepare", lambda keys, **kw: calls.append(list(keys)))
    monkeypatch.setattr(decode, "LOADS", loads)
    table = _table(rng, 50, 8, "int8")
    assert torch.equal(gather(table, torch.tensor([1])), _expect(table, torch.tensor([1]), torch.float32))
    assert calls == [] and 0 < loads.fallback_s < 1.0  # a moment of torch's path: no load yet
    loads.fallback_s = 1.0  # as after a second of it
    gather(table, torch.tensor([1]))
    assert decode.LOAD_AFTER_S <= 1.0 and calls == [[("int8", "float32", 8)]]
