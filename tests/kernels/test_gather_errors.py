"""Bad input raises a clear, typed error before any kernel runs, and touches no output."""

import numpy as np
import pytest
import torch

from directload.kernels import gather, gather_async, resolve_backend
from directload.kernels.api import check_devices


@pytest.fixture
def table():
    return torch.randn(10, 3)


@pytest.mark.parametrize("bad,match", [(10, "index 10 is out of range for 10 rows"),
                                       (99, "index 99 is out of range for 10 rows")])
def test_out_of_range_names_value_and_bound(table, bad, match):
    out = torch.full((2, 3), 7.0)
    with pytest.raises(IndexError, match=match):
        gather(table, torch.tensor([1, bad]), out=out)
    assert (out == 7.0).all()  # nothing written


def test_negative_index(table):
    with pytest.raises(IndexError, match=r"index -1 is out of range for 10 rows \(valid 0..9\)"):
        gather(table, torch.tensor([0, -1], dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.int16, torch.uint8])
def test_index_dtype(table, dtype):
    with pytest.raises(TypeError, match="index must be int32 or int64"):
        gather(table, torch.zeros(2, dtype=dtype))


@pytest.mark.parametrize("index", [torch.tensor(1), torch.zeros(2, 2, dtype=torch.int64)], ids=["0d", "2d"])
def test_index_must_be_1d(table, index):
    with pytest.raises(ValueError, match="index must be 1-D"):
        gather(table, index)


def test_index_type(table):
    with pytest.raises(TypeError, match="index must be a torch.Tensor or numpy.ndarray"):
        gather(table, [1, 2])


def test_non_contiguous_src_raises(table):
    with pytest.raises(ValueError, match="src must be contiguous"):
        gather(torch.randn(3, 10).t(), torch.tensor([0]))


def test_src_checks():
    with pytest.raises(ValueError, match="at least one dimension"):
        gather(torch.tensor(1.0), torch.tensor([0]))
    with pytest.raises(TypeError, match="1, 2, 4 or 8 bytes"):
        gather(torch.zeros(4, 2, dtype=torch.complex128), torch.tensor([0]))
    with pytest.raises(TypeError, match="src must be a torch.Tensor"):
        gather([[1.0]], torch.tensor([0]))


def test_out_checks(table):
    idx = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="out has dtype torch.float64, expected torch.float32"):
        gather(table, idx, out=torch.empty(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"out has shape \(3, 3\), expected \(2, 3\)"):
        gather(table, idx, out=torch.empty(3, 3))
    with pytest.raises(ValueError, match="out must be contiguous"):
        gather(table, idx, out=torch.empty(3, 2).t())


def test_backend_names(table):
    with pytest.raises(ValueError, match="backend must be one of"):
        gather(table, torch.tensor([0]), backend="tpu")
    with pytest.raises(ValueError, match="needs a CUDA index"):
        gather(table, torch.tensor([0]), backend="cupy")


def test_resolve_backend_rules():
    kw = dict(has_cupy=True, has_numba_cuda=True)
    assert resolve_backend("auto", False, "mapped", **kw) == "cpu"
    assert resolve_backend("numba_cuda", True, "cuda", **kw) == "numba_cuda"
    assert resolve_backend("auto", True, "cuda", has_cupy=False, has_numba_cuda=True) == "numba_cuda"
    with pytest.raises(ValueError, match="pageable host memory"):
        resolve_backend("auto", True, "host", **kw)
    with pytest.raises(ValueError, match="src is in CUDA memory but the index is on the CPU"):
        resolve_backend("auto", False, "cuda", **kw)
    with pytest.raises(ValueError, match="backend 'cpu' needs a CPU index"):
        resolve_backend("cpu", True, "mapped", **kw)
    with pytest.raises(RuntimeError, match="needs CuPy or Numba CUDA"):
        resolve_backend("auto", True, "mapped", has_cupy=False, has_numba_cuda=False)


def test_index_on_another_cuda_device_than_src_raises():
    check_devices(torch.device("cuda:0"), "cuda", torch.device("cuda:0"))
    check_devices(torch.device("cuda:1"), "mapped", torch.device("cpu"))  # mapped: any device
    with pytest.raises(ValueError, match="index is on cuda:1 but src is on cuda:0"):
        check_devices(torch.device("cuda:1"), "cuda", torch.device("cuda:0"))


def test_vector_units_rule():
    from directload.kernels.variants import vector_units

    assert vector_units(400, 0x1000, 0x2040)
    assert not vector_units(404, 0x1000, 0x2040)  # rows end off a 16-byte boundary
    assert not vector_units(400, 0x1008, 0x2000)  # src
    assert not vector_units(400, 0x1000, 0x2004)  # out
    assert not vector_units(0, 0, 0)


@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "cached-views"])
def test_out_overlapping_index_raises_before_any_write(warm):
    # Outside testers' crash: out over the index's memory overwrote the index mid-gather.
    src = torch.arange(300, dtype=torch.int64).reshape(300, 1)
    buf = torch.zeros(200, dtype=torch.int64)
    out = buf[1:65].view(64, 1)
    if warm:  # src and out seen before: the cached fast path must check too
        gather(src, torch.arange(64), out=out)
    buf[:64] = torch.arange(64) + 7
    before = buf.clone()
    with pytest.raises(ValueError, match="out shares memory with index"):
        gather(src, buf[:64], out=out)
    assert torch.equal(buf, before)


@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "cached-views"])
def test_out_overlapping_src_raises(warm):
    src = torch.randn(10, 3)
    out = src[:2]
    if warm:  # both seen before, so the cached fast path is taken
        gather(src, torch.tensor([0, 1]))
        gather(torch.randn(5, 3), torch.tensor([0, 1]), out=out)
    before = src.clone()
    with pytest.raises(ValueError, match="out shares memory with src"):
        gather(src, torch.tensor([3, 4]), out=out)
    with pytest.raises(ValueError, match="out shares memory with src"):
        gather(src[:2], torch.tensor([1, 0]), out=src[:2])  # out is src
    assert torch.equal(src, before)


def test_out_overlap_is_checked_for_async_gathers():
    src = torch.randn(10, 3)
    with pytest.raises(ValueError, match="out shares memory with src"):
        gather_async(src, torch.tensor([1]), out=src[9:])


def test_adjacent_buffers_do_not_count_as_overlap():
    buf = torch.zeros(20, 3)
    src, out = buf[:10], buf[10:12]
    src.copy_(torch.randn(10, 3))
    gather(src, torch.tensor([9, 0]), out=out)
    assert torch.equal(out, src[[9, 0]])


def test_gather_from_a_table_without_rows_raises_index_error():
    with pytest.raises(IndexError, match=r"index 0 is out of range for 0 rows \(there are none\)"):
        gather(torch.empty(0, 5), torch.tensor([0]))
    assert gather(torch.empty(0, 5), torch.tensor([], dtype=torch.int64)).shape == (0, 5)


@pytest.mark.parametrize("run", [gather, lambda s, i: gather_async(s, i).wait()], ids=["gather", "gather_async"])
def test_zero_width_rows_still_range_check(run):
    src = torch.empty(10, 0)
    assert run(src, torch.tensor([9, 0])).shape == (2, 0)
    with pytest.raises(IndexError, match="index 10 is out of range for 10 rows"):
        run(src, torch.tensor([0, 10]))
    with pytest.raises(IndexError, match=r"index -1 is out of range for 10 rows \(valid 0..9\)"):
        run(src, torch.tensor([-1]))


@pytest.mark.parametrize("case", ["rows", "columns", "transposed", "wider elements", "3-D", "2-D index",
                                  "float index"])
@pytest.mark.parametrize("kind", ["tensor", "numpy"])
def test_every_backend_launch_refuses_operands_it_would_write_past(case, kind):
    # each backend's launch writes through raw pointers: a wrong out crashed the CPU one with SIGSEGV
    from directload.kernels import cpu
    from directload.kernels.operands import check_launch

    src = torch.arange(4000, dtype=torch.int32).view(1000, 4)
    index = torch.randint(0, 1000, (70000,))  # large enough for the parallel team
    out = {"rows": torch.empty(10, 4, dtype=torch.int32), "columns": torch.empty(70000, 2, dtype=torch.int32),
           "transposed": torch.empty(4, 70000, dtype=torch.int32).t(),
           "wider elements": torch.empty(70000, 4, dtype=torch.int64),
           "3-D": torch.empty(70000, 2, 2, dtype=torch.int32)}.get(case, torch.empty(70000, 4, dtype=torch.int32))
    if case == "2-D index":
        index = index.view(-1, 1)
    if case == "float index":
        index = index.float()
    poison = out.clone()
    if kind == "numpy":
        src, index, out = src.numpy(), index.numpy(), out.numpy()
    with pytest.raises((ValueError, TypeError)):
        check_launch(src, index, out)
    with pytest.raises((ValueError, TypeError)):
        cpu.launch(src, index, out)
    assert torch.equal(torch.as_tensor(out), poison)  # nothing written


_NO_DATA_SCRIPT = r"""
import torch
import directload
from directload.kernels import cpu, gather

cpu.prepare(background=False)  # the kernels loaded: the lazy index_select path no longer stands in front
src, idx = torch.randn(10, 3), torch.tensor([1, 2])
gather(src, idx)
gather(src, idx)  # src's view cached: the fast path
cases = {
    "out meta": lambda: gather(src, idx, out=torch.empty(2, 3, device="meta")),
    "out sparse": lambda: gather(src, idx, out=torch.zeros(2, 3).to_sparse()),
    "index meta": lambda: gather(src, idx.to("meta")),
    "index sparse": lambda: gather(src, idx.to_sparse()),
    "src meta": lambda: gather(src.to("meta"), idx),
    "launch out meta": lambda: cpu.launch(src, idx, torch.empty(2, 3, device="meta")),
    "unified index meta": lambda: directload.to_unified(src.clone())[idx.to("meta")],
    "unified index sparse": lambda: directload.to_unified(src.clone())[idx.to_sparse()],
}
for name, case in cases.items():
    try:
        case()
        print(name, "no error")
    except (TypeError, ValueError) as exc:
        print(name, type(exc).__name__, exc)
"""


def test_tensors_without_memory_are_refused_typed_never_dereferenced():
    # A meta tensor's data pointer is null: the loaded CPU kernel wrote through it (SIGSEGV), so this runs in
    # a process of its own
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _NO_DATA_SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = run.stdout.splitlines()
    assert len(got) == 8, run.stdout
    for line in got:
        assert "no error" not in line, line
        if "meta" in line:
            assert "ValueError" in line and "meta device" in line, line
        else:
            assert "TypeError" in line and "dense tensor" in line, line


@pytest.mark.parametrize("kinds", ["tensor src, array out", "array src, tensor out", "list index", "list out"])
def test_cpu_launch_refuses_operands_of_mixed_kinds_typed(kinds):
    """The CPU launch takes torch tensors or numpy arrays, ``src`` and ``out`` of one kind, as it dereferences one
    kind's raw pointers (mixed, it raised AttributeError); the index may be either, as gather takes it."""
    from directload.kernels import cpu

    src, index = torch.arange(12, dtype=torch.int32).view(6, 2), torch.tensor([5, 0])
    out = torch.zeros(2, 2, dtype=torch.int32)
    src, index, out = {"tensor src, array out": (src, index, out.numpy()),
                       "array src, tensor out": (src.numpy(), index, out),
                       "list index": (src, [5, 0], out), "list out": (src, index, [[0, 0], [0, 0]])}[kinds]
    match = ("src and out must be of one kind, both torch tensors or both numpy arrays" if "," in kinds else
             f"{kinds.split()[1]} must be a torch.Tensor or numpy.ndarray, got list")
    with pytest.raises(TypeError, match=match):
        cpu.launch(src, index, out)
    if "," in kinds:
        assert not np.asarray(out).any()  # nothing written


@pytest.mark.parametrize("kind", ["tensor", "array"])
def test_cpu_launch_takes_an_index_of_either_kind(kind):
    from directload.kernels import cpu

    src = torch.arange(12, dtype=torch.int32).view(6, 2)
    out = torch.zeros(2, 2, dtype=torch.int32)
    index = torch.tensor([5, 0]) if kind == "tensor" else np.array([5, 0])
    assert cpu.launch(src, index, out) == -1 and out.tolist() == [[10, 11], [0, 1]]
    assert cpu.launch(src.numpy(), index, out.numpy()) == -1 and out.tolist() == [[10, 11], [0, 1]]
