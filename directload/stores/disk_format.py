"""The disk store's file: a standard ``.npy`` whose rows start on a 4 KiB boundary, plus a checksummed sidecar.

``feat.npy`` stays an ordinary ``.npy`` file: ``np.load(path, mmap_mode="r")``
and OGB's tooling read it as they read any other.  Its header is padded with
spaces (which the format allows) so that the data starts at 4096 bytes, the
largest logical block size of common disks, so an O_DIRECT read of a row never
needs a block from the header.  Next to it, ``feat.npy.dlstore.json`` records
the layout (dtype, shape, data offset, file size) and a CRC32C per 4 MiB chunk
of the data, which :func:`verify` checks.  bfloat16, which numpy lacks, is
stored as ``<u2`` bits and named ``bfloat16`` in the sidecar.
"""

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from directload.capabilities import require
from directload.files import CorruptFileError, npy_layout

__all__ = ["DATA_ALIGN", "SIDECAR_SUFFIX", "Layout", "raw_layout", "read_layout", "sidecar_path", "verify",
           "id_map_path", "read_id_map",
           "write_disk_store"]

DATA_ALIGN = 4096
CHUNK_BYTES = 4 << 20
SIDECAR_SUFFIX = ".dlstore.json"
FORMAT = "directload-disk-store"
VERSION = 1

_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


def sidecar_path(path):
    """The sidecar of the store at ``path``."""
    return Path(str(path) + SIDECAR_SUFFIX)


@dataclass(frozen=True)
class Layout:
    """Where a store's rows are: what :class:`~directload.stores.DiskStore` needs to read them."""

    path: Path
    dtype: torch.dtype
    shape: tuple
    data_offset: int
    file_bytes: int
    sidecar: dict = None

    @property
    def row_nbytes(self):
        return int(np.prod(self.shape[1:], dtype=np.int64)) * torch.empty(0, dtype=self.dtype).element_size()


def _torch_dtype(np_dtype, path):
    if np_dtype.byteorder == ">" or (np_dtype.byteorder == "=" and np.little_endian is False):
        raise CorruptFileError(f"{path}: big-endian data cannot be read as rows on this machine")
    try:
        return torch.from_numpy(np.empty(0, np_dtype)).dtype
    except TypeError as exc:
        raise CorruptFileError(f"{path}: {np_dtype} rows are not supported ({exc})") from None


def read_layout(path):
    """The :class:`Layout` of a ``.npy`` file, checked against its sidecar when it has one.

    Raises
    ------
    FileNotFoundError
        No such file.
    CorruptFileError
        A bad or truncated ``.npy`` file, a 0-d array, or a sidecar that is
        unreadable or disagrees with the file (dtype, shape, data offset or
        size).
    """
    path = Path(path)
    np_dtype, shape, offset = npy_layout(path)
    if len(shape) < 1:
        raise CorruptFileError(f"{path}: a 0-d array has no rows")
    size = path.stat().st_size
    side = sidecar_path(path)
    meta = None
    dtype = None
    if side.exists():
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptFileError(f"{side}: unreadable sidecar ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CorruptFileError(f"{side}: not a directload disk-store sidecar")
        if meta.get("version") != VERSION:
            raise CorruptFileError(f"{side}: sidecar version {meta.get('version')!r}; this directload reads "
                                   f"version {VERSION}")
        dtype = _TORCH_DTYPES.get(meta.get("dtype"))
        want = {"npy_descr": np.lib.format.dtype_to_descr(np_dtype), "shape": list(shape), "data_offset": offset,
                "file_bytes": size}
        for key, value in want.items():
            if meta.get(key) != value:
                raise CorruptFileError(f"{path}: the sidecar says {key} = {meta.get(key)!r} but the file has "
                                       f"{value!r}; the file was changed after it was written")
        if dtype is None or (dtype is not torch.bfloat16 and dtype != _torch_dtype(np_dtype, path)):
            raise CorruptFileError(f"{side}: dtype {meta.get('dtype')!r} does not match the file's {np_dtype}")
    if dtype is None:
        dtype = _torch_dtype(np_dtype, path)
    return Layout(path, dtype, tuple(int(s) for s in shape), int(offset), int(size), meta)


def raw_layout(path, dtype, shape, offset=0):
    """The :class:`Layout` of raw row-major bytes: ``shape`` rows of ``dtype`` from byte ``offset``.

    Raises
    ------
    CorruptFileError
        The file is shorter than ``offset`` plus the table.
    """
    path = Path(path)
    if not isinstance(dtype, torch.dtype) or dtype not in _TORCH_DTYPES.values():
        raise TypeError(f"dtype must be one of {sorted(_TORCH_DTYPES)} as a torch.dtype, not {dtype!r}")
    shape = tuple(shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in shape):
        raise ValueError(f"shape must be non-negative integers, rows first, got {shape!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    size = path.stat().st_size
    want = offset + int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
    if size < want:
        raise CorruptFileError(f"{path}: {size} bytes, but {shape} {dtype} rows from offset {offset} need {want}")
    return Layout(path, dtype, tuple(int(s) for s in shape), offset, size, None)


def _header(np_dtype, shape):
    """A version-1.0 ``.npy`` header padded so the data starts at :data:`DATA_ALIGN`."""
    text = repr({"descr": np.lib.format.dtype_to_descr(np_dtype), "fortran_order": False, "shape": tuple(shape)})
    head = len(np.lib.format.MAGIC_PREFIX) + 2 + 2  # magic, version, header length
    total = -(-(head + len(text) + 1) // DATA_ALIGN) * DATA_ALIGN
    if total - head > 0xFFFF:
        raise ValueError(f"the array's shape is too long for a .npy header: {shape}")
    text = text + " " * (total - head - len(text) - 1) + "\n"
    return np.lib.format.MAGIC_PREFIX + bytes([1, 0]) + (total - head).to_bytes(2, "little") + text.encode("latin1")


def _writable_dtype(np_dtype):
    """The torch dtype a disk store of ``np_dtype`` rows reads back as, or ``TypeError``."""
    try:
        dtype = torch.from_numpy(np.empty(0, np_dtype)).dtype
    except (TypeError, ValueError):  # no torch dtype, or not this machine's byte order
        dtype = None
    if dtype not in _TORCH_DTYPES.values() or np_dtype.byteorder == ">":
        raise TypeError(f"{np_dtype} rows cannot be written to a disk store (it takes "
                        f"{', '.join(sorted(_TORCH_DTYPES))}, little-endian)")
    return dtype


def _source(src):
    """``(numpy array to stream from, torch dtype, description)``."""
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        np_dtype, shape, offset = npy_layout(path)
        side = read_layout(path).dtype if sidecar_path(path).exists() else None
        # a bfloat16 store keeps its bits as <u2 and says bfloat16 in its sidecar
        dtype = side if side is torch.bfloat16 else _writable_dtype(np_dtype)
        array = np.memmap(path, dtype=np_dtype, mode="r", offset=offset, shape=shape) if np.prod(shape) else \
            np.empty(shape, np_dtype)
        return array, dtype, str(path)
    if isinstance(src, torch.Tensor):
        if src.is_complex() or src.dtype not in _TORCH_DTYPES.values():
            raise TypeError(f"{src.dtype} tables cannot be written to a disk store")
        t = src.detach()
        if t.is_cuda:
            t = t.cpu()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, as <u2 (torch 2.2 has no uint16)
            return t.contiguous().view(torch.int16).numpy().view(np.uint16), src.dtype, "tensor"
        return t.contiguous().numpy(), src.dtype, "tensor"
    if isinstance(src, np.ndarray):
        return src, _writable_dtype(src.dtype), "array"
    feat = getattr(src, "feat", None)
    if feat is not None:  # a directload.datasets Dataset (OGB's layout)
        return _source(feat.check_backing() if hasattr(feat, "check_backing") else feat)
    raise TypeError(f"write_disk_store takes a .npy path, a numpy array, a tensor or a dataset, not "
                    f"{type(src).__name__}")


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_disk_store(src, path, *, overwrite=False, progress=True, chunk_bytes=CHUNK_BYTES, order=None,
                     fetch=None):
    """Write a feature table as a disk store (``.npy`` plus sidecar), streaming, with a progress bar.

    Parameters
    ----------
    src : str, os.PathLike, numpy.ndarray, torch.Tensor or Dataset
        A ``.npy`` file (memory-mapped and streamed, so it may exceed host
        memory), an array or tensor (bfloat16 included), or a loaded
        :mod:`directload.datasets` dataset (its node features).  At least 1-D.
    path : str or os.PathLike
        The ``.npy`` file to write; its sidecar goes next to it.
    overwrite : bool
        Replace a disk store that directload wrote before.  A file without a
        directload sidecar is never overwritten.
    chunk_bytes : int
        Bytes per checksummed chunk (default 4 MiB).
    order : array of int, optional
        A permutation of the rows: row ``k`` of the new store is row ``order[k]`` of ``src`` (Sentinel's
        packing: hot rows first, so they share blocks).  The id map (old id -> new row) is written next
        to the file (``<path>.dlmap.npy``, its CRC32C in the sidecar), and a
        :class:`~directload.stores.DiskStore` opened on the file applies it: reads keep the old ids.
    fetch : callable, optional
        With ``order``: ``fetch(ids) -> rows`` (a numpy array) reads the source's rows; default
        fancy indexing of ``src`` (fine in memory; a disk store's ``read`` is far faster than a cold
        memory map).

    Returns
    -------
    pathlib.Path
        ``path``.  The file and sidecar appear complete or not at all.
    """
    crc32c = require("crc32c")
    path = Path(path)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    if isinstance(src, (str, os.PathLike)) and _same_file(src, path):
        raise ValueError(f"{path}: cannot convert a file onto itself; write the store to another path")
    array, dtype, what = _source(src)
    if array.ndim < 1:
        raise ValueError("a feature table needs at least one dimension (the row)")
    if path.exists() or sidecar_path(path).exists():
        if not overwrite:
            raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace a store "
                                  "directload wrote")
        if not sidecar_path(path).exists() or not _ours(sidecar_path(path)):
            raise FileExistsError(f"{path} was not written by directload (no disk-store sidecar); not "
                                  "overwriting it")
    replacing = path.exists()  # (overwrite=True of a store directload wrote: checked above)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = _header(array.dtype, array.shape)
    rows = array.reshape(array.shape[0], int(np.prod(array.shape[1:], dtype=np.int64)))
    id_map = None if order is None else _inverse_permutation(order, rows.shape[0])
    if order is not None:
        fetch = fetch or (lambda idx: rows[idx])
    row_nbytes = rows.shape[1] * array.dtype.itemsize
    data_bytes = int(array.size) * array.dtype.itemsize
    chunks = []
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f, tqdm(total=data_bytes, unit="B", unit_scale=True, disable=not progress,
                                            desc=f"writing {path.name}") as bar:
            f.write(header)
            step = max(1, chunk_bytes // max(row_nbytes, 1))
            crc = filled = 0  # the checksum of the chunk being filled, and its bytes so far
            for start in range(0, rows.shape[0], step):
                if order is None:
                    part = rows[start:start + step]
                else:  # read in file order (sorted ids), then put in the new order
                    idx = np.asarray(order[start:start + step], np.int64)
                    srt = np.argsort(idx, kind="stable")
                    part = np.empty((idx.shape[0], rows.shape[1]), rows.dtype)
                    part[srt] = np.asarray(fetch(idx[srt])).view(rows.dtype).reshape(idx.shape[0], rows.shape[1])
                block = memoryview(np.ascontiguousarray(part).view(np.uint8).reshape(-1))
                f.write(block)
                # checksums over fixed chunk_bytes pieces of the data, whatever the row size
                pos = 0
                while pos < len(block):
                    take = min(chunk_bytes - filled, len(block) - pos)
                    crc = crc32c.crc32c(block[pos:pos + take], crc)
                    pos, filled = pos + take, filled + take
                    if filled == chunk_bytes:
                        chunks.append(crc)
                        crc = filled = 0
                bar.update(len(block))
            if filled:
                chunks.append(crc)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        meta = {"format": FORMAT, "version": VERSION, "dtype": str(dtype).removeprefix("torch."),
                "npy_descr": np.lib.format.dtype_to_descr(array.dtype), "shape": list(array.shape),
                "data_offset": len(header), "file_bytes": size, "chunk_bytes": chunk_bytes, "checksum": "crc32c",
                "chunks": chunks, "source": what}
        if id_map is not None:
            map_path = id_map_path(path)
            fd3, tmp_map = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".map.partial")
            with os.fdopen(fd3, "wb") as f:
                np.save(f, id_map)
                f.flush()
                os.fsync(f.fileno())
            meta["id_map"] = {"file": map_path.name, "rows": int(id_map.shape[0]),
                              "crc32c": crc32c.crc32c(id_map.tobytes())}

        fd2, tmp_side = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".json.partial")
        with os.fdopen(fd2, "w", encoding="utf-8") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if id_map is not None:
            os.replace(tmp_map, id_map_path(path))
        os.replace(tmp_side, sidecar_path(path))
        if id_map is None and replacing:
            id_map_path(path).unlink(missing_ok=True)  # the replaced store's own map (we wrote it)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        if "tmp_map" in locals():
            Path(tmp_map).unlink(missing_ok=True)
        if "tmp_side" in locals():
            Path(tmp_side).unlink(missing_ok=True)
        raise
    return path


def id_map_path(path):
    """Where the id map of a renumbered store lives (next to the file)."""
    return Path(str(path) + ".dlmap.npy")


def _inverse_permutation(order, n):
    """``new_of_old`` for ``order`` (new row k = old row order[k]), or ``ValueError`` if ``order`` is not a
    permutation of ``range(n)``."""
    order = np.asarray(order)
    if order.shape != (n,) or order.dtype.kind not in "iu":
        raise ValueError(f"order must be a permutation of the {n} rows (1-D integers), got {order.dtype} "
                         f"{order.shape}")
    order = order.astype(np.int64, copy=False)
    if n and (order.min() < 0 or order.max() >= n):
        raise ValueError("order must be a permutation of the rows: an id is out of range")
    new_of_old = np.full(n, -1, np.int64)
    new_of_old[order] = np.arange(n, dtype=np.int64)
    if (new_of_old < 0).any():
        raise ValueError("order must be a permutation of the rows: some row appears twice")
    return new_of_old


def read_id_map(layout):
    """The id map (old id -> row in the file) of a renumbered store, checked, or None.

    Raises
    ------
    CorruptFileError
        The sidecar names a map that is missing, of the wrong length, fails its CRC32C, or is not a
        permutation.
    """
    meta = (layout.sidecar or {}).get("id_map")
    if meta is None:
        return None
    crc32c = require("crc32c")
    path = id_map_path(layout.path)
    try:
        new_of_old = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CorruptFileError(f"{path}: the store's id map is unreadable ({exc})") from None
    n = layout.shape[0]
    if new_of_old.shape != (n,) or new_of_old.dtype != np.int64 or meta.get("rows") != n:
        raise CorruptFileError(f"{path}: an id map of {new_of_old.shape} {new_of_old.dtype} for {n} rows")
    if crc32c.crc32c(new_of_old.tobytes()) != meta.get("crc32c"):
        raise CorruptFileError(f"{path}: the id map fails its checksum")
    try:
        _inverse_permutation(new_of_old, n)
    except ValueError:
        raise CorruptFileError(f"{path}: the id map is not a permutation of the rows") from None
    return new_of_old


def _ours(side):
    try:
        return json.loads(side.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def verify(path, *, progress=True):
    """Check every chunk of a disk store against its sidecar's CRC32C.

    Returns
    -------
    dict
        ``{"path", "chunks", "bad_chunks": [(index, first byte, last byte)], "bytes"}``;
        ``bad_chunks`` is empty when every chunk matches.

    Raises
    ------
    CorruptFileError
        No sidecar, or a layout mismatch (see :func:`read_layout`).
    """
    crc32c = require("crc32c")
    layout = read_layout(path)
    meta = layout.sidecar
    if meta is None:
        raise CorruptFileError(f"{path}: no sidecar ({sidecar_path(path).name}); nothing to verify against. "
                               "Write the store with directload (write_disk_store, or `directload dataset "
                               "convert --to disk`)")
    chunk, sums = int(meta["chunk_bytes"]), meta["chunks"]
    data_bytes = layout.file_bytes - layout.data_offset
    if len(sums) != -(-data_bytes // chunk):
        raise CorruptFileError(f"{sidecar_path(path)}: {len(sums)} checksums for {data_bytes} bytes in "
                               f"{chunk}-byte chunks")
    bad = []
    with open(path, "rb") as f, tqdm(total=data_bytes, unit="B", unit_scale=True, disable=not progress,
                                     desc=f"verifying {Path(path).name}") as bar:
        f.seek(layout.data_offset)
        for i, want in enumerate(sums):
            data = f.read(chunk)
            if crc32c.crc32c(data) != want:
                start = layout.data_offset + i * chunk
                bad.append((i, start, start + len(data) - 1))
            bar.update(len(data))
    return {"path": str(path), "chunks": len(sums), "bad_chunks": bad, "bytes": data_bytes}
