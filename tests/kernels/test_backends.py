"""One launch signature: the cpu, numba_cuda and cupy backends are interchangeable behind kernels.api."""

import inspect

import numpy as np
import pytest
import torch

from directload.kernels import api, cpu


def test_every_backend_exports_the_same_launch_signature():
    from directload.kernels import cupy_backend, numba_cuda

    want = inspect.signature(cpu.launch)
    assert list(want.parameters) == ["src", "index", "out", "aligned", "stream"]
    for module in (numba_cuda, cupy_backend):
        assert inspect.signature(module.launch) == want, module.__name__
    assert api.launcher("cpu") is cpu.launch
    assert api.launcher("numba_cuda") is numba_cuda.launch and api.launcher("cupy") is cupy_backend.launch
    with pytest.raises(KeyError):
        api.launcher("opencl")


def test_one_registry_serves_the_gather_and_the_tiered_gather():
    """kernels.registry names every backend's module once; the plain and the tiered gather both look their
    launches up there, and every module exports both with one signature each."""
    from directload.kernels import cupy_backend, numba_cuda, registry, tiered

    modules = {"cpu": cpu, "numba_cuda": numba_cuda, "cupy": cupy_backend}
    assert {name: registry.backend_module(name) for name in registry.BACKEND_MODULES} == modules
    assert set(registry.BACKENDS) == {"auto", *modules}
    want = inspect.signature(cpu.launch_tiered)
    assert list(want.parameters) == ["cache", "flat", "where", "out", "aligned", "stream"]
    for name, module in modules.items():
        assert inspect.signature(module.launch_tiered) == want, name
        assert registry.tiered_launcher(name) is module.launch_tiered and tiered.tiered_launcher(name) is \
            module.launch_tiered
        assert registry.launcher(name) is module.launch
    assert registry.choose_backend("auto", False, "host") == "cpu"
    with pytest.raises(ValueError, match="backend 'cupy' needs a CUDA index"):
        registry.choose_backend("cupy", False, "mapped")


@pytest.mark.parametrize("n", [300, 3000], ids=["serial", "team"])
@pytest.mark.parametrize("aligned", [True, False])
def test_cpu_launch_takes_tensors_or_arrays_and_flags_the_first_bad_index(n, aligned, rng):
    assert (n * 97 * 4 >= cpu.SERIAL_BYTES) == (n == 3000)
    rows = 5000
    src = torch.from_numpy(rng.integers(-2**31, 2**31, (rows, 97)).astype(np.int32))
    idx = torch.from_numpy(rng.integers(0, rows, n))
    out = torch.full((n, 97), -7, dtype=torch.int32)
    assert cpu.launch(src, idx, out, aligned=aligned) == -1
    assert torch.equal(out, src[idx])
    out_np = np.full((n, 97), -7, np.int32)
    assert cpu.launch(src.numpy(), idx.numpy(), out_np, aligned=aligned) == -1
    assert (out_np == src.numpy()[idx.numpy()]).all()
    bad = idx.clone()
    bad[[n // 2, n - 1]] = rows  # the first bad position is reported, and nothing is written
    poisoned = torch.full_like(out, -7)
    assert cpu.launch(src, bad, poisoned, aligned=aligned) == n // 2
    assert (poisoned == -7).all()
