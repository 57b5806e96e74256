"""Feature tables in files: raw or ``.npy``, memory-mapped and registered as unified tensors."""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Literal

import numpy as np
import torch

from . import unified
from .memory import resolve_pin
from .npy import CorruptFileError, open_regular, read_header
from .unified import to_unified

if TYPE_CHECKING:
    import numpy.typing as npt

    from .unified import UnifiedTensor

__all__ = ["CorruptFileError", "FileWatch", "from_file", "npy_layout"]  # CorruptFileError: directload.npy's


def npy_layout(path: os.PathLike[str] | str) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, data offset) of a ``.npy`` file, checked against its size.

    Raises
    ------
    CorruptFileError
        Not a regular file, bad magic or header, Fortran order, object dtype, or a file shorter (or
        longer) than its header says (see :func:`directload.npy.read_header`).
    """
    with open_regular(path) as f:
        head = read_header(f, path)
    return head.dtype, head.shape, head.offset


class FileWatch:
    """Notices a mapped file changing size under its mapping.

    A page of a mapping past the end of a truncated file raises SIGBUS when
    read, which kills the process (``numpy.memmap`` has the same limit), so a
    unified tensor over a file calls :meth:`check` (one ``fstat`` of the mapped
    file itself, about a microsecond) before each gather.  The file can still
    shrink between the check and the read; nothing in user space can close that
    window, so do not truncate a file that is mapped.

    Examples
    --------
    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rows.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(bytes(8))
    >>> with open(path, "rb") as f:
    ...     watch = FileWatch(f, path, size=8)
    >>> watch.check()  # the size it was mapped with: nothing to say
    >>> with open(path, "ab") as f:
    ...     _ = f.write(bytes(4))
    >>> watch.check()
    Traceback (most recent call last):
    ...
    directload.npy.CorruptFileError: ...rows.bin: the file changed size after it was mapped (8 -> 12 bytes)...
    >>> tmp.cleanup()
    """

    def __init__(self, f: IO[bytes], path: os.PathLike[str] | str, size: int) -> None:
        self.path = path
        self.size = size
        self._fd = os.dup(f.fileno())
        self._finalizer = weakref.finalize(self, os.close, self._fd)

    def check(self) -> None:
        """Raise :class:`CorruptFileError` if the file's size differs from when it was mapped."""
        now = os.fstat(self._fd).st_size
        if now != self.size:
            raise CorruptFileError(f"{self.path}: the file changed size after it was mapped ({self.size} -> {now} "
                                   "bytes); reading it now could crash the process with SIGBUS.  Map it again "
                                   "with directload.from_file once it is complete")


def from_file(path: os.PathLike[str] | str, dtype: npt.DTypeLike | torch.dtype | None = None,
              shape: Sequence[int] | None = None, *, offset: int = 0, mode: Literal["r", "r+"] = "r",
              affinity: str = "cuda", pin: str | bool = "require") -> UnifiedTensor:
    """Memory-map a feature file and make it a unified tensor, copying nothing.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file (its header gives dtype and shape), or raw row-major bytes.
    dtype : numpy or torch dtype, optional
        Element type of a raw file (required for raw files).
    shape : tuple of int, optional
        Shape of a raw file; one entry may be ``-1`` (inferred from the size).
    offset : int
        Bytes to skip at the start of a raw file.
    mode : {"r", "r+"}
        Read-only (writes raise ``PermissionError``) or read-write mapping.
    affinity, pin
        As for :func:`directload.empty`.  With CUDA the mapping is registered
        (read-only registration for ``mode="r"``); the pages stay in the page
        cache, shared with every process that maps the file.

    Notes
    -----
    A mapped file must not be truncated while it is mapped: reading a page
    past its new end raises SIGBUS, which kills the process (as with
    ``numpy.memmap``).  The size is checked when the file is opened and before
    every gather from the unified tensor (``x[idx]``, ``index_select``,
    ``F.embedding`` and the loaders), which then raise
    :class:`CorruptFileError` instead; accesses through ``x.host`` are not
    checked.

    Returns
    -------
    directload.UnifiedTensor

    Raises
    ------
    FileNotFoundError
    CorruptFileError
        Truncated or malformed file, or a size that does not fit ``shape``.

    Examples
    --------
    >>> import numpy as np, tempfile, os, directload
    >>> path = os.path.join(tempfile.mkdtemp(), "feat.npy")
    >>> np.save(path, np.arange(6, dtype=np.float32).reshape(3, 2))
    >>> directload.from_file(path).host[2].tolist()
    [4.0, 5.0]
    """
    path = os.fspath(path)
    if mode not in ("r", "r+"):
        raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}")
    pin = resolve_pin(pin)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    # Everything below reads the one open file, so a file replaced meanwhile cannot mix layouts.
    with open_regular(path, "rb" if mode == "r" else "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        from_header = path.endswith(".npy") and dtype is None
        if from_header:
            head = read_header(f, path)
            if head.mark is not None and head.mark["packed"]:
                raise CorruptFileError(f"{path}: a packed directload disk store, its rows in hot order: open it "
                                       "with directload.stores.DiskStore, which reads them by their ids")
            np_dtype, shape, data_offset = head.dtype, head.shape, head.offset
        else:
            if dtype is None or shape is None:
                raise ValueError("a raw file needs dtype and shape (or save it as .npy)")
            np_dtype = np.dtype(torch.empty((), dtype=dtype).numpy().dtype if isinstance(dtype, torch.dtype)
                                else dtype)
            shape, data_offset = _raw_shape(path, size, np_dtype, tuple(shape), offset), offset
        watch = None
        if math.prod(shape) == 0:
            array = np.empty(shape, np_dtype)
        else:
            # "r" maps copy-on-write: a stray write through .host then changes private pages
            # instead of faulting on a read-only mapping; the unified tensor still refuses writes.
            array = np.memmap(f, dtype=np_dtype, mode="c" if mode == "r" else mode, offset=data_offset, shape=shape)
            watch = FileWatch(f, path, size)
    out = to_unified(array, affinity, pin=pin, read_only=mode == "r")
    out._file_watch = watch
    # the file itself (a store's link resolved): a process that maps it again maps these very bytes
    out._origin = ("file", {"path": os.path.realpath(path), "dtype": None if from_header else np_dtype.str,
                            "shape": None if dtype is None else shape, "offset": offset, "mode": mode, "pin": pin})
    return out


def _raw_shape(path: str, size: int, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> tuple[int, ...]:
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    if not shape or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < -1 for s in shape):
        raise ValueError(f"shape must be non-negative integers (one may be -1), rows first, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    size -= int(offset)
    if size < 0:
        raise CorruptFileError(f"{path}: offset {offset} is past the end of the file ({size + offset} bytes)")
    if shape.count(-1) > 1:
        raise ValueError("at most one shape entry may be -1")
    known = math.prod(s for s in shape if s != -1) * dtype.itemsize  # exact: no wrap at 2**63
    if -1 in shape:
        if known == 0 or size % known:
            raise CorruptFileError(f"{path}: {size} bytes is not a whole number of {known}-byte rows (truncated?)")
        shape = tuple(size // known if s == -1 else s for s in shape)
    elif size != known:
        kind = "truncated" if size < known else "longer than the shape says"
        raise CorruptFileError(f"{path}: {kind}: shape {shape} of {dtype} needs {known} bytes, file has {size}")
    return shape


unified._open_file = from_file  # unpickling a file-backed unified tensor maps the file again
