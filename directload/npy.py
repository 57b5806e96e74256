"""``.npy`` files: a strict header reader, an aligned header writer with directload's mark, and opening
only regular files.

Everything directload reads from a user's ``.npy`` goes through :func:`read_header`, which trusts
nothing: the file must be a regular file (a FIFO would block the open for ever, a device or a directory
is no table), the header must parse within a bounded length, every dimension must be a non-negative
integer, and the file's size must equal the header's promise computed in exact integer arithmetic (a
shape of 2**62 rows must not wrap to a small product and open).  Every failure is a
:class:`CorruptFileError` that names the file.

The mark.  A file that directload writes as part of a disk store (its rows, its id map) carries one
comment after the header's dictionary, inside the space padding the format allows::

    {'descr': '<f4', 'fortran_order': False, 'shape': (1000, 128), }  # directload-store v2 token=... packed=0

numpy (1.x and 2.x) parses the header as a Python literal, so the comment is invisible to ``np.load``,
OGB's readers and every tool built on numpy.  To directload it binds the file to the other files of its
store generation (the sidecar names the same token), says that a sidecar is required (a data file
copied away from its sidecar is refused, not read in the wrong order) and says whether the rows are in
a packed (renumbered) order that only the id map undoes.
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import numpy as np

from directload.errors import DirectloadError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["CorruptFileError", "NpyHeader", "open_regular", "read_header", "header_bytes", "make_mark",
           "MAX_HEADER_BYTES"]

#: Longest header read (numpy's own default limit is 10,000 bytes; a directload header is 4 KiB).
MAX_HEADER_BYTES = 1 << 16
_MAGIC = b"\x93NUMPY"
_MARK = re.compile(r"#\s*directload-store v(\d+) token=([0-9a-f]{32}) packed=([01])\s*$")


class CorruptFileError(DirectloadError, ValueError):
    """A feature file is truncated, has a bad header, is not a regular file, or does not match the
    requested layout or its own sidecar.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(suffix=".npy") as f:
    ...     _ = f.write(b"not a table"); f.flush()
    ...     read_header(f, f.name)
    Traceback (most recent call last):
    ...
    directload.npy.CorruptFileError: ....npy: not a valid .npy file (no .npy magic string)
    """


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: os.PathLike[str] | str, mode: str = "rb") -> IO[bytes]:
    """``path`` opened (``"rb"`` or ``"r+b"``) when it is a regular file, else :class:`CorruptFileError`
    before a byte is read.

    The open itself never blocks: it is non-blocking (a FIFO without a writer would otherwise wait for
    ever), and the file's type is checked on the open descriptor, so a file swapped for a FIFO between a
    check and the open cannot slip through.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); os.mkfifo(os.path.join(d, "pipe"))
    >>> try:
    ...     open_regular(os.path.join(d, "pipe"))
    ... except CorruptFileError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    a FIFO, not a regular file; a feature file must be a regular file
    """
    if mode not in ("rb", "r+b"):
        raise ValueError(f"mode must be 'rb' or 'r+b', not {mode!r}")
    flags = (os.O_RDONLY if mode == "rb" else os.O_RDWR) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptFileError(f"{path}: {_kind(st.st_mode)}, not a regular file; a feature file must be a "
                                   "regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` file's header says, checked against the file.

    ``mark`` is None for a file directload did not write as part of a store, else
    ``{"version", "token", "packed"}``.  ``device`` and ``inode`` identify the very file that was read,
    so a reader can tell that a path it opens again is still that file.

    Examples
    --------
    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "feat.npy")
    >>> np.save(path, np.zeros((3, 2), np.float32))
    >>> with open_regular(path) as f:
    ...     head = read_header(f, path)
    >>> head.dtype, head.shape, head.offset, head.data_bytes, head.mark
    (dtype('float32'), (3, 2), 128, 24, None)
    >>> tmp.cleanup()
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    size: int
    fortran_order: bool
    mark: dict[str, int | str | bool] | None
    device: int
    inode: int

    @property
    def data_bytes(self) -> int:
        return self.size - self.offset


def read_header(f: IO[bytes], path: os.PathLike[str] | str) -> NpyHeader:
    """The :class:`NpyHeader` of the open ``.npy`` file ``f`` (read from its start), or
    :class:`CorruptFileError` naming ``path`` and what is wrong.

    Checks, in order: the magic string and version, a header length within :data:`MAX_HEADER_BYTES`
    and the file, numpy's own parse of the header (any exception it raises on a malformed header is a
    corrupt file here), every dimension a non-negative integer, no object dtype, C order for arrays of
    more than one dimension, and the file's size equal to the header's offset plus the array's bytes,
    exactly.
    """
    st = os.fstat(f.fileno())
    size = st.st_size
    f.seek(0)
    lead = f.read(10)
    if len(lead) < 10 or lead[:6] != _MAGIC:
        raise CorruptFileError(f"{path}: not a valid .npy file (no .npy magic string)")
    major, minor = lead[6], lead[7]
    if (major, minor) not in ((1, 0), (2, 0), (3, 0)):
        raise CorruptFileError(f"{path}: not a valid .npy file (format version {major}.{minor})")
    if major == 1:
        head_len, start = int.from_bytes(lead[8:10], "little"), 10
    else:
        more = f.read(2)
        if len(more) < 2:
            raise CorruptFileError(f"{path}: not a valid .npy file (truncated header)")
        head_len, start = int.from_bytes(lead[8:10] + more, "little"), 12
    if head_len > MAX_HEADER_BYTES:
        raise CorruptFileError(f"{path}: not a valid .npy file (a header of {head_len} bytes; at most "
                               f"{MAX_HEADER_BYTES} are read)")
    if start + head_len > size:
        raise CorruptFileError(f"{path}: not a valid .npy file (truncated header)")
    text_bytes = f.read(head_len)
    f.seek(0)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # 3.0 (a utf-8 header): numpy has no public reader for it
            shape, fortran, dtype = _read_header_3(f)
    except Exception as exc:  # numpy raises ValueError, SyntaxError, TokenError, TypeError... on bad headers
        raise CorruptFileError(f"{path}: not a valid .npy file ({type(exc).__name__}: {exc})") from None
    offset = f.tell()
    if not isinstance(shape, tuple) or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
        raise CorruptFileError(f"{path}: the header's shape {shape!r} is not a tuple of non-negative integers")
    if dtype.hasobject:
        raise CorruptFileError(f"{path}: object arrays cannot be read as rows")
    if fortran and len(shape) > 1:
        raise CorruptFileError(f"{path}: Fortran-ordered arrays cannot be gathered by row; save it C-ordered")
    want = offset + math.prod(shape) * dtype.itemsize  # exact: no wrap at 2**63
    if size != want:
        kind = "truncated" if size < want else "longer than its header says"
        raise CorruptFileError(f"{path}: {kind}: header promises {want} bytes, file has {size} ({shape} of "
                               f"{dtype})")
    text = text_bytes.decode("latin1")
    tail = text[text.rfind("}") + 1:]
    found = _MARK.search(tail)
    mark = None if found is None else {"version": int(found.group(1)), "token": found.group(2),
                                       "packed": found.group(3) == "1"}
    return NpyHeader(dtype, tuple(shape), offset, size, bool(fortran), mark, st.st_dev, st.st_ino)


def _read_header_3(f):
    impl = getattr(np.lib.format, "_read_array_header", None)
    if impl is None:  # numpy 2 keeps it in the format module's implementation
        from numpy.lib import _format_impl  # noqa: PLC0415

        impl = _format_impl._read_array_header
    return impl(f, (3, 0))


def make_mark(token: str, packed: bool, version: int = 2) -> str:
    """The mark's text for :func:`header_bytes`.  Pure.

    Examples
    --------
    >>> make_mark("0" * 32, False)
    '# directload-store v2 token=00000000000000000000000000000000 packed=0'
    """
    if not re.fullmatch(r"[0-9a-f]{32}", token):
        raise ValueError(f"a store token is 32 lowercase hex digits, got {token!r}")
    return f"# directload-store v{int(version)} token={token} packed={int(bool(packed))}"


def header_bytes(np_dtype: npt.DTypeLike, shape: Sequence[int], *, align: int = 64,
                 mark: str | None = None) -> bytes:
    """A version-1.0 ``.npy`` header for a C-ordered ``shape`` array of ``np_dtype``, padded with spaces
    so the data starts at a multiple of ``align`` bytes, with ``mark`` (see :func:`make_mark`) after the
    dictionary.  Pure.

    Examples
    --------
    >>> import io
    >>> head = header_bytes(np.dtype("<f4"), (3, 2), align=4096, mark=make_mark("0" * 32, True))
    >>> f = io.BytesIO(head); np.lib.format.read_magic(f); len(head), np.lib.format.read_array_header_1_0(f)
    (1, 0)
    (4096, ((3, 2), False, dtype('float32')))
    """
    text = repr({"descr": np.lib.format.dtype_to_descr(np.dtype(np_dtype)), "fortran_order": False,
                 "shape": tuple(int(s) for s in shape)})
    if mark:
        text += "  " + mark
    head = len(_MAGIC) + 2 + 2  # magic, version, header length
    total = -(-(head + len(text) + 1) // align) * align
    if total - head > 0xFFFF:
        raise ValueError(f"the array's shape is too long for a .npy header: {tuple(shape)}")
    text = text + " " * (total - head - len(text) - 1) + "\n"
    return _MAGIC + bytes([1, 0]) + (total - head).to_bytes(2, "little") + text.encode("latin1")
