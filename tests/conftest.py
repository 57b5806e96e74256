"""Shared fixtures: the device list, markers, awkward inputs and a seeded RNG."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
os.environ.setdefault("OUTDATED_IGNORE", "1")  # ogb would ask the network for its latest version

# The simulator must be chosen before numba is imported, so its tests run in a
# process of their own: NUMBA_ENABLE_CUDASIM=1 pytest tests/cudasim.
if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    collect_ignore = ["cudasim"]

#: Row lengths (elements) that straddle 128-byte lines in every way.
ROW_ELEMS = (1, 11, 37, 100, 513, 602)
#: Every dtype a feature table may have, by element size.
DTYPES = (torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.float32,
          torch.int32, torch.float64, torch.int64, torch.bool)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


@pytest.fixture(params=_devices())
def device(request):
    """``cpu`` always, plus ``cuda`` where a GPU exists."""
    return torch.device(request.param)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the clock; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


def random_table(rng, rows, row_elems, dtype):
    """A ``[rows, row_elems]`` tensor of random bits in ``dtype`` (bool gets 0/1)."""
    if dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, (rows, row_elems)).astype(np.bool_))
    size = torch.empty((), dtype=dtype).element_size()
    bits = rng.integers(0, 256, (rows, row_elems * size), dtype=np.uint8)
    t = torch.from_numpy(bits).view(dtype)
    if dtype.is_floating_point:
        t = torch.nan_to_num(t)  # keep torch.equal meaningful
    return t


POISONS = (0xA5, 0x5A)


def bits(t):
    """A tensor's raw bytes, for bit-exact comparison (NaN payloads, bf16, bool)."""
    return t.contiguous().view(torch.uint8).reshape(-1)


def assert_gathers(run, src, index, expected=None):
    """Run ``run(out)`` on two outputs poisoned differently; both must equal the oracle.

    Two poisons, because an element a kernel never writes could equal one
    poison by chance, but not both.  The oracle is torch indexing on the CPU.
    ``run`` fills ``out`` (a CPU tensor) or returns the tensor it produced.
    """
    if expected is None:
        expected = src.cpu()[torch.as_tensor(index).cpu().long()]
    for byte in POISONS:
        out = torch.empty(expected.shape, dtype=src.dtype)
        out.view(torch.uint8).fill_(byte)
        got = run(out)
        got = out if got is None else got
        assert got.dtype == src.dtype
        assert tuple(got.shape) == tuple(expected.shape)
        assert torch.equal(bits(got.cpu()), bits(expected)), f"mismatch with poison {byte:#x}"
