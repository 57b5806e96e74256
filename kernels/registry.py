"""The gather backends by name: which module runs each, and which one a gather takes.

Every backend module exports the same two launches, so the gathers (:mod:`directload.kernels.api`) and the tiered
gather (:mod:`directload.kernels.tiered`) call whichever :func:`resolve_backend` picked without knowing which:

* ``launch(src, index, out, *, aligned, stream) -> int`` (see :func:`directload.kernels.cpu_launch.launch`);
* ``launch_tiered(cache, flat, where, out, *, aligned, stream) -> None`` (see
  :func:`directload.kernels.cpu_launch.launch_tiered`).

The GPU modules import Numba CUDA or CuPy, so a backend's module is imported on its first use, not here.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType

from directload.capabilities import UnavailableError, capabilities

from .devices import read_devices

__all__ = ["BACKENDS", "GPU_BACKENDS", "BACKEND_MODULES", "backend_module", "launcher", "tiered_launcher",
           "resolve_backend", "choose_backend", "auto_gpu_backend"]

#: The names a gather's ``backend=`` takes; ``"auto"`` leaves the choice to :func:`resolve_backend`.
BACKENDS = ("auto", "cpu", "numba_cuda", "cupy")
#: The backends that run on a CUDA device, in the order ``"auto"`` prefers them.
GPU_BACKENDS = ("cupy", "numba_cuda")
#: Backend name -> its module, relative to this package.
BACKEND_MODULES = {"cpu": ".cpu", "numba_cuda": ".numba_cuda", "cupy": ".cupy_backend"}


@functools.cache  # a hit is one dict lookup: the gathers ask on every launch
def backend_module(name: str) -> ModuleType:
    """The module of backend ``name`` (``"cpu"``, ``"numba_cuda"`` or ``"cupy"``), imported on first use.

    Examples
    --------
    >>> backend_module("cpu").__name__
    'directload.kernels.cpu'
    """
    return importlib.import_module(BACKEND_MODULES[name], __package__)


def launcher(name: str) -> Callable[..., int]:
    """The ``launch`` function of backend ``name`` (``"cpu"``, ``"numba_cuda"`` or ``"cupy"``)."""
    return backend_module(name).launch


def tiered_launcher(name: str) -> Callable[..., None]:
    """The ``launch_tiered`` function of backend ``name`` (``"cpu"``, ``"numba_cuda"`` or ``"cupy"``)."""
    return backend_module(name).launch_tiered


def auto_gpu_backend(has_cupy: bool | str, has_numba_cuda: bool | str) -> str | None:
    """The GPU backend ``"auto"`` takes where the machine offers these (CuPy first), or None for neither.

    Examples
    --------
    >>> auto_gpu_backend("13.3.0", "0.11.0"), auto_gpu_backend("", "0.11.0"), auto_gpu_backend(False, False)
    ('cupy', 'numba_cuda', None)
    """
    for name, present in zip(GPU_BACKENDS, (has_cupy, has_numba_cuda)):
        if present:
            return name
    return None


def resolve_backend(requested: str, index_on_cuda: bool, src_location: str, *, has_cupy: bool | str,
                    has_numba_cuda: bool | str) -> str:
    """Pick the backend for one gather.  Pure; raises on an impossible combination.

    Parameters
    ----------
    requested : str
        One of :data:`BACKENDS`.
    index_on_cuda : bool
        Whether the index is a CUDA tensor (this decides CPU vs GPU kernel).
    src_location : {"host", "mapped", "cuda"}
        Pageable host memory, pinned GPU-mapped host memory, or device memory.
    has_cupy, has_numba_cuda : bool or str
        What the machine offers for GPU launches (truth values: :func:`~directload.capabilities.capabilities`
        gives version strings, ``""`` for none).

    Returns
    -------
    str
        ``"cpu"``, ``"numba_cuda"`` or ``"cupy"``.

    Examples
    --------
    >>> resolve_backend("auto", False, "host", has_cupy=False, has_numba_cuda=False)
    'cpu'
    >>> resolve_backend("auto", True, "mapped", has_cupy=True, has_numba_cuda=True)
    'cupy'
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    index_device = "cuda" if index_on_cuda else "cpu"
    run, out = read_devices(index_device, None, "cuda" if src_location == "cuda" else src_location)
    if run.type != out.type:  # the rows would need a copy, which a gather never makes silently
        if out.type == "cpu":
            raise ValueError("src is in CUDA memory but the index is on the CPU: pass a CUDA index "
                             "(a CPU index runs the CPU kernel, which cannot read device memory)")
        raise ValueError("src is pageable host memory, which a GPU kernel cannot read: make it a "
                         "unified tensor (directload.to_unified) or pin it, or pass a CPU index")
    if run.type == "cpu":
        if requested in GPU_BACKENDS:
            raise ValueError(f"backend {requested!r} needs a CUDA index; a CPU index runs the 'cpu' backend")
        return "cpu"
    if requested == "cpu":
        raise ValueError("backend 'cpu' needs a CPU index; a CUDA index runs a GPU kernel")
    if requested == "auto":
        chosen = auto_gpu_backend(has_cupy, has_numba_cuda)
        if chosen is None:
            raise UnavailableError("a CUDA index needs CuPy or Numba CUDA; install cupy-cuda12x or numba-cuda")
        return chosen
    return requested


def choose_backend(requested: str, index_on_cuda: bool, src_location: str) -> str:
    """:func:`resolve_backend` on this machine: a CPU index is run by the CPU whatever the machine offers, so
    only CUDA ids ask :func:`~directload.capabilities.capabilities` (which may load CUDA libraries once).

    Examples
    --------
    >>> choose_backend("auto", False, "mapped")
    'cpu'
    """
    if not index_on_cuda:
        return resolve_backend(requested, False, src_location, has_cupy=False, has_numba_cuda=False)
    caps = capabilities()
    return resolve_backend(requested, True, src_location, has_cupy=caps.cupy, has_numba_cuda=caps.numba_cuda)
