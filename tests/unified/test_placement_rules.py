"""The placement rule table, case by case (rules from directload/placement.py)."""

import pytest
import torch
import torch.nn.functional as F

import directload
from directload.placement import compute_device, describe, index_device, place

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def _unified(affinity):
    return directload.zeros((5, 3), affinity=affinity)


@pytest.mark.parametrize("operands,has_cuda,expect", [
    ([("unified", "cuda")], True, CUDA),                          # rule 4
    ([("unified", "cuda")], False, CPU),                          # no CUDA on this machine
    ([("unified", "host")], True, CPU),                           # rule 5
    ([("unified", "host"), ("cuda", CUDA)], True, CUDA),          # rule 3: a CUDA operand wins
    ([("unified", "cuda"), ("cuda", torch.device("cuda", 1))], True, torch.device("cuda", 1)),
    ([("unified", "cuda"), ("cpu", 1)], True, CPU),               # non-scalar CPU operand: host
    ([("unified", "cuda"), ("cpu", 0)], True, CUDA),              # 0-d CPU scalars do not count
    ([("unified", "cuda"), None], True, CUDA),                    # Python scalars do not count
    ([("unified", "host"), ("unified", "cuda")], True, CUDA),     # any GPU affinity
])
def test_rule_table(operands, has_cuda, expect):
    assert place(operands, has_cuda=has_cuda) == expect


def test_describe():
    assert describe(_unified("host")) == ("unified", "host")
    assert describe(torch.zeros(2, 2)) == ("cpu", 2)
    assert describe(torch.tensor(1.0)) == ("cpu", 0)
    assert describe(3.0) is None


def test_compute_device_on_this_machine():
    has = torch.cuda.is_available()
    assert compute_device([_unified("cuda")], has_cuda=has).type == ("cuda" if has else "cpu")
    assert compute_device([_unified("host"), torch.zeros(3)], has_cuda=has) == CPU


def test_index_device_rules(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert index_device(_unified("cuda"), torch.tensor([1]), has_cuda=True) == CUDA   # rule 1
    assert index_device(_unified("host"), torch.tensor([1]), has_cuda=True) == CPU    # rule 2
    assert index_device(_unified("cuda"), torch.tensor([1]), has_cuda=False) == CPU   # no CUDA


@pytest.mark.parametrize("op", ["getitem", "getitem_list", "index_select", "torch_index_select", "embedding"])
@pytest.mark.parametrize("affinity", ["host", "cuda"])
def test_indexing_goes_to_the_gather_kernel(op, affinity, monkeypatch, rng):
    import directload.unified as unified

    calls = []
    real = unified._gather
    monkeypatch.setattr(unified, "_gather", lambda *hit: calls.append(1) or real(*hit))
    data = torch.from_numpy(rng.standard_normal((20, 6)).astype("float32"))
    x = directload.to_unified(data.clone(), affinity)
    idx = torch.from_numpy(rng.integers(0, 20, 9))
    got = {
        "getitem": lambda: x[idx],
        "getitem_list": lambda: x[idx.tolist()],
        "index_select": lambda: x.index_select(0, idx),
        "torch_index_select": lambda: torch.index_select(x, 0, idx),
        "embedding": lambda: F.embedding(idx.view(3, 3), x),
    }[op]()
    want = data[idx] if op != "embedding" else data[idx].view(3, 3, 6)
    assert calls == [1]
    assert type(got) is torch.Tensor and not directload.is_unified(got)
    assert got.device.type == ("cuda" if affinity == "cuda" and torch.cuda.is_available() else "cpu")
    assert torch.equal(got.cpu(), want)


def test_other_ops_run_on_the_host_view_on_cpu(rng):
    data = torch.from_numpy(rng.standard_normal((8, 3)).astype("float32"))
    x = directload.to_unified(data.clone(), "host")
    ones = torch.ones(3)
    for got, want in [(x + 1, data + 1), (x.sum(0), data.sum(0)), (torch.matmul(x, ones), data @ ones),
                      (x[2:4], data[2:4]), (x.float().mean(), data.mean())]:
        assert type(got) is torch.Tensor and got.device.type == "cpu"
        assert torch.allclose(got, want)
    # A slice is a view of the unified memory, not a copy.
    assert x[2:4].data_ptr() == x.data_ptr() + 2 * 3 * 4


def test_metadata_needs_no_computation():
    x = directload.zeros((4, 3), dtype=torch.float16)
    assert (x.shape, x.dtype, x.dim(), x.numel(), len(x), x.element_size()) == ((4, 3), torch.float16, 2, 12, 4, 2)
    assert x.is_contiguous() and x.stride() == (3, 1)


def test_writes_from_cpu_values():
    x = directload.zeros((4, 2), affinity="cuda")
    x[torch.tensor([3, 1])] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert x.copy_(x.host + 1) is x
    assert x.host.tolist() == [[1, 1], [4, 5], [1, 1], [2, 3]]


def test_index_select_reaches_the_kernel_when_a_library_wrapped_torch_index_select_first():
    # PyG replaces torch.index_select with a wrapper at import; when it is imported before directload,
    # torch_function still sees torch's builtin, which must count as index_select.
    import subprocess
    import sys

    code = """
import torch
_old = torch.index_select
def wrapper(input, dim, index, *, out=None):
    return _old(input, dim, index) if out is None else _old(input, dim, index, out=out)
torch.index_select = wrapper
import directload, directload.unified as unified
calls = []
real = unified._gather
unified._gather = lambda *hit: calls.append(1) or real(*hit)
x = directload.to_unified(torch.arange(10.0).reshape(5, 2), "host")
got = torch.index_select(x, 0, torch.tensor([4, 0]))
assert calls == [1] and got.tolist() == [[8.0, 9.0], [0.0, 1.0]], calls
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]
