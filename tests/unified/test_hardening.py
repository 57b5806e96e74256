"""Defects found by outside testing: memory safety, read-only tables, autograd, closing races, truncated files."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

import directload
from directload import ClosedError, CorruptFileError


def _run_isolated(code, timeout=120):
    """Run ``code`` in a fresh interpreter: a use-after-free or SIGBUS must not take the test run down."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          encoding="utf-8", errors="replace",
                          timeout=timeout)


@pytest.mark.parametrize("change", ["t.set_()", "t.set_(torch.zeros(5))", "t.resize_(1 << 22)", "del t"])
def test_unified_tensor_owns_the_storage_of_what_it_was_made_from(change):
    # Before: the unified tensor held the tensor object only, so set_()/resize_() freed the bytes
    # under it (garbage in one run, SIGSEGV in another).
    proc = _run_isolated(f"""
        import gc, torch, directload
        t = torch.arange(4096, dtype=torch.float32).reshape(1024, 4) + 0.5
        want = t.clone()
        u = directload.to_unified(t, affinity="host")
        {change}
        gc.collect()
        junk = [torch.full((1024, 4), -7.0) for _ in range(64)]  # reuse any freed memory
        idx = torch.arange(1024)
        assert torch.equal(u[idx], want), "unified tensor reads changed bytes"
        assert torch.equal(u.host, want) and torch.equal(u.sum(), want.sum())
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.fixture
def read_only(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(24, dtype=np.float32).reshape(6, 4))
    return directload.from_file(tmp_path / "t.npy", affinity="host")


_MUTATIONS = {
    "fill_": lambda x: x.fill_(1.0),
    "zero_": lambda x: x.zero_(),
    "add_": lambda x: x.add_(1.0),
    "mul_": lambda x: x.mul_(2.0),
    "iadd": lambda x: x.__iadd__(1.0),
    "index_put_": lambda x: x.index_put_((torch.tensor([0]),), torch.zeros(4)),
    "index_copy_": lambda x: x.index_copy_(0, torch.tensor([1]), torch.zeros(1, 4)),
    "index_fill_": lambda x: x.index_fill_(0, torch.tensor([1]), 3.0),
    "masked_fill_": lambda x: x.masked_fill_(torch.ones(6, 4, dtype=torch.bool), 0.0),
    "scatter_": lambda x: x.scatter_(0, torch.zeros(1, 4, dtype=torch.int64), 9.0),
    "clamp_": lambda x: x.clamp_(max=0.0),
    "nn.init.zeros_": lambda x: torch.nn.init.zeros_(x),
    "nn.init.normal_": lambda x: torch.nn.init.normal_(x),
    "out=": lambda x: torch.add(torch.ones(6, 4), 1.0, out=x),
    "index_select out=": lambda x: torch.index_select(torch.ones(6, 4), 0, torch.arange(6), out=x),
    "_foreach_add_": lambda x: torch._foreach_add_([x], 1.0),
    "setitem": lambda x: x.__setitem__(torch.tensor([0]), torch.zeros(1, 4)),
    "copy_": lambda x: x.copy_(torch.zeros(6, 4)),
}


@pytest.mark.parametrize("name", sorted(_MUTATIONS))
def test_read_only_table_refuses_every_mutation(read_only, name):
    before = read_only.host.clone()
    with pytest.raises(PermissionError, match="read-only"):
        _MUTATIONS[name](read_only)
    assert torch.equal(read_only.host, before)


def test_read_only_table_still_reads(read_only):
    idx = torch.tensor([5, 0])
    plain = read_only.host.clone()
    assert torch.equal(read_only[idx], plain[idx])
    assert torch.equal(read_only + 1, plain + 1) and torch.equal(read_only.sum(), plain.sum())
    out = torch.empty(6, 4)
    torch.add(read_only, 1.0, out=out)  # out= a plain tensor is a read of the table
    assert torch.equal(out, plain + 1)
    target = torch.zeros(6, 4)
    target.copy_(read_only)  # copying *from* a unified tensor into a plain one
    assert torch.equal(target, plain)
    arr = np.asarray(read_only)
    assert not arr.flags.writeable and not read_only.numpy().flags.writeable
    assert read_only.read_only and not directload.zeros(2).read_only


def test_to_unified_read_only_flag_is_honoured():
    x = directload.to_unified(torch.zeros(3, 2), read_only=True)
    with pytest.raises(PermissionError):
        x.add_(1)
    y = directload.to_unified(torch.zeros(3, 2), copy=True, read_only=True)
    with pytest.raises(PermissionError):
        y.fill_(1)
    with pytest.raises(PermissionError):
        directload.to_unified(directload.zeros(2), read_only=True).zero_()


@pytest.mark.parametrize("op", ["set_", "resize_", "resize_as_", "data"])
def test_ops_that_would_move_the_memory_are_refused(op):
    x = directload.zeros((4, 2))
    with pytest.raises(TypeError, match="unified tensor"):
        if op == "data":
            x.data = torch.ones(4, 2)
        elif op == "set_":
            x.set_(torch.ones(4, 2))
        elif op == "resize_":
            x.resize_(100, 2)
        else:
            x.resize_as_(torch.ones(100, 2))
    assert x.shape == (4, 2) and x.sum().item() == 0


@pytest.mark.parametrize("write", ["setitem", "copy_", "add_"])
def test_writes_to_a_table_that_requires_grad_are_seen_by_autograd(write):
    # Before: the write skipped autograd's version counter, and backward() used the new values.
    w = torch.randn(4, 3, requires_grad=True)
    loss = (w * w).sum()
    u = directload.to_unified(w)
    if write == "setitem":
        u[torch.tensor([0])] = torch.zeros(1, 3)
    elif write == "copy_":
        u.copy_(torch.zeros(4, 3))
    else:
        u.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_writes_before_the_graph_is_built_are_fine():
    w = torch.zeros(4, 3, requires_grad=True)
    u = directload.to_unified(w)
    u[torch.tensor([1])] = torch.ones(1, 3)
    (w * 2).sum().backward()
    assert torch.equal(w.grad, torch.full((4, 3), 2.0)) and w[1].sum().item() == 3.0


def test_close_racing_reads_raises_closed_error_only():
    # Before: a read racing close() on another thread got TypeError("src must be a torch.Tensor, got NoneType").
    idx = torch.arange(64)
    seen = set()

    def reader(x, errors):
        try:
            for _ in range(50):
                x[idx]
                x.sum()
        except Exception as exc:  # recorded, checked below
            errors.append(exc)

    for _ in range(200):
        x = directload.to_unified(torch.randn(256, 8), copy=True, affinity="host")
        errors = []
        t = threading.Thread(target=reader, args=(x, errors))
        t.start()
        x.close()
        t.join()
        for exc in errors:
            seen.add(type(exc))
            assert isinstance(exc, ClosedError), repr(exc)
    print(f"error types seen: {seen}")


def test_every_use_after_close_raises_closed_error():
    x = directload.zeros((3, 2))
    x.close()
    for use in (lambda: x[torch.tensor([0])], lambda: x.host, lambda: x.check_backing(), lambda: x.add_(1),
                lambda: torch.zeros(3, 2).copy_(x), lambda: x.cuda_view(), lambda: np.asarray(x)):
        with pytest.raises(ClosedError):
            use()


def test_truncated_file_raises_instead_of_sigbus(tmp_path):
    # Before: x[idx] on a file truncated under its mapping killed the process with SIGBUS.
    proc = _run_isolated(f"""
        import os, numpy as np, torch, directload
        path = {str(tmp_path / "t.npy")!r}
        np.save(path, np.ones((1 << 16, 64), np.float32))  # 16 MiB
        x = directload.from_file(path, affinity="host")
        view = x.with_affinity("host")
        os.truncate(path, 4096)
        for gather in (lambda: x[torch.tensor([(1 << 16) - 1])], lambda: torch.index_select(view, 0, torch.tensor([9])),
                       lambda: torch.nn.functional.embedding(torch.tensor([3]), x)):
            try:
                gather()
            except directload.CorruptFileError as exc:
                assert "changed size after it was mapped" in str(exc), exc
            else:
                raise SystemExit("no error")
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])


def test_file_size_is_checked_at_open(tmp_path):
    np.save(tmp_path / "t.npy", np.ones((100, 4), np.float32))
    with open(tmp_path / "t.npy", "r+b") as f:
        f.truncate(200)
    with pytest.raises(CorruptFileError, match="truncated"):
        directload.from_file(tmp_path / "t.npy")


def test_file_watch_closes_its_descriptor(tmp_path):
    import gc
    import os

    path = tmp_path / "t.npy"
    np.save(path, np.ones((100, 4), np.float32))

    def ours():  # descriptors open on this test's file only: other threads open and close their own meanwhile
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == str(path.resolve()):
                    found.append(fd)
            except OSError:  # closed since the listing
                pass
        return found

    for _ in range(50):
        x = directload.from_file(path)
        x[torch.tensor([1])]
        assert ours(), "the file watch holds no descriptor on the file"  # the check can see one
        del x
    gc.collect()
    assert ours() == []
