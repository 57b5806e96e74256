"""What the disk store's read engines share: a read's result, its error, the fault hook and thread CPU time.

The engines are :class:`~directload.stores.disk_uring.UringEngine` (io_uring) and its fallback
:class:`~directload.stores.disk_pread.PreadEngine`.  A read's result is the bytes it got, or ``-errno``;
``-ENODATA`` means the file ended early (it shrank after it was opened).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from directload.files import CorruptFileError

if TYPE_CHECKING:
    from numba.core.typing.templates import Signature

__all__ = ["FAULTS", "inject", "load_i32", "timed", "read_error"]

#: Fault injection for tests: ``[errno to inject, completions to fail, completions to cut short]``.  The
#: engines read it at each call (a hook in the reader, as the reliability tests need); all zero in use.
FAULTS = np.zeros(3, np.int64)


@intrinsic
def load_i32(typingctx: object, addr: types.Type) -> tuple[Signature, Callable[..., Any]]:
    """The int32 at an address (a completion's ``res``, ``errno``), in compiled code only.

    Examples
    --------
    >>> value = np.array([7], np.int32)
    >>> njit(lambda addr: load_i32(addr))(np.uint64(value.ctypes.data))
    7
    """
    def codegen(context, builder, signature, args):
        import llvmlite.ir as ir

        return builder.load(builder.inttoptr(args[0], ir.IntType(32).as_pointer()))
    return types.int32(types.uint64), codegen


@njit(nogil=True)
def inject(r: int, block: int, faults: np.ndarray) -> int:
    """``r`` after the test hook :data:`FAULTS`: an error instead of a result, or a result cut short.

    Examples
    --------
    >>> inject(4096, 512, np.array([5, 1, 0])), inject(4096, 512, np.array([0, 0, 1]))
    (-5, 2048)
    >>> inject(4096, 512, np.zeros(3, np.int64))
    4096
    """
    if r > 0 and faults[1] > 0:
        faults[1] -= 1
        return -faults[0]
    if r > block and faults[2] > 0:
        faults[2] -= 1
        return (r // 2) // block * block
    return r


def timed(fn: Callable[..., object], *args: object) -> float:
    """Run ``fn(*args)``; the CPU seconds this thread spent.

    Examples
    --------
    >>> timed(sum, [1, 2]) >= 0
    True
    """
    c0 = time.thread_time()
    fn(*args)
    return time.thread_time() - c0


def read_error(path: os.PathLike[str] | str, code: int, offset: int, length: int,
               retries: int) -> OSError | CorruptFileError:
    """The error a failed read of ``length`` bytes at ``offset`` of ``path`` raises: its result was ``-code``
    after ``retries`` retries; ``ENODATA`` (the file ended early) is a :class:`~directload.files.CorruptFileError`.

    Examples
    --------
    >>> read_error("f.npy", errno.EIO, 4096, 512, 3)
    OSError(5, 'f.npy: read of 512 bytes at offset 4096 failed after 3 retries: Input/output error')
    >>> print(read_error("f.npy", errno.ENODATA, 0, 512, 3))
    f.npy: read of 512 bytes at offset 0 hit the end of the file: it shrank after it was opened
    """
    where = f"{path}: read of {length} bytes at offset {offset}"
    if code == errno.ENODATA:
        return CorruptFileError(f"{where} hit the end of the file: it shrank after it was opened")
    return OSError(code, f"{where} failed after {retries} retries: {os.strerror(code)}", str(path))
