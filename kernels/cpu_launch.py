"""The CPU backend's launches on a team of threads: which team, how many threads, and torch's OpenMP runtime.

Two ways to run the kernels (:mod:`directload.kernels.cpu_kernels`) in parallel, the same row code in both:

``team="torch"`` (the default where it exists)
    A Numba ``cfunc`` started with ``GOMP_parallel`` of torch's own OpenMP
    runtime, so gathers and torch's ops share one team of threads.  Numba's
    ``parallel=True`` brings a second OpenMP runtime with a team of its own;
    on 2 cores the two teams' idle-spinning threads took the cores from each
    other at every switch between a gather and a torch op (+20-40 us on a 2 MB
    gather, measured side by side).  Thread count: ``torch.get_num_threads()``.
``team="numba"``
    ``njit(parallel=True)`` kernels on Numba's threading layer.  The fallback
    where torch's OpenMP runtime is not found (a torch without OpenMP, or not
    Linux).  Thread count: ``numba.get_num_threads()``.

:func:`set_team` or ``$DIRECTLOAD_CPU_TEAM`` picks one.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import threading

import numba
import numpy as np
import torch

from directload.capabilities import UnavailableError
from directload.units import dtype_name

from . import forks
from .cpu_kernels import FILL_KERNELS, FLAGS, KERNELS, LAUNCH, RESULT, TID, TIERED_KERNELS, team_kernel
from .decode_cpu import decode_team_kernel
from .operands import check_launch, check_readable

__all__ = ["launch", "launch_decode", "launch_tiered", "fill_rows", "set_team", "team", "get_num_threads",
           "set_num_threads",
           "SERIAL_BYTES"]

#: Output bytes below which the serial kernel runs: starting a team costs more than the copy.
SERIAL_BYTES = 256 * 1024


class _TorchOpenMP:
    """Torch's OpenMP runtime: ``GOMP_parallel`` and the calls a team body makes."""

    def __init__(self, lib):
        self.parallel = lib.GOMP_parallel
        self.parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self.parallel.restype = None
        self.functions = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
                          for n in ("omp_get_thread_num", "omp_get_num_threads", "GOMP_barrier")]
        self.blocks = threading.local()

    def block(self, threads):
        """This thread's argument block (a ctypes int64 array), with room for ``threads`` flags."""
        block = getattr(self.blocks, "block", None)
        if block is None or len(block) < FLAGS + threads:
            block = (ctypes.c_int64 * (FLAGS + max(threads, 64)))()
            block[TID:FLAGS] = self.functions
            self.blocks.block = block
            self.blocks.address = ctypes.addressof(block)
        return block, self.blocks.address


@functools.cache
def _torch_openmp():
    """Torch's loaded OpenMP runtime, or None (then the Numba team runs the kernels)."""
    if not forks.TORCH_ON_OPENMP:
        return None
    try:
        with open("/proc/self/maps") as maps:
            loaded = set(re.findall(r"(/\S*lib(?:g|i)?omp\S*\.so\S*)", maps.read()))
    except OSError:
        return None
    torch_dir = os.path.dirname(torch.__file__)
    own = sorted(p for p in loaded if p.startswith(torch_dir))
    candidates = own or (sorted(loaded) if len(loaded) == 1 else [])  # a system libgomp shared with torch
    for path in candidates:
        try:
            return _TorchOpenMP(ctypes.CDLL(path))
        except (OSError, AttributeError):
            continue
    return None


_team: str | None = None


def set_team(name: str) -> None:
    """Run parallel CPU gathers on ``"torch"``'s OpenMP team (the default where it exists)
    or on ``"numba"``'s threading layer.  Raises :class:`~directload.capabilities.UnavailableError` (a
    ``RuntimeError``) for "torch" without one."""
    global _team
    if name not in ("torch", "numba"):
        raise ValueError(f"team must be 'torch' or 'numba', got {name!r}")
    if name == "torch" and _torch_openmp() is None:
        raise UnavailableError("torch's OpenMP runtime was not found in this process; use team 'numba'")
    _team = name


def team() -> str:
    """The team that runs parallel CPU gathers: ``"torch"`` or ``"numba"``.

    Until :func:`set_team` is called: ``$DIRECTLOAD_CPU_TEAM`` if set, else
    ``"torch"`` where torch's OpenMP runtime is found, else ``"numba"``.
    """
    if _team is None:
        choice = os.environ.get("DIRECTLOAD_CPU_TEAM", "")
        if choice:
            set_team(choice)
        else:
            set_team("torch" if _torch_openmp() is not None else "numba")
    return _team  # type: ignore[return-value]  # set_team() above has set it


def get_num_threads() -> int:
    """Threads a parallel CPU gather uses: torch's count on the torch team, else Numba's;
    1 in a forked child (see :mod:`directload.kernels.forks`)."""
    if forks.forked():
        return 1
    return torch.get_num_threads() if team() == "torch" else numba.get_num_threads()


def set_num_threads(n: int) -> None:
    """Threads of Numba's team (the torch team follows ``torch.set_num_threads``)."""
    numba.set_num_threads(n)


def launch(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, *, aligned: bool = True, stream: int = 0) -> int:
    """The backends' shared launch: ``out[i] = src[index[i]]``, after checking every index.

    ``cpu``, ``numba_cuda`` and ``cupy`` each export ``launch`` with this one
    signature (:mod:`directload.kernels.registry`), and
    :mod:`directload.kernels.api` calls whichever the gather's placement
    picked.  Its type hints name what all three take (torch tensors); this
    one takes numpy arrays too: ``src`` and ``out`` of one kind, both tensors
    or both arrays, and the index of either kind (as
    :func:`~directload.kernels.gather` takes it, without a copy).

    Parameters
    ----------
    src : torch.Tensor or numpy.ndarray
        ``[rows, row_elems]`` C-contiguous, a 1/2/4/8-byte integer bit-carrier dtype.
    index : torch.Tensor or numpy.ndarray
        1-D contiguous int32/int64 on the CPU.
    out : torch.Tensor or numpy.ndarray
        ``[len(index), row_elems]``, ``src``'s dtype; written in full, or not at
        all when an index is out of range.
    aligned : bool
        Whole rows per worker (the aligned kernels' partition), or one work item
        per output element (the naive kernels' flat mapping).
    stream : int
        Unused here: a CPU gather runs now, on the caller's thread and its team.

    Returns
    -------
    int
        -1, or the position of the first index outside ``[0, rows)`` (then
        nothing was written).

    Raises
    ------
    TypeError
        An operand is neither a torch tensor nor a numpy array, ``src`` and
        ``out`` are of different kinds, or the index is not int32/int64.
    ValueError
        Shapes, element sizes or layouts no kernel may write through
        (:func:`~directload.kernels.operands.check_launch`).

    Examples
    --------
    >>> import numpy as np
    >>> src = np.arange(6, dtype=np.uint32).reshape(3, 2)
    >>> out = np.empty((2, 2), np.uint32)
    >>> launch(src, np.array([2, 0]), out)
    -1
    >>> out.tolist()
    [[4, 5], [0, 1]]
    >>> launch(src, np.array([0, 3]), out)
    1
    >>> launch(src, torch.tensor([1]), out[:1])  # the index may be a tensor
    -1
    >>> launch(torch.zeros(3, 2, dtype=torch.int32), np.array([1]), out[:1])
    Traceback (most recent call last):
    ...
    TypeError: src and out must be of one kind, ... got src Tensor and out ndarray
    """
    _check_kinds(src, index, out)
    check_launch(src, index, out)
    for name, a in (("src", src), ("index", index), ("out", out)):
        if isinstance(a, torch.Tensor):
            check_readable(a, name, ("cpu",))  # a CPU kernel dereferences raw host pointers
    if type(out) is np.ndarray:
        return _launch_arrays(src, index, out, aligned)
    threads = get_num_threads() if out.numel() * out.element_size() >= SERIAL_BYTES else 1
    if team() != "torch":
        return KERNELS[bool(aligned), threads > 1](src.numpy(), _numpy(index), out.numpy(), threads)
    if not (src.is_contiguous() and out.is_contiguous()):
        raise ValueError("the CPU kernel's tensors must be C-contiguous")
    index = torch.from_numpy(np.ascontiguousarray(index)) if type(index) is np.ndarray else index.contiguous()
    return _run_team(team_kernel(bool(aligned), src.element_size(), index.element_size()), threads,
                     src.data_ptr(), src.shape[0], src.shape[1], index.data_ptr(), index.shape[0], out.data_ptr())


def launch_decode(codes: torch.Tensor, index: torch.Tensor, out: torch.Tensor, codec_name: str) -> int:
    """The decoding gather on the CPU, on torch's team: ``out[i] = decode(codes[index[i]])``, after checking every
    index (:mod:`directload.kernels.decode_cpu`).

    ``codes`` is a C-contiguous 2-D CPU tensor of the codec's code dtype, ``index`` 1-D contiguous int32/int64,
    ``out`` C-contiguous ``[len(index), dim]`` float32, float16 or bfloat16; all checked by the caller
    (:mod:`directload.kernels.decode`).  Returns -1, or the position of the first index outside
    ``[0, len(codes))`` (then nothing was written).  Needs torch's OpenMP team (:func:`team` is ``"torch"``).
    """
    for name, a in (("codes", codes), ("index", index), ("out", out)):
        check_readable(a, name, ("cpu",))
    threads = get_num_threads() if out.numel() * out.element_size() >= SERIAL_BYTES else 1
    body = decode_team_kernel(codec_name, dtype_name(out.dtype), index.element_size())
    return _run_team(body, threads, codes.data_ptr(), codes.shape[0], codes.shape[1], index.data_ptr(),
                     index.shape[0], out.data_ptr())


def launch_tiered(cache: torch.Tensor, flat: torch.Tensor, where: torch.Tensor, out: torch.Tensor, *,
                  aligned: bool = True, stream: int = 0) -> None:
    """The CPU backend's tiered launch (the same signature as ``numba_cuda.launch_tiered`` and
    ``cupy_backend.launch_tiered``): ``out[r]`` = cache row ``where[r]``, or the flat tier's row at element
    ``-where[r] - 1``.  Torch tensors of one bit carrier, ``cache`` and ``flat`` 1-D, ``out``
    ``[len(where), row_elems]``, ``where`` checked; ``aligned`` and ``stream`` mean nothing on the CPU."""
    TIERED_KERNELS[get_num_threads() > 1](cache.numpy(), flat.numpy(), where.numpy(), out.numpy(), out.shape[1])


def fill_rows(table: np.ndarray, slots: np.ndarray, flat: np.ndarray, offsets: np.ndarray) -> None:
    """``table[slots[k]]`` = the flat tier's row at element ``offsets[k]``, over numpy arrays of one bit carrier:
    ``table`` 2-D, ``flat`` 1-D, ``slots`` and ``offsets`` int64 of one length, all checked
    (:func:`directload.kernels.tiered.fill_slots` checks them)."""
    FILL_KERNELS[get_num_threads() > 1](table, slots, flat, offsets, table.shape[1])


def _check_kinds(src, index, out):
    """``TypeError`` unless every operand is a tensor or an array, and ``src`` and ``out`` of one kind (the
    kernels take the raw pointers of one or the other)."""
    for name, a in (("src", src), ("index", index), ("out", out)):
        if not isinstance(a, (torch.Tensor, np.ndarray)):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if isinstance(src, torch.Tensor) != isinstance(out, torch.Tensor):
        raise TypeError("src and out must be of one kind, both torch tensors or both numpy arrays (the index may "
                        f"be either), got src {type(src).__name__} and out {type(out).__name__}")


def _launch_arrays(src, index, out, aligned):
    """:func:`launch` over numpy arrays."""
    threads = get_num_threads() if out.nbytes >= SERIAL_BYTES else 1
    if team() != "torch":
        return KERNELS[bool(aligned), threads > 1](src, _numpy(index), out, threads)
    if not (src.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("the CPU kernel's arrays must be C-contiguous")
    index = index.contiguous() if isinstance(index, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(index))
    return _run_team(team_kernel(bool(aligned), src.itemsize, index.element_size()), threads, src.ctypes.data,
                     src.shape[0], src.shape[1], index.data_ptr(), index.shape[0], out.ctypes.data)


def _run_team(body, threads, *launch_args):
    """The team body over one argument block: on torch's team, or right here when serial (outside
    a parallel region the runtime's thread number is 0 of 1 and its barrier returns at once)."""
    omp = _torch_openmp()
    block, block_addr = omp.block(threads)
    LAUNCH.pack_into(block, 0, *launch_args)
    if threads > 1:
        omp.parallel(body, block_addr, threads, 0)
    else:
        _serial(body)(block_addr)
    return block[RESULT]


@functools.cache
def _serial(body):
    """A ctypes caller of a compiled team body, for a run on the caller's thread alone."""
    return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body)


def _numpy(a):
    return a if isinstance(a, np.ndarray) else a.numpy()
