"""The capabilities module and ``directload info``."""

import json
import os
import subprocess
import sys

from directload.capabilities import capabilities


def test_decided_once():
    assert capabilities() is capabilities()


def test_answers_are_consistent():
    caps = capabilities()
    assert caps.host_memory == ("pinned-mapped" if caps.cuda else "host")
    assert caps.device_count >= int(caps.cuda)
    assert caps.cudasim is False  # this lane runs without the simulator
    assert caps.numba_cuda in ("NVIDIA", "Built-in")
    assert caps.nvrtc and os.path.exists(caps.nvrtc) or caps.nvrtc.startswith("libnvrtc")
    assert isinstance(caps.io_uring, bool)
    assert caps.disk_reads == ("io_uring" if caps.io_uring else "pread")



def test_import_touches_no_gpu_and_compiles_nothing():
    code = ("import sys, torch, directload, directload.kernels, directload.loaders; "
            "assert 'cupy' not in sys.modules, 'cupy imported'; "
            "assert not torch.cuda.is_initialized(), 'CUDA initialised'; "
            "assert 'directload.kernels.numba_cuda' not in sys.modules; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         encoding="utf-8", errors="replace", check=True)
    assert out.stdout.strip() == "clean"


def test_info_command_prints_json():
    out = subprocess.run([sys.executable, "-m", "directload", "info", "--json"], capture_output=True,
                         encoding="utf-8", errors="replace",
                         check=True)
    data = json.loads(out.stdout)
    assert set(data) >= {"cuda", "cupy", "nvrtc", "cudasim", "io_uring", "host_memory"}
    assert data["cudasim"] is False
