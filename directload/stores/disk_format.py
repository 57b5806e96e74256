"""The disk store's files, read and checked: a standard ``.npy`` whose rows start on a 4 KiB boundary, a
checksummed sidecar, and for a packed store an id map.

``feat.npy`` stays an ordinary ``.npy`` to numpy: ``np.load(path, mmap_mode="r")`` and OGB's tooling read
it as they read any other.  Its header is padded with spaces so that the data starts at 4096 bytes, the
largest logical block size of common disks, so an O_DIRECT read of a row never needs a block from the
header.  Beside it, the sidecar records the layout (dtype, shape, data offset, file size) and a CRC32C
per 4 MiB chunk of the data, which :func:`verify` checks.  bfloat16, which numpy lacks, is stored as
``<u2`` bits and named ``bfloat16`` in the sidecar.

Version 2 (every store of plain rows written now) is crash-consistent: ``feat.npy`` links to its current
generation (:mod:`directload.stores.generations`), the sidecar checksums itself, and the data, the sidecar and
the id map share one random token.  Version 3 is version 2 for a store of compressed rows: its sidecar names
the codec (:mod:`directload.codecs`) whose code rows the file holds, so a directload that reads only versions 1
and 2 refuses it rather than take codes for features, and a codec this directload does not know is refused
(:class:`~directload.codecs.CodecError`).  Version 1 stores (a plain file beside its sidecar) are still read.

Nothing read is trusted (:func:`read_layout`): the files must be regular files, every sidecar field must
have its type and agree with the file, sizes are computed in exact integers, a file marked as a store's
needs its sidecar, a packed store needs its id map, and every failure is a
:class:`~directload.files.CorruptFileError` that names the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from directload.capabilities import require
from directload.codecs import CODECS, CodecError
from directload.npy import CorruptFileError, open_regular, read_header
from directload.units import dtype_name

from .generations import FORMAT, id_map_path, read_sidecar_json, sidecar_path

__all__ = ["DATA_ALIGN", "CHUNK_BYTES", "VERSION", "CODEC_VERSION", "TORCH_DTYPES", "Layout", "raw_layout",
           "read_layout", "verify", "sidecar_crc", "same_file"]

DATA_ALIGN = 4096
CHUNK_BYTES = 4 << 20
#: The sidecar version written for plain rows; 1, 2 and 3 are read.
VERSION = 2
#: The sidecar version written for a store of compressed rows (its ``codec`` field).
CODEC_VERSION = 3
_MAX_CHUNK_BYTES = 1 << 40
#: How many times an open is tried when a writer publishes a new generation meanwhile.
OPEN_ATTEMPTS = 4

#: The element types a disk store holds, by the name its sidecar uses.
TORCH_DTYPES = {dtype_name(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


@dataclass(frozen=True)
class Layout:
    """Where a store's rows are: what :class:`~directload.stores.DiskStore` needs to read them.

    ``path`` is the file whose header was read (a store's current generation); ``device`` and ``inode``
    identify it, so the reader can check that the file it opens for I/O is that very file.  ``id_map``
    (old id -> row in the file) is set for a packed store when asked for.

    Examples
    --------
    >>> import os, tempfile
    >>> from directload.stores.disk_write import write_disk_store
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = write_disk_store(torch.zeros(3, 2), os.path.join(tmp.name, "f.npy"), progress=False)
    >>> layout = read_layout(path)
    >>> layout.dtype, layout.shape, layout.data_offset, layout.row_nbytes, layout.packed
    (torch.float32, (3, 2), 4096, 8, False)
    >>> tmp.cleanup()
    """

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    data_offset: int
    file_bytes: int
    sidecar: dict[str, Any] | None = None
    token: str | None = None
    device: int | None = None
    inode: int | None = None
    id_map: np.ndarray | None = None

    @property
    def codec(self) -> str | None:
        """The codec whose code rows the file holds (a version 3 store), else None."""
        return self.sidecar.get("codec") if self.sidecar else None

    @property
    def row_nbytes(self) -> int:
        return math.prod(self.shape[1:]) * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def packed(self) -> bool:
        return bool(self.sidecar and self.sidecar.get("id_map") is not None)


def _torch_dtype(np_dtype, path):
    if np_dtype.byteorder == ">" or (np_dtype.byteorder == "=" and np.little_endian is False):
        raise CorruptFileError(f"{path}: big-endian data cannot be read as rows on this machine")
    try:
        return torch.from_numpy(np.empty(0, np_dtype)).dtype
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CorruptFileError(f"{path}: {np_dtype} rows are not supported ({exc})") from None


class _Moved(Exception):
    """A file the store's current generation names is gone: a writer may have published a new one."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _resolve(path):
    return Path(os.path.realpath(path))


def read_layout(path: os.PathLike[str] | str, *, with_id_map: bool = False) -> Layout:
    """The :class:`Layout` of a ``.npy`` file or disk store, checked against its sidecar when it has one.

    A store's link is followed to its current generation; when a writer publishes a new generation while
    this reads, it reads again, so the layout is always one generation's, complete.  With
    ``with_id_map`` a packed store's id map is read and checked too (:attr:`Layout.id_map`).

    Raises
    ------
    FileNotFoundError
        No such file.
    CorruptFileError
        Not a regular file; a bad or truncated ``.npy`` file or a 0-d array; a file directload marked as
        a store's without its sidecar; a sidecar that is unreadable, has a field of the wrong type, fails
        its own checksum, or disagrees with the file (dtype, shape, data offset, size, token); a packed
        store whose id map is missing, of the wrong length or type, fails its checksum or is not a
        permutation.
    """
    path = Path(path)
    for attempt in range(OPEN_ATTEMPTS):
        target = _resolve(path)
        try:
            return _read(path, target, with_id_map)
        except _Moved as moved:
            if attempt + 1 < OPEN_ATTEMPTS and _resolve(path) != target:
                continue
            raise moved.error from None
    raise AssertionError("unreachable")


def _read(path, target, with_id_map):
    try:
        f = open_regular(target)
    except FileNotFoundError:
        if os.path.islink(path):
            raise _Moved(CorruptFileError(f"{path}: the store's current generation {target.name} is missing")) \
                from None
        raise FileNotFoundError(f"no such file: {path}") from None
    with f:
        head = read_header(f, target)
    if len(head.shape) < 1:
        raise CorruptFileError(f"{target}: a 0-d array has no rows")
    side = sidecar_path(target)
    try:
        meta = read_sidecar_json(side)
    except FileNotFoundError:
        meta = None
    if meta is None:
        if head.mark is not None:
            raise _Moved(CorruptFileError(
                f"{path}: written by directload as a disk store, but its sidecar {side.name} is missing (a store's "
                "files move together); write the store again"))
        if os.path.lexists(id_map_path(target)):
            raise CorruptFileError(f"{path}: an id map ({id_map_path(target).name}) lies next to it but no sidecar "
                                   "names it: a packed store that lost its sidecar; write the store again")
        return Layout(target, _torch_dtype(head.dtype, target), head.shape, head.offset, head.size, None, None,
                      head.device, head.inode)
    dtype, token = _check_sidecar(meta, side, head, target)
    id_map = _read_id_map(meta, target, head, token) if with_id_map and meta.get("id_map") is not None else None
    return Layout(target, dtype, head.shape, head.offset, head.size, meta, token, head.device, head.inode, id_map)


def sidecar_crc(meta: Mapping[str, Any]) -> int:
    """The CRC32C of a sidecar's fields other than its own checksum, over their canonical JSON."""
    crc32c = require("crc32c")
    body = {k: v for k, v in meta.items() if k != "sidecar_crc32c"}
    return crc32c.crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def _is_int(value, low=0, high=None):
    return type(value) is int and value >= low and (high is None or value <= high)


def _check_sidecar(meta, side, head, target):
    """The torch dtype and token a sidecar gives, after checking every field against the file."""
    def bad(field, why):
        raise CorruptFileError(f"{side}: field {field!r} {why}")

    if meta.get("format") != FORMAT:
        raise CorruptFileError(f"{side}: not a directload disk-store sidecar")
    version = meta.get("version")
    if type(version) is not int or version not in (1, 2, CODEC_VERSION):
        raise CorruptFileError(f"{side}: sidecar version {version!r}; this directload reads versions 1, 2 and 3")
    if version >= 2:
        if not _is_int(meta.get("sidecar_crc32c"), 0, 2 ** 32 - 1) or meta["sidecar_crc32c"] != sidecar_crc(meta):
            raise CorruptFileError(f"{side}: the sidecar fails its own checksum: it was edited or damaged")
    elif head.mark is not None:
        raise CorruptFileError(f"{side}: a version 1 sidecar beside a version 2 file: the files come from "
                               "different writes")
    name = meta.get("dtype")
    dtype = TORCH_DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        bad("dtype", f"is {name!r}, not one of {sorted(TORCH_DTYPES)}")
    want = {"npy_descr": np.lib.format.dtype_to_descr(head.dtype), "shape": list(head.shape),
            "data_offset": head.offset, "file_bytes": head.size}
    for key, value in want.items():
        if json.dumps(meta.get(key)) != json.dumps(value):  # exact, JSON type included (100.0 is not 100)
            raise CorruptFileError(f"{target}: the sidecar says {key} = {meta.get(key)!r} but the file has "
                                   f"{value!r}; the file was changed after it was written")
    if dtype is torch.bfloat16:
        if head.dtype != np.dtype("<u2"):
            bad("dtype", f"says bfloat16, which a disk store keeps as <u2 bits, over a file of {head.dtype}")
    elif dtype != _torch_dtype(head.dtype, target):
        bad("dtype", f"says {name} but the file holds {head.dtype}")
    chunk = meta.get("chunk_bytes")
    if not _is_int(chunk, 1, _MAX_CHUNK_BYTES):
        bad("chunk_bytes", f"is {chunk!r}, not an integer from 1 to {_MAX_CHUNK_BYTES}")
    if meta.get("checksum") != "crc32c":
        bad("checksum", f"is {meta.get('checksum')!r}, not 'crc32c'")
    sums = meta.get("chunks")
    if not isinstance(sums, list) or not all(_is_int(c, 0, 2 ** 32 - 1) for c in sums):
        bad("chunks", "is not a list of 32-bit checksums")
    if len(sums) != -(-head.data_bytes // chunk):
        bad("chunks", f"has {len(sums)} checksums for {head.data_bytes} bytes in {chunk}-byte chunks")
    _check_codec(meta, version, dtype, head, side)
    token = None
    if version >= 2:
        token = meta.get("token")
        if head.mark is None:
            raise CorruptFileError(f"{target}: its sidecar is of a directload store but the file carries no store "
                                   "mark: the file was replaced after it was written")
        if token != head.mark["token"]:
            raise CorruptFileError(f"{target}: the sidecar's token {token!r} is not the file's "
                                   f"({head.mark['token']}): the files come from different writes")
        if meta.get("data") != target.name:
            bad("data", f"names {meta.get('data')!r}, not this file ({target.name})")
        found = re.fullmatch(r".+\.g([0-9]+)", target.name)
        if found is None or meta.get("generation") != int(found.group(1)):
            bad("generation", f"is {meta.get('generation')!r}, not this file's ({target.name})")
        if head.mark["packed"] != (meta.get("id_map") is not None):
            bad("id_map", "disagrees with the file: " + ("the rows are packed but no id map is named"
                                                         if head.mark["packed"] else
                                                         "an id map is named but the rows are in id order"))
    entry = meta.get("id_map")
    if entry is not None:
        if (not isinstance(entry, dict) or entry.get("file") != id_map_path(target).name
                or not _is_int(entry.get("rows")) or entry["rows"] != head.shape[0]
                or not _is_int(entry.get("crc32c"), 0, 2 ** 32 - 1)):
            bad("id_map", f"is {entry!r}, not {{'file': {id_map_path(target).name!r}, 'rows': {head.shape[0]}, "
                          "'crc32c': <checksum>}")
    elif version == 1 and os.path.lexists(id_map_path(target)):
        bad("id_map", f"is missing, but an id map ({id_map_path(target).name}) lies next to the store: a packed "
                      "store whose sidecar lost it; write the store again")
    return dtype, token


def _check_codec(meta, version, dtype, head, side):
    """A version 3 sidecar names a codec this directload knows, whose codes the file's rows are; no other
    version names one."""
    if version != CODEC_VERSION:
        if "codec" in meta:
            raise CorruptFileError(f"{side}: field 'codec' in a version {version} sidecar (codes are version 3)")
        return
    name = meta.get("codec")
    if not isinstance(name, str):
        raise CorruptFileError(f"{side}: field 'codec' is {name!r}, not a codec's name")
    if name not in CODECS:
        raise CodecError(f"{side}: the store's rows are {name!r} codes, which this directload cannot decode "
                         f"(it knows {', '.join(CODECS)}): a newer directload wrote it")
    chosen = CODECS[name]
    if dtype != chosen.code_dtype or len(head.shape) != 2 or head.shape[1] * head.dtype.itemsize < chosen.tail:
        raise CorruptFileError(f"{side}: field 'codec' says {name}, whose codes are 2-D rows of {chosen.code_dtype}, "
                               f"but the file holds {head.dtype} of shape {tuple(head.shape)}")


def _read_id_map(meta, target, data_head, token):
    """The checked id map (old id -> row in the file) a sidecar names."""
    crc32c = require("crc32c")
    path = id_map_path(target)
    n = data_head.shape[0]
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise _Moved(CorruptFileError(f"{path}: the store's id map is missing (the sidecar says its rows are "
                                      "packed)")) from None
    with f:
        try:
            head = read_header(f, path)
        except CorruptFileError as exc:
            raise CorruptFileError(f"the store's id map is unreadable: {exc}") from None
        if head.shape != (n,) or head.dtype != np.dtype("<i8"):
            raise CorruptFileError(f"{path}: an id map of {head.shape} {head.dtype} for {n} rows (want ({n},) int64)")
        if token is not None and (head.mark is None or head.mark["token"] != token):
            raise CorruptFileError(f"{path}: the id map comes from another write than its store (token mismatch)")
        f.seek(head.offset)
        new_of_old = np.fromfile(f, dtype="<i8", count=n).astype(np.int64, copy=False)
    if new_of_old.shape != (n,):
        raise CorruptFileError(f"{path}: the id map is truncated")
    if crc32c.crc32c(new_of_old.tobytes()) != meta["id_map"]["crc32c"]:
        raise CorruptFileError(f"{path}: the id map fails its checksum")
    seen = np.zeros(n, np.bool_)
    if n and (new_of_old.min() < 0 or new_of_old.max() >= n):
        raise CorruptFileError(f"{path}: the id map is not a permutation of the rows (a row out of range)")
    seen[new_of_old] = True
    if not seen.all():
        raise CorruptFileError(f"{path}: the id map is not a permutation of the rows (a row appears twice)")
    return new_of_old


def raw_layout(path: os.PathLike[str] | str, dtype: torch.dtype, shape: Sequence[int], offset: int = 0) -> Layout:
    """The :class:`Layout` of raw row-major bytes: ``shape`` rows of ``dtype`` from byte ``offset``.

    Raises
    ------
    TypeError, ValueError
        A dtype a disk store does not hold, a shape that is not non-negative integers, or a bad offset.
    CorruptFileError
        Not a regular file, or shorter than ``offset`` plus the table.
    """
    path = Path(path)
    if not isinstance(dtype, torch.dtype) or dtype not in TORCH_DTYPES.values():
        raise TypeError(f"dtype must be one of {sorted(TORCH_DTYPES)} as a torch.dtype, not {dtype!r}")
    if not isinstance(shape, (tuple, list)):
        raise ValueError(f"shape must be a tuple of non-negative integers, rows first, got {shape!r}")
    shape = tuple(shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in shape):
        raise ValueError(f"shape must be non-negative integers, rows first, got {shape!r}")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    shape, offset = tuple(int(s) for s in shape), int(offset)
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
    want = offset + math.prod(shape) * torch.empty(0, dtype=dtype).element_size()  # exact: no wrap at 2**63
    if st.st_size < want:
        raise CorruptFileError(f"{path}: {st.st_size} bytes, but {shape} {dtype} rows from offset {offset} need "
                               f"{want}")
    return Layout(path, dtype, shape, offset, st.st_size, None, None, st.st_dev, st.st_ino)


def same_file(a: os.PathLike[str] | str, b: os.PathLike[str] | str) -> bool:
    """Whether two paths name one file (links followed); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def verify(path: os.PathLike[str] | str, *, progress: bool = True) -> dict[str, Any]:
    """Check every chunk of a disk store against its sidecar's CRC32C.

    Returns
    -------
    dict
        ``{"path", "chunks", "bad_chunks": [(index, first byte, last byte)], "bytes"}``;
        ``bad_chunks`` is empty when every chunk matches.

    Raises
    ------
    CorruptFileError
        No sidecar, or anything :func:`read_layout` refuses.
    """
    crc32c = require("crc32c")
    for attempt in range(OPEN_ATTEMPTS):
        layout = read_layout(path)
        if layout.sidecar is None:
            raise CorruptFileError(f"{path}: no sidecar ({sidecar_path(layout.path).name}); nothing to verify "
                                   "against. Write the store with directload (write_disk_store, or `directload "
                                   "dataset convert --to disk`)")
        try:
            f = open_regular(layout.path)
        except FileNotFoundError:
            if attempt + 1 < OPEN_ATTEMPTS:
                continue  # a writer replaced the generation meanwhile
            raise
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != (layout.device, layout.inode):
                continue
            return _verify_open(f, layout, path, progress, crc32c)
    raise CorruptFileError(f"{path}: the store kept changing while it was being verified")


def _verify_open(f, layout, path, progress, crc32c):
    meta = layout.sidecar
    chunk, sums = meta["chunk_bytes"], meta["chunks"]
    data_bytes = layout.file_bytes - layout.data_offset
    bad = []
    with tqdm(total=data_bytes, unit="B", unit_scale=True, disable=not progress,
              desc=f"verifying {Path(path).name}") as bar:
        f.seek(layout.data_offset)
        for i, want in enumerate(sums):
            data = f.read(chunk)
            if crc32c.crc32c(data) != want:
                start = layout.data_offset + i * chunk
                bad.append((i, start, start + len(data) - 1))
            bar.update(len(data))
    return {"path": str(path), "chunks": len(sums), "bad_chunks": bad, "bytes": data_bytes}
