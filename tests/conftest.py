"""Shared fixtures: the device list, markers, awkward inputs and a seeded RNG."""

import contextlib
import importlib
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
os.environ.setdefault("OUTDATED_IGNORE", "1")  # ogb would ask the network for its latest version

# The simulator must be chosen before numba is imported, so its tests run in a
# process of their own: NUMBA_ENABLE_CUDASIM=1 pytest tests/cudasim.
collect_ignore = [] if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else ["cudasim"]


def _loads(module):
    """Whether ``module`` imports (a framework may be installed but not load with this torch)."""
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or a framework's own error on an unsupported torch
        return False
    return True


#: Which lane this is (scripts/dev.sh sets it): "dgl", "pyg", or "" for a plain run.
LANE = os.environ.get("DIRECTLOAD_LANE", "")
HAS_DGL = _loads("dgl")
HAS_PYG = _loads("torch_geometric") and _loads("torch_sparse")
HAS_OGB = _loads("ogb")
if LANE and not HAS_OGB:
    raise RuntimeError(f"the {LANE} lane's tests need OGB, which does not import here")
if LANE == "dgl" and not HAS_DGL:
    raise RuntimeError("the DGL lane's tests need DGL, which does not import here")
if LANE == "pyg" and not HAS_PYG:
    raise RuntimeError("the PyG lane's tests need torch_geometric and torch_sparse, which do not import here")
# Framework tests run in their framework's lane; the rest run in both.
if not HAS_DGL:
    collect_ignore.append("loaders/dgl_loader")
if not HAS_PYG:
    collect_ignore.append("loaders/pyg_loader")


@pytest.fixture(scope="session", autouse=True)
def _cpu_kernels_loaded():
    """Every CPU gather kernel loaded up front, so the gathers under test run the kernels (a process uses
    torch's index_select until a load pays; tests/kernels/test_readiness.py tests that path)."""
    from directload.kernels import cpu

    for aligned in (True, False):
        cpu.prepare(aligned=aligned, background=False)


def frameworks():
    """The frameworks installed in this lane, DGL first."""
    return [name for name, ok in (("dgl", HAS_DGL), ("pyg", HAS_PYG)) if ok]

#: Row lengths (elements) that straddle 128-byte lines in every way.
ROW_ELEMS = (1, 11, 37, 100, 513, 602)
#: Every dtype a feature table may have, by element size.
DTYPES = (torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.float32,
          torch.int32, torch.float64, torch.int64, torch.bool)


#: The lanes a test marked ``one_lane`` may name.
LANES = ("dgl", "pyg")
_OTHER_LANE = pytest.StashKey[int]()  # how many tests this lane left to the other


def _lane_of(item):
    """The lane an item marked ``@pytest.mark.one_lane("dgl" | "pyg")`` runs in, or None (every lane)."""
    marker = item.get_closest_marker("one_lane")
    if marker is None:
        return None
    if len(marker.args) != 1 or marker.args[0] not in LANES:
        raise pytest.UsageError(f"{item.nodeid}: one_lane takes one lane of {LANES}, got {marker.args}")
    return marker.args[0]


def split_by_lane(items, lane):
    """``(here, elsewhere)``: the items that run in ``lane`` and those marked ``one_lane`` for the other.  A test
    that does not depend on torch's or numpy's version runs in one lane of scripts/dev.sh (pytest.ini's
    ``one_lane``); a plain run (``lane`` empty: DIRECTLOAD_LANE unset) runs every test."""
    here, elsewhere = [], []
    for item in items:
        marked = _lane_of(item)  # checked in a plain run too: a wrong lane name fails everywhere
        (elsewhere if lane and marked not in (None, lane) else here).append(item)
    return here, elsewhere


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    no_ogb = pytest.mark.skip(reason="needs OGB (pip install 'directload[ogb]')")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("ogb") and not HAS_OGB:
            item.add_marker(no_ogb)
    here, elsewhere = split_by_lane(items, LANE)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = here
    config.stash[_OTHER_LANE] = len(elsewhere)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    count = config.stash.get(_OTHER_LANE, 0)
    if count:
        other = next(lane for lane in LANES if lane != LANE)
        terminalreporter.write_line(f"{count} tests marked one_lane({other!r}) were deselected: they run in the "
                                    f"{other} lane")


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
def sync_debug():
    """``with sync_debug(): ...`` runs the block under ``torch.cuda.set_sync_debug_mode("error")`` where
    ``DIRECTLOAD_SYNC_DEBUG=1`` and CUDA exist (the GPU kit's hot-path section sets it), so a host sync
    inside the block (``.item()``, a blocking copy to the host) raises ``RuntimeError``.  Elsewhere the
    block just runs.  It yields whether the check is on."""

    @contextlib.contextmanager
    def block():
        if os.environ.get("DIRECTLOAD_SYNC_DEBUG") != "1" or not torch.cuda.is_available():
            yield False
            return
        old = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield True
        finally:
            torch.cuda.set_sync_debug_mode(old)

    return block


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


def within(seconds, fn):
    """``fn()``'s result or exception, or a test failure if it has not returned after ``seconds``."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back below
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: a hang"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def drain_from_threads(iterator, threads=2):
    """Every item of ``iterator``, pulled by ``threads`` threads at once."""
    got, errors = [], []

    def run():
        try:
            for item in iter(lambda: next(iterator, None), None):
                got.append(item)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    pool = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
        assert not t.is_alive(), "a thread hung on the shared iterator"
    assert errors == []
    return got


@pytest.fixture
def shm(tmp_path):
    """A tmpfs of our own where one can be mounted (root), else a plain directory (the protocol is the same)."""
    where = tmp_path / "shm"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(where)],
                             capture_output=True).returncode == 0
    yield str(where)
    if mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def load_script(name):
    """The module of ``scripts/<name>.py``, loaded from its file (the scripts are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
