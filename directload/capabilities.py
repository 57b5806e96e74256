"""What this machine can do (CUDA, CuPy, NVRTC, Numba CUDA simulator, io_uring), decided once."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import sys
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from directload.errors import DirectloadError

if TYPE_CHECKING:
    from _ctypes import CFuncPtr

    import torch

__all__ = ["Capabilities", "capabilities", "usable_device", "NoDeviceError", "require", "io_uring_usable",
           "liburing_functions", "UnavailableError"]


@dataclass(frozen=True)
class Capabilities:
    """Answers of :func:`capabilities`.

    Attributes
    ----------
    cuda : bool
        A CUDA device is usable by torch.
    device_count : int
        CUDA devices visible.
    device_name : str
        Name of device 0, or ``""``.
    cupy : str
        CuPy version, or ``""`` when it does not import (probed when first asked: importing CuPy and
        Numba CUDA takes most of a second, and a machine without CUDA never launches either).
    nvrtc : str
        Path of the libnvrtc used for offline and CuPy compiles, or ``""`` (probed when first asked).
    numba_cuda : str
        ``"NVIDIA"`` (numba-cuda), ``"Built-in"``, ``"simulator"`` or ``""`` (probed when first asked).
    cudasim : bool
        ``NUMBA_ENABLE_CUDASIM=1``: Numba CUDA kernels run on the CPU simulator.
    io_uring : bool
        The ``liburing`` package imports and the kernel lets it set up a ring.
    disk_reads : str
        The read path of :class:`directload.stores.DiskStore`: ``"io_uring"``,
        or ``"pread"`` (a thread pool) where io_uring is missing.
    host_memory : str
        Memory new unified tensors get: ``"pinned-mapped"`` with CUDA, else
        ``"host"`` (ordinary pageable memory).

    Examples
    --------
    >>> caps = capabilities()
    >>> caps.host_memory == ("pinned-mapped" if caps.cuda else "host")
    True
    >>> caps.disk_reads == ("io_uring" if caps.io_uring else "pread")
    True
    """

    cuda: bool
    device_count: int
    device_name: str
    cudasim: bool
    io_uring: bool
    disk_reads: str
    host_memory: str

    @property
    def cupy(self) -> str:
        return _cupy()

    @property
    def nvrtc(self) -> str:
        return _nvrtc()

    @property
    def numba_cuda(self) -> str:
        return _numba_cuda(self.cudasim)

    def as_dict(self) -> dict[str, bool | int | str]:
        """Plain dict, for JSON reports (every probe answered)."""
        d = asdict(self)
        order = ("cuda", "device_count", "device_name", "cupy", "nvrtc", "numba_cuda", "cudasim", "io_uring",
                 "disk_reads", "host_memory")
        d.update(cupy=self.cupy, nvrtc=self.nvrtc, numba_cuda=self.numba_cuda)
        return {key: d[key] for key in order}


def _cuda():
    import torch

    # torch checks the driver without creating a context.
    if not torch.cuda.is_available():
        return False, 0, ""
    n = torch.cuda.device_count()
    return n > 0, n, torch.cuda.get_device_name(0) if n else ""


@functools.cache
def _cupy():
    try:
        import cupy
    except ImportError:
        return ""
    return cupy.__version__


def find_libnvrtc() -> str | None:
    """Path of ``libnvrtc`` (CUDA 12 or 13): the pip wheel torch or CuPy brings, else the system one.

    NVIDIA's ``cuda-pathfinder`` (a dependency of CuPy and numba-cuda) knows
    where each CUDA release's wheels put it (``nvidia/cuda_nvrtc/lib`` for 12,
    ``nvidia/cu13/lib`` for 13); without it, those places are searched here.
    """
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception:  # not installed, or it found no nvrtc: search below
        pass
    try:
        import nvidia

        for root in nvidia.__path__:
            for pattern in ("cuda_nvrtc/lib/libnvrtc.so.1[23]*", "cu13/lib/libnvrtc.so.13*"):
                hits = sorted(glob.glob(os.path.join(root, pattern)))
                if hits:
                    return hits[0]
    except ImportError:
        pass
    for candidate in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        try:
            ctypes.CDLL(candidate)
            return candidate
        except OSError:
            continue
    return None


@functools.cache
def _nvrtc():
    return find_libnvrtc() or ""


@functools.cache
def _numba_cuda(cudasim):
    if cudasim:
        return "simulator"
    try:
        from numba import cuda
    except ImportError:
        return ""
    return getattr(cuda, "implementation", "Built-in")


@functools.cache
def liburing_functions() -> dict[str, CFuncPtr]:
    """liburing's C functions from the ``liburing`` package's own library, typed for ctypes and
    Numba; ``{}`` where the package is missing.  The disk store's read loop calls them."""
    try:
        import liburing
    except ImportError:
        return {}
    lib = ctypes.CDLL(liburing.liburing.__file__)
    u64, i32, u32 = ctypes.c_uint64, ctypes.c_int, ctypes.c_uint

    def fn(name, res, *args):
        f = getattr(lib, name)
        f.restype, f.argtypes = res, list(args)
        return f

    return {
        "queue_init": fn("io_uring_queue_init", i32, u32, u64, u32),
        "queue_exit": fn("io_uring_queue_exit", None, u64),
        "dontfork": fn("io_uring_ring_dontfork", i32, u64),
        "get_sqe": fn("io_uring_get_sqe", u64, u64),
        "prep_read": fn("io_uring_prep_read", None, u64, i32, u64, u32, u64),
        "set_data": fn("io_uring_sqe_set_data64", None, u64, u64),
        "submit_and_wait": fn("io_uring_submit_and_wait", i32, u64, u32),
        "peek_batch": fn("io_uring_peek_batch_cqe", u32, u64, u64, u32),
        "cq_advance": fn("io_uring_cq_advance", None, u64, u32),
        "get_data": fn("io_uring_cqe_get_data64", u64, u64),
    }


#: Bytes of a ``struct io_uring`` buffer: it is ~220 bytes; room for future liburing versions.
RING_BYTES = 4096


@functools.cache
def io_uring_usable() -> bool:
    """Whether liburing loads and the kernel lets this process set up a ring (probed once, with
    the same C functions the disk store reads through)."""
    f = liburing_functions()
    if not f:
        return False
    ring = ctypes.create_string_buffer(RING_BYTES)
    if f["queue_init"](4, ctypes.addressof(ring), 0) < 0:  # -EPERM/-ENOSYS where the kernel forbids it
        return False
    f["queue_exit"](ctypes.addressof(ring))
    return True


@functools.cache
def capabilities() -> Capabilities:
    """Probe the machine once; later calls return the same answer.

    Nothing is probed at import; the first call loads the CUDA driver through
    torch (no context is created) and opens and closes one io_uring ring.  CuPy,
    NVRTC and Numba CUDA are probed when first asked for.

    Returns
    -------
    Capabilities

    Examples
    --------
    >>> caps = capabilities()
    >>> caps.host_memory in ("pinned-mapped", "host")
    True
    """
    cudasim = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    cuda, count, name = _cuda()
    uring = io_uring_usable()
    return Capabilities(
        cuda=cuda,
        device_count=count,
        device_name=name,
        cudasim=cudasim,
        io_uring=uring,
        disk_reads="io_uring" if uring else "pread",
        host_memory="pinned-mapped" if cuda else "host",
    )


class NoDeviceError(DirectloadError, RuntimeError):
    """A device was asked for that this machine does not have (CUDA without a GPU, ``cuda:3`` of two).

    Examples
    --------
    >>> try:
    ...     usable_device("cuda:99")
    ... except NoDeviceError:
    ...     print("no such device here")
    no such device here
    """


class UnavailableError(DirectloadError, RuntimeError):
    """Something asked for is missing from this machine or process: a GPU backend's library (CuPy, Numba
    CUDA), torch's OpenMP runtime.

    Examples
    --------
    >>> issubclass(UnavailableError, RuntimeError)
    True
    """


def usable_device(device: torch.device | str | int | None) -> torch.device:
    """``device`` as a :class:`torch.device` this machine can use, or a clear error.

    ``None`` and ``"auto"`` pick ``cuda`` where a GPU is usable, else ``cpu``.
    Only CPU and CUDA devices are accepted: the loaders and gathers place data
    on one of them.

    Raises
    ------
    ValueError
        Not a device name, or a device type other than ``cpu``/``cuda``.
    NoDeviceError
        A CUDA device on a machine without one (or an index past the last).

    Examples
    --------
    >>> usable_device("cpu")
    device(type='cpu')
    """
    import torch

    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a device: {device!r} (use 'cpu', 'cuda' or 'cuda:N')") from exc
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device {dev} is not supported: use 'cpu' or 'cuda'")
    if not torch.cuda.is_available():
        raise NoDeviceError(f"device {str(device)!r} was asked for, but this machine has no usable CUDA device "
                            "(torch.cuda.is_available() is False); use 'cpu'")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise NoDeviceError(f"device {dev} was asked for, but this machine has {count} CUDA device(s)")
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


#: The extras that install each optional package.
_EXTRAS = {"dgl": "dgl", "torch_geometric": "pyg", "torch_sparse": "pyg-sampler", "ogb": "ogb"}


def require(module: str) -> ModuleType:
    """Import an optional package (a framework, OGB), or raise ``ImportError`` naming the extra to install.

    Examples
    --------
    >>> require("json").__name__
    'json'
    """
    import importlib

    try:
        with _import_environment(module):
            return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.split(".")[0], module)
        raise ImportError(f"this needs {module}, which is not installed (or does not load with torch "
                          f"{_torch_version()}): pip install 'directload[{extra}]' (see the README's install "
                          f"matrix)") from exc


# What a package reads from the environment when it is first imported, where its default is not what
# directload runs: DGL without DGLBACKEND prints a warning and writes ~/.dgl/config.json.
_IMPORT_ENV = {"dgl": {"DGLBACKEND": "pytorch"}}


@contextlib.contextmanager
def _import_environment(module):
    """Set the variables of :data:`_IMPORT_ENV` that the user left unset while ``module`` is first imported,
    then remove them: the process's environment is as it was."""
    top = module.split(".")[0]
    missing = {} if top in sys.modules else {k: v for k, v in _IMPORT_ENV.get(top, {}).items()
                                             if k not in os.environ}
    os.environ.update(missing)
    try:
        yield
    finally:
        for key in missing:
            os.environ.pop(key, None)


def _torch_version():
    import torch

    return torch.__version__
