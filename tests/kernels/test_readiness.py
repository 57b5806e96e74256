"""Before a process has loaded its CPU gather kernel, gathers run torch's index_select: the same bits, the
same errors; the kernel loads once such gathers have taken LOAD_AFTER_S (or at prepare()); a forked
child that inherited none never loads it.  Fresh processes: the test session has every kernel loaded."""

import subprocess
import sys
import textwrap


def run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, encoding="utf-8",
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_gathers_before_the_load_are_index_selects_with_the_kernels_bits_and_errors():
    out = run("""
        import threading, torch
        from directload.kernels import cpu, gather
        table = torch.randn(1000, 37).to(torch.bfloat16)
        idx = torch.randint(0, 1000, (5000,), dtype=torch.int32)
        want = table[idx.long()]
        got = gather(table, idx)
        assert not cpu.ready(True, 2, 4), "loaded before it paid"
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and got.dtype == torch.bfloat16
        out = torch.full((2, 37), 7.0, dtype=torch.bfloat16)
        try:
            gather(table, torch.tensor([3, 1000]), out=out)
        except IndexError as exc:
            before = str(exc)
        assert (out == 7).all()  # nothing written
        assert not [t for t in threading.enumerate() if t.name == "directload-kernel-load"]
        cpu.prepare((2,), (8,), background=False)
        assert cpu.ready(True, 2, 8)
        try:
            gather(table, torch.tensor([3, 1000]), out=out)
        except IndexError as exc:
            assert str(exc) == before, (str(exc), before)  # the kernel's own message, word for word
        assert torch.equal(gather(table, idx.long()).view(torch.int16), want.view(torch.int16))
        print("ok")
    """)
    assert out.strip() == "ok"


def test_the_range_check_before_the_load_runs_no_parallel_region_of_torchs():
    # torch.aminmax ran a parallel region before each index_select: with a core held by another process it waited
    # for a descheduled thread (0.81-0.87x index_select's time under a one-core hog, 0.99x since).
    out = run("""
        import torch
        from directload.kernels import cpu, gather
        def parallel(*args, **kwargs):
            raise AssertionError("a torch reduction in the range check")
        torch.aminmax = torch.min = torch.max = parallel
        table = torch.randn(300, 8)
        idx = torch.tensor([299, 0, 7])
        assert not cpu.ready(True, 4, 8)
        assert torch.equal(gather(table, idx), table.index_select(0, idx))
        for bad, pos in (([3, 300], 1), ([-1, 3], 0)):
            try:
                gather(table, torch.tensor(bad))
            except IndexError as exc:
                assert f"position {pos}" in str(exc), str(exc)
            else:
                raise AssertionError("no IndexError")
        print("ok")
    """)
    assert out.strip() == "ok"


def test_the_kernel_loads_once_index_select_gathers_took_long_enough():
    out = run("""
        import time, torch
        from directload.kernels import cpu, cpu_path, gather
        cpu_path.LOAD_AFTER_S = 0.05
        table, idx = torch.randn(100000, 64), torch.randint(0, 100000, (50000,))
        while not cpu.ready(True, 4, 8):
            gather(table, idx)
            time.sleep(0.01)
        assert torch.equal(gather(table, idx), table[idx])
        print("loaded")
    """)
    assert out.strip() == "loaded"


def test_a_forked_child_that_inherited_no_kernel_never_loads_one():
    out = run("""
        import os, threading, torch
        from directload.kernels import cpu, cpu_path, gather
        cpu_path.LOAD_AFTER_S = 0.0
        table, idx = torch.randn(1000, 8), torch.randint(0, 1000, (3000,))
        pid = os.fork()
        if pid == 0:
            ok = all(torch.equal(gather(table, idx), table[idx]) for _ in range(20))
            loading = [t for t in threading.enumerate() if t.name == "directload-kernel-load"]
            os._exit(0 if ok and not loading and not cpu.ready(True, 4, 8) else 5)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert out.strip() == "0"


def test_a_failed_load_is_tried_again_by_the_next_prepare():
    out = run("""
        from directload.kernels import cpu, cpu_kernels, cpu_path
        calls = []

        def failing(*args):
            calls.append(args)
            raise RuntimeError("no kernel today")

        key = cpu_path.ready_key(True, 2, 8)
        if key[0] == "torch":
            cpu_kernels.team_kernel = failing
        else:
            cpu_kernels.KERNELS = {k: failing for k in cpu_kernels.KERNELS}
        for _ in range(2):
            try:
                cpu.prepare((2,), (8,), background=False)
            except RuntimeError as exc:
                assert str(exc) == "no kernel today"
            else:
                raise AssertionError("the failing load did not raise")
        assert len(calls) == 2 and not cpu.ready(True, 2, 8) and not cpu_path.LOADS.loading(key)
        print("ok")
    """)
    assert out.strip() == "ok"
