"""sample.cu's kernels, built for the host with g++ and run under sampling_gpu's drivers, against the CPU twin."""

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from directload.capabilities import find_libnvrtc
from directload.kernels import host_emu, nvrtc, sampling_gpu
from directload.kernels import host_emu_sample as emu
from directload.kernels import sampling as cpu
from directload.kernels.sources import CUDA_DIR

#: In-degrees around every branch of the picks: none, one, two, the 64-bit set up to SMALL_MAX, Floyd's range past
#: it and a reservoir past FLOYD_MAX.
DEGREES = (0, 1, 2, 3, 7, 8, 64, 65, 100, 150)
#: Fanouts: all, none, one, below, at and above most degrees, over half of SMALL_MAX (the set's complement), and
#: above FLOYD_MAX below the largest.
FANOUTS = (-1, 0, 1, 2, 7, 8, 40, 65, 70, 200)
INDEX = {"int32": np.int32, "int64": np.int64}
no_nvrtc = pytest.mark.skipif(find_libnvrtc() is None, reason="libnvrtc not found (the cuda12/cuda13 extras)")


def _graph(rng, degrees, num_nodes, indptr_dtype=np.int64, index_dtype=np.int64, parallel=True):
    """A CSC of the given in-degrees over ``num_nodes`` nodes; with ``parallel``, neighbours repeat (parallel
    edges) from a small pool."""
    indptr = np.zeros(len(degrees) + 1, np.int64)
    np.cumsum(degrees, out=indptr[1:])
    pool = min(num_nodes, 5) if parallel else num_nodes
    indices = rng.integers(0, pool, indptr[-1]) if parallel else rng.permutation(
        np.resize(np.arange(num_nodes), indptr[-1]))
    return indptr.astype(indptr_dtype), indices.astype(index_dtype)


def _weights(rng, n, dtype=np.float64):
    w = rng.random(n).astype(dtype)
    w[rng.random(n) < 0.3] = 0  # zero weights never enter a weighted pick
    return w


def _same(want, got):
    assert len(want) == len(got)
    for a, b in zip(want, got):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b)


def _same_batch(want, got):
    _same([want[0]], [got[0]])
    assert (want[2], want[3]) == (got[2], got[3])
    assert len(want[1]) == len(got[1])
    for hw, hg in zip(want[1], got[1]):
        _same(hw, hg)


@pytest.mark.parametrize("eids", [None, "int64", "int32"])
@pytest.mark.parametrize("weights", [None, "float64", "float32"])
@pytest.mark.parametrize("replace", [False, True], ids=["distinct", "replace"])
@pytest.mark.parametrize("types", [("int64", "int64"), ("int32", "int32"), ("int64", "int32")],
                         ids=lambda t: f"indptr_{t[0]}-indices_{t[1]}")
@pytest.mark.one_lane("pyg")  # the g++ build of sample.cu against its Numba twin: no torch or numpy version changes it
def test_hop_matches_the_cpu_twin(types, replace, weights, eids, rng):
    """Every fanout over every in-degree, parallel edges included: the same neighbours, edge ids and offsets."""
    degrees = np.array(DEGREES * 2)
    indptr, indices = _graph(rng, degrees, len(degrees), INDEX[types[0]], INDEX[types[1]])
    e = None if eids is None else rng.permutation(indices.shape[0]).astype(eids)
    w = None if weights is None else _weights(rng, indices.shape[0], weights)
    frontier = rng.permutation(len(degrees))
    for fanout in FANOUTS:
        for key, hop in ((7, 0), (2**64 - 1, 3)):
            want = cpu.sample_hop(indptr, indices, e, w, frontier, fanout, replace, key, hop)
            got = emu.sample_hop(indptr, indices, e, w, frontier, fanout, replace, key, hop)
            _same(want, got)


#: Weights at the ends of each type's range (the least subnormal, the least normal, tiny, huge, the largest) and
#: ordinary ones.
EXTREME_WEIGHTS = {
    np.float64: [5e-324, 1e-323, 2.2250738585072014e-308, 1e-300, 0.5, 1.0, 3.4028234663852886e38, 1e308,
                 1.7976931348623157e308],
    np.float32: [1e-45, 1.1754944e-38, 1e-30, 0.5, 1.0, 3.4028235e38],
}


@pytest.mark.parametrize("replace", [False, True], ids=["distinct", "replace"])
@pytest.mark.parametrize("dtype", EXTREME_WEIGHTS, ids=lambda t: t.__name__)
def test_extreme_weights_match_the_cpu_twin(dtype, replace, rng):
    """Subnormal, huge and mixed weights, and nodes of one extreme weight throughout: the same picks (the log
    keys and the power-of-two scaling round alike on both)."""
    degrees = np.array(DEGREES * 3)
    indptr, indices = _graph(rng, degrees, len(degrees))
    values = np.array([*EXTREME_WEIGHTS[dtype], 0.0], dtype)
    w = rng.choice(values, indices.shape[0])
    for v in range(0, len(degrees), 3):  # every third node: all its weights equal, each extreme in turn
        w[indptr[v]:indptr[v + 1]] = values[v // 3 % (len(values) - 1)]
    frontier = rng.permutation(len(degrees))
    for fanout in FANOUTS:
        for key, hop in ((7, 0), (2**64 - 1, 3)):
            want = cpu.sample_hop(indptr, indices, None, w, frontier, fanout, replace, key, hop)
            _same(want, emu.sample_hop(indptr, indices, None, w, frontier, fanout, replace, key, hop))


def test_hop_of_an_empty_frontier(rng):
    indptr, indices = _graph(rng, [3, 0, 2], 3)
    frontier = np.empty(0, np.int64)
    got = emu.sample_hop(indptr, indices, None, None, frontier, 2, False, 1, 0)
    _same(cpu.sample_hop(indptr, indices, None, None, frontier, 2, False, 1, 0), got)
    assert got[2].tolist() == [0]


def test_hop_with_an_int32_frontier_and_all_zero_weights(rng):
    indptr, indices = _graph(rng, [4, 5], 2)
    w = np.zeros(indices.shape[0])
    for replace in (False, True):
        got = emu.sample_hop(indptr, indices, None, w, np.array([1, 0], np.int32), 3, replace, 9, 1)
        _same(cpu.sample_hop(indptr, indices, None, w, np.array([1, 0], np.int64), 3, replace, 9, 1), got)
        assert got[2].tolist() == [0, 0, 0]


@pytest.mark.parametrize("layout", ["pyg", "dgl"])
@pytest.mark.parametrize("fanouts", [[2, 3], [1, 1, 1], [70, 2], [-1, 2], [0, 3], [3, -1, 0], []])
@pytest.mark.parametrize("replace", [False, True], ids=["distinct", "replace"])
@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
def test_batch_matches_the_cpu_twin(weighted, replace, fanouts, layout, rng):
    """The same nodes in the same first-seen order, the same edges per hop, the same counts; marks left zero."""
    n = 300
    degrees = rng.choice(DEGREES, n)
    indptr, indices = _graph(rng, degrees, n, parallel=False)
    eids = rng.permutation(indices.shape[0]).astype(np.int64)
    w = _weights(rng, indices.shape[0]) if weighted else None
    seeds = rng.choice(n, 17, replace=False)
    key = int(rng.integers(0, 2**63))
    marks_cpu, marks_emu = np.zeros(n, np.int64), np.zeros(n, np.int64)
    want = cpu.sample_batch(indptr, indices, eids, w, seeds, fanouts, replace, key, layout, marks_cpu)
    got = emu.sample_batch(indptr, indices, eids, w, seeds, fanouts, replace, key, layout, marks_emu)
    _same_batch(want, got)
    assert not marks_emu.any()


@pytest.mark.parametrize("grid, block", [(1, 32), (2, 64), (64, 32)])
def test_batch_does_not_depend_on_the_launch_shape(grid, block, rng):
    """Claims by atomicMin: the first-seen order holds whatever order the threads run in."""
    n = 200
    indptr, indices = _graph(rng, rng.choice(DEGREES, n), n, parallel=False)
    seeds = rng.choice(n, 9, replace=False).astype(np.int32)
    want = cpu.sample_batch(indptr, indices, None, None, seeds, [5, 4], False, 3, "dgl", np.zeros(n, np.int64))
    got = emu.sample_batch(indptr, indices, None, None, seeds, [5, 4], False, 3, "dgl", np.zeros(n, np.int64),
                           launcher=emu.Launcher(grid, block))
    _same_batch(want, got)


@pytest.mark.parametrize("layout", ["pyg", "dgl"])
def test_batch_of_repeated_seeds_and_no_seeds(layout, rng):
    """A repeated seed keeps its place and is marked at its first (kernels.sampling.place_seeds)."""
    indptr, indices = _graph(rng, [2, 3, 1, 0, 4], 5)
    for seeds in (np.array([2, 2, 0, 2, 1]), np.array([4, 4]), np.empty(0, np.int64)):
        marks = np.zeros(5, np.int64)
        want = cpu.sample_batch(indptr, indices, None, None, seeds, [2, 3], False, 5, layout, np.zeros(5, np.int64))
        got = emu.sample_batch(indptr, indices, None, None, seeds, [2, 3], False, 5, layout, marks)
        _same_batch(want, got)
        assert got[0][:seeds.shape[0]].tolist() == seeds.tolist() and not marks.any()


@pytest.mark.one_lane("pyg")  # as test_hop_matches_the_cpu_twin: the lanes share the work
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_batch_sweep(data):
    n = data.draw(st.integers(1, 40))
    degrees = data.draw(st.lists(st.integers(0, 80), min_size=n, max_size=n))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    indptr, indices = _graph(rng, degrees, n, INDEX[data.draw(st.sampled_from(list(INDEX)))],
                             INDEX[data.draw(st.sampled_from(list(INDEX)))], parallel=data.draw(st.booleans()))
    w = _weights(rng, indices.shape[0]) if data.draw(st.booleans()) else None
    seeds = rng.choice(n, data.draw(st.integers(0, n)), replace=data.draw(st.booleans()))
    fanouts = data.draw(st.lists(st.sampled_from(FANOUTS), max_size=3))
    replace, layout = data.draw(st.booleans()), data.draw(st.sampled_from(["pyg", "dgl"]))
    key = data.draw(st.integers(0, 2**64 - 1))
    marks = np.zeros(n, np.int64)
    want = cpu.sample_batch(indptr, indices, None, w, seeds, fanouts, replace, key, layout, np.zeros(n, np.int64))
    _same_batch(want, emu.sample_batch(indptr, indices, None, w, seeds, fanouts, replace, key, layout, marks))
    assert not marks.any()


def test_constants_match_the_spec():
    """sample.cu's literals are kernels.sampling's constants."""
    source = (CUDA_DIR / "sample.cu").read_text()
    assert int(re.search(r"#define DLS_FLOYD_MAX (\d+)", source).group(1)) == cpu.FLOYD_MAX
    assert int(re.search(r"#define DLS_SMALL_MAX (\d+)", source).group(1)) == cpu.SMALL_MAX
    assert int(re.search(r"#define DLS_GOLDEN (0x[0-9A-F]+)ull", source).group(1), 16) == cpu.GOLDEN


# ---- NVRTC: sample.cu compiles for real GPUs ----------------------------------------------------------------

@pytest.fixture(scope="module")
def ptx90():
    """Every specialisation compiled once for compute_90: ``{name expression: PTX of its entry}``."""
    res = nvrtc.compile_gather("compute_90", sampling_gpu.kernel_names(), sampling_gpu.NVRTC_OPTIONS,
                               source=sampling_gpu.SOURCE)
    ptx = res.image.decode()
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"\.entry\s+(\w+)\(", ptx)]
    bodies = {sym: ptx[a:b] for (a, sym), (b, _) in zip(starts, [*starts[1:], (len(ptx), None)])}
    return {name: bodies[sym] for name, sym in res.lowered.items()}


@no_nvrtc
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_nvrtc_ptx_has_every_specialisation(arch):
    res = nvrtc.compile_gather(arch, sampling_gpu.kernel_names(), sampling_gpu.NVRTC_OPTIONS,
                               source=sampling_gpu.SOURCE)
    ptx = res.image.decode()
    assert f".target sm_{arch[-2:]}" in ptx
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert len(res.lowered) == len(set(sampling_gpu.kernel_names())) == 31
    assert set(res.lowered.values()) <= entries


@no_nvrtc
def test_nvrtc_claims_with_a_64_bit_atomic_min(ptx90):
    for i in ("int", "long long"):
        assert re.search(r"atom\.global\.min\.s64", ptx90[f"relabel_claim<{i}>"])


@no_nvrtc
def test_nvrtc_cubin_is_an_elf():
    name = sampling_gpu.name_expression("sample_picks", (torch.int64, torch.int32, torch.int64, torch.float32))
    res = nvrtc.compile_gather("sm_90", [name, "relabel_rows<long long>"], sampling_gpu.NVRTC_OPTIONS,
                               source=sampling_gpu.SOURCE)
    assert res.image[:4] == b"\x7fELF"


def test_compile_of_another_source_needs_kernel_names():
    with pytest.raises(ValueError, match="name the kernels of sample.cu"):
        nvrtc.compile_gather("compute_90", source="sample.cu")


def _param_bytes(body):
    return [int(bits) // 8 for bits in re.findall(r"\.param\s+\.[usb](\d+)\s", body.split(")", 1)[0])]


@no_nvrtc
@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
def test_launch_arguments_have_the_kernels_parameter_sizes(ptx90, weighted, rng):
    """Every launch a batch makes passes numpy scalars whose sizes are its kernel's PTX parameters, one by one."""
    n = 50
    indptr, indices = _graph(rng, rng.choice(DEGREES, n), n, np.int32, np.int32)
    w = _weights(rng, indices.shape[0], np.float32) if weighted else None
    launcher = emu.Launcher()
    emu.sample_batch(indptr, indices, np.arange(indices.shape[0]), w, np.array([1, 2]), [3, -1], False, 1, "pyg",
                     np.zeros(n, np.int64), launcher=launcher)
    kernels = {name.split("<")[0] for name, _ in launcher.launched}
    assert kernels == {"sample_counts", "sample_picks", "relabel_claim", "place_seeds", "relabel_flag",
                       "relabel_append", "relabel_rows", "reset_marks"}
    for name, args in launcher.launched:
        assert all(isinstance(a, np.generic) for a in args), name
        assert [a.itemsize for a in args] == _param_bytes(ptx90[name]), name


# ---- the GPU entry points refuse what they cannot run, before touching a device ------------------------------

def test_gpu_entry_points_refuse_bad_arguments():
    g = torch.tensor([0, 1]), torch.tensor([0])
    seeds = torch.tensor([0])
    with pytest.raises(ValueError, match="layout must be one of"):
        sampling_gpu.sample_batch(*g, None, None, seeds, [1], False, 1, "csr", "cuda:0")
    with pytest.raises(ValueError, match="samples on a CUDA device, got cpu"):
        sampling_gpu.sample_batch(*g, None, None, seeds, [1], False, 1, "pyg", "cpu")
    with pytest.raises(ValueError, match="samples on a CUDA device"):
        sampling_gpu.sample_hop(*g, None, None, seeds, 1, False, 1, 0)
    with pytest.raises(TypeError, match="seeds must be a 1-d int32 or int64"):
        sampling_gpu.sample_batch(*g, None, None, seeds.double(), [1], False, 1, "pyg", "cuda:0")
    with pytest.raises(ValueError, match="seeds must be on cuda:0"):
        sampling_gpu.sample_batch(*g, None, None, seeds, [1], False, 1, "pyg", "cuda:0")


def test_guards_catch_a_buffer_sized_too_small(rng, monkeypatch):
    """The emulation's guards see a write past a buffer: here, edge buffers one short of the hop's edges."""
    indptr, indices = _graph(rng, [3, 3], 2)
    monkeypatch.setattr(sampling_gpu, "edge_bound", lambda *args: 5)
    with pytest.raises(host_emu.EmulationError, match="wrote past the end"):
        emu.sample_batch(indptr, indices, None, None, np.array([0, 1]), [3], False, 1, "pyg", np.zeros(2, np.int64))
