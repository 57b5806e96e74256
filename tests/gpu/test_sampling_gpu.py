"""The GPU sampler (kernels/cuda/sample.cu through CuPy) against its CPU twin, on a real device.

Skipped without a CUDA device and CuPy; benchmarks/gpu_suite.py runs them where one exists.
"""

import numpy as np
import pytest
import torch

from directload.capabilities import capabilities
from directload.kernels import sampling as cpu
from directload.kernels import sampling_gpu

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() and capabilities().cupy),
                                                   reason="needs a CUDA device and CuPy")]

DEGREES = (0, 1, 2, 3, 7, 8, 64, 65, 100, 150)
FANOUTS = (-1, 0, 1, 2, 7, 65, 70, 200)


def _graph(rng, n, index_dtype, weighted):
    degrees = rng.choice(DEGREES, n)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(degrees, out=indptr[1:])
    indices = rng.integers(0, n, indptr[-1]).astype(index_dtype)
    weights = None
    if weighted:
        weights = rng.random(indptr[-1])
        weights[rng.random(indptr[-1]) < 0.3] = 0
    return indptr.astype(index_dtype), indices, rng.permutation(indptr[-1]).astype(np.int64), weights


def _on(where, *arrays):
    """numpy arrays as CUDA tensors, or as pinned host tensors the kernels read through the mapping."""
    out = []
    for a in arrays:
        t = None if a is None else torch.from_numpy(a)
        out.append(None if t is None else (t.cuda() if where == "cuda" else t.pin_memory()))
    return out


def _agree(want, got, weighted):
    """Bit for bit; weighted picks may differ where CUDA's log differs from the CPU's in the last ulp."""
    want, got = np.asarray(want), got.cpu().numpy()
    if not weighted:
        np.testing.assert_array_equal(want, got)
        return
    assert want.shape == got.shape
    assert (want == got).mean() >= 0.99, (want == got).mean()


@pytest.mark.parametrize("where", ["cuda", "pinned"])
@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
@pytest.mark.parametrize("replace", [False, True], ids=["distinct", "replace"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_hop_matches_the_cpu_twin(index_dtype, replace, weighted, where, rng):
    indptr, indices, eids, weights = _graph(rng, 500, index_dtype, weighted)
    graph = _on(where, indptr, indices, eids, weights)
    frontier = rng.permutation(500)[:300]
    for fanout in FANOUTS:
        want = cpu.sample_hop(indptr, indices, eids, weights, frontier, fanout, replace, 11, 2)
        got = sampling_gpu.sample_hop(*graph, torch.from_numpy(frontier).cuda(), fanout, replace, 11, 2)
        assert all(t.is_cuda for t in got)
        np.testing.assert_array_equal(want[2], got[2].cpu().numpy())  # counts never depend on log
        for a, b in zip(want[:2], got[:2]):
            _agree(a, b, weighted)


@pytest.mark.parametrize("where", ["cuda", "pinned"])
@pytest.mark.parametrize("layout", ["pyg", "dgl"])
@pytest.mark.parametrize("fanouts", [[10, 5], [70, 3], [-1, 2], [3, 0, 2]])
@pytest.mark.parametrize("replace", [False, True], ids=["distinct", "replace"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_batch_matches_the_cpu_twin(index_dtype, replace, fanouts, layout, where, rng):
    n = 2000
    indptr, indices, eids, _ = _graph(rng, n, index_dtype, False)
    seeds = rng.choice(n, 64, replace=False)
    key = int(rng.integers(0, 2**63))
    want = cpu.sample_batch(indptr, indices, eids, None, seeds, fanouts, replace, key, layout, np.zeros(n, np.int64))
    device = torch.device("cuda", torch.cuda.current_device())
    for _ in range(2):  # the second batch finds the device's marks reset
        nodes, hops, nn, ne = sampling_gpu.sample_batch(*_on(where, indptr, indices, eids), None,
                                                        torch.from_numpy(seeds).cuda(), fanouts, replace, key,
                                                        layout, device)
        assert nodes.device == device and all(t.device == device for hop in hops for t in hop)
        np.testing.assert_array_equal(want[0], nodes.cpu().numpy())
        assert (want[2], want[3]) == (nn, ne)
        for hw, hg in zip(want[1], hops):
            for a, b in zip(hw, hg):
                np.testing.assert_array_equal(a, b.cpu().numpy())
    marks = sampling_gpu._MARKS.get(device, n)
    assert not bool(marks.any())


@pytest.mark.parametrize("fanouts, syncs", [([5, 5], 1), ([5, -1, 3], 2)])
def test_batch_syncs_once_plus_once_per_fanout_minus_one(fanouts, syncs, rng):
    """The host reads a batch makes, as torch's sync debug mode counts them: the sizes at the end, and the edge
    count of each fanout -1 hop."""
    import warnings

    n = 300
    indptr, indices, _, _ = _graph(rng, n, np.int64, False)
    graph = _on("cuda", indptr, indices)
    seeds = torch.arange(8, device="cuda")
    sampling_gpu.sample_batch(*graph, None, None, seeds, fanouts, False, 1, "pyg", "cuda")  # compiles, loads
    torch.cuda.synchronize()
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            sampling_gpu.sample_batch(*graph, None, None, seeds, fanouts, False, 1, "pyg", "cuda")
    finally:
        torch.cuda.set_sync_debug_mode(old)
    assert sum("synchroniz" in str(w.message) for w in seen) == syncs, [str(w.message) for w in seen]


def test_poisoned_buffers_are_all_written(rng):
    """run_batch over a launcher whose buffers start poisoned: the outputs still match the CPU twin."""
    class Poisoned(sampling_gpu.CupyLauncher):
        def empty(self, size, dtype, device):
            out = super().empty(size, dtype, device)
            out.view(torch.uint8).fill_(0xA5)
            return out

    n = 400
    indptr, indices, eids, weights = _graph(rng, n, np.int64, True)
    seeds = rng.choice(n, 20, replace=False)
    want = cpu.sample_batch(indptr, indices, eids, None, seeds, [4, -1], False, 3, "dgl", np.zeros(n, np.int64))
    launcher = Poisoned(torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
    marks = torch.zeros(n, dtype=torch.int64, device="cuda")
    nodes, hops, nn, ne = sampling_gpu.run_batch(launcher, *_on("cuda", indptr, indices, eids), None,
                                                 torch.from_numpy(seeds).cuda(), [4, -1], False, 3, "dgl", marks)
    np.testing.assert_array_equal(want[0], nodes.cpu().numpy())
    assert (want[2], want[3]) == (nn, ne)
    assert not bool(marks.any())


def test_pageable_host_graph_is_refused():
    with pytest.raises(ValueError, match="pageable host memory"):
        sampling_gpu.sample_batch(torch.tensor([0, 1]), torch.tensor([0]), None, None,
                                  torch.tensor([0], device="cuda"), [1], False, 1, "pyg", "cuda")
