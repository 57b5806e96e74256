"""CPU backend: parallel naive and aligned row gathers with Numba ``njit(parallel=True)``."""

from types import FunctionType

import numba
from numba import njit, prange

from .indexing import naive_element

__all__ = ["gather_rows", "index_bounds", "set_num_threads", "get_num_threads", "SERIAL_BYTES"]

_naive = njit(inline="always")(naive_element)


def _naive_body(src, idx, out):
    row_elems = src.shape[1]
    for i in prange(idx.shape[0] * row_elems):
        r, c = _naive(i, row_elems)
        out[r, c] = src[idx[r], c]


def _aligned_body(src, idx, out):
    # The aligned mapping's partition of work: one worker per row, as one warp per
    # row on the GPU.  The circular order inside a row only serves the GPU's
    # 128-byte coalescing; a CPU core copies the row as one contiguous run, which
    # the compiler vectorises (computing the GPU plan per row cost 30% at 256 B).
    row_elems = src.shape[1]
    for i in prange(idx.shape[0]):
        row = idx[i]
        for c in range(row_elems):
            out[i, c] = src[row, c]


def _compile(body, parallel):
    # A copy of the function under its own name: Numba's on-disk cache is keyed by
    # qualified name, not by the parallel flag, so the two variants must differ.
    fn = FunctionType(body.__code__, body.__globals__, body.__name__)
    fn.__qualname__ = f"{body.__qualname__}_{'parallel' if parallel else 'serial'}"
    return njit(parallel=parallel, nogil=True, cache=True, boundscheck=False)(fn)


# Each body compiles twice: parallel, and serial for small gathers, where starting
# a parallel region (about 50 us, measured) costs more than the copy itself.
_KERNELS = {
    (aligned, parallel): _compile(body, parallel)
    for aligned, body in ((True, _aligned_body), (False, _naive_body))
    for parallel in (True, False)
}
#: Output bytes below which the serial kernel runs.
SERIAL_BYTES = 256 * 1024


def gather_rows(src, idx, out, *, aligned=True):
    """``out[i] = src[idx[i]]`` on all Numba threads.

    Parameters
    ----------
    src : numpy.ndarray
        ``[rows, row_elems]`` C-contiguous, an unsigned-integer bit-carrier dtype.
    idx : numpy.ndarray
        1-D int32/int64, already checked to lie in ``[0, rows)``.
    out : numpy.ndarray
        ``[len(idx), row_elems]``, same dtype as ``src``; written in full.
    aligned : bool
        One worker per row (the aligned kernels' partition), or one iteration
        per output element (the naive kernels' flat mapping).

    Examples
    --------
    >>> import numpy as np
    >>> src = np.arange(6, dtype=np.uint32).reshape(3, 2)
    >>> out = np.empty((2, 2), np.uint32)
    >>> gather_rows(src, np.array([2, 0]), out)
    >>> out.tolist()
    [[4, 5], [0, 1]]
    """
    parallel = out.nbytes >= SERIAL_BYTES and numba.get_num_threads() > 1  # per calling thread
    _KERNELS[bool(aligned), parallel](src, idx, out)


def set_num_threads(n):
    """Threads the CPU kernels use (Numba's thread pool)."""
    numba.set_num_threads(n)


def get_num_threads():
    """Threads the CPU kernels use."""
    return numba.get_num_threads()


@njit(nogil=True, cache=True)
def index_bounds(idx):
    """(min, max) of a non-empty index, in one serial pass.

    Serial on purpose: starting a second parallel region (Numba's, or torch's
    aminmax on its own OpenMP team, whose threads spin after it returns) right
    before the gather cost 0.1-0.2 ms per call on 2 cores (measured), more than
    this pass takes (4 us for 32K ids, 40 us for 256K).
    """
    lo = idx[0]
    hi = idx[0]
    for i in range(idx.shape[0]):
        v = idx[i]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return lo, hi
