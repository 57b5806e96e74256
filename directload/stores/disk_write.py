"""Writing a disk store: stream a table into a new generation of the store, crash-consistently."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from tqdm.auto import tqdm

from directload.capabilities import require
from directload.codecs import Codec, CodecError, codec
from directload.npy import header_bytes, make_mark
from directload.units import dtype_name

from . import disk_format as fmt
from .disk_format import CHUNK_BYTES, DATA_ALIGN, TORCH_DTYPES, VERSION, read_layout, same_file, sidecar_crc
from .generations import FORMAT, StoreWrite

__all__ = ["write_disk_store", "check_chunk_bytes"]

_codec = codec  # write_disk_store's parameter of that name shadows it


def check_chunk_bytes(value: int) -> int:
    """``value`` when it is an integer number of bytes from 1 to 2**40, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= 1 << 40:
        raise ValueError(f"chunk_bytes must be a positive integer number of bytes (at most 2**40), got {value!r}")
    return int(value)


def _writable_dtype(np_dtype):
    """The torch dtype a disk store of ``np_dtype`` rows reads back as, or ``TypeError``."""
    try:
        dtype = torch.from_numpy(np.empty(0, np_dtype)).dtype
    except (TypeError, ValueError):  # no torch dtype, or not this machine's byte order
        dtype = None
    if dtype not in TORCH_DTYPES.values() or np_dtype.byteorder == ">":
        raise TypeError(f"{np_dtype} rows cannot be written to a disk store (it takes "
                        f"{', '.join(sorted(TORCH_DTYPES))}, little-endian)")
    return dtype


class _Source:
    """The rows to write: ``shape`` and numpy ``np_dtype`` (bfloat16 as ``<u2`` bits), the torch ``dtype``
    they read back as, and two ways to read them: ``rows(start, stop)`` in order and ``take(ids)`` by
    sorted ids, each a ``[k, row_elems]`` numpy array."""

    def __init__(self, shape, np_dtype, dtype, what, *, array=None, fetch=None, close=None, in_order=None):
        self.shape, self.np_dtype, self.dtype, self.what = tuple(int(s) for s in shape), np.dtype(np_dtype), dtype, what
        self.row_elems = math.prod(self.shape[1:])
        self._flat = None if array is None else array.reshape(self.shape[0], self.row_elems)
        self._fetch, self._close, self._in_order = fetch, close, in_order

    def rows(self, start, stop):
        if self._in_order is not None:
            return self._in_order(start, stop)
        return self._flat[start:stop] if self._flat is not None else self.take(np.arange(start, stop))

    def take(self, ids):
        if self._fetch is None:
            return self._flat[ids]
        return np.asarray(self._fetch(ids)).view(self.np_dtype).reshape(len(ids), self.row_elems)

    def close(self):
        if self._close is not None:
            self._close()


def _encoding(source: _Source, chosen: Codec) -> _Source:
    """``source``'s rows as ``chosen``'s code rows, encoded as they are read (so never all in memory)."""
    if len(source.shape) != 2 or not source.dtype.is_floating_point:
        raise CodecError(f"{chosen.name} encodes a 2-D table of floats, got {source.dtype} of shape {source.shape}")
    rows, dim = source.shape
    code_shape = chosen.code_shape(rows, dim)
    np_codes = {torch.uint8: np.dtype(np.uint8), torch.float16: np.dtype("<f2"), torch.bfloat16: np.dtype("<u2")}

    def floats(part):
        # a chunk of a read-only mapping is copied (torch warns of tensors over memory it may not write)
        part = np.require(part, requirements=("C", "W"))
        if source.dtype is torch.bfloat16:  # its <u2 bits
            return torch.from_numpy(part.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(part)

    def codes(part, first_row):
        t = chosen.encode_rows(floats(part), first_row=first_row)
        return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().view(np_codes[chosen.code_dtype])

    def fetch(ids):
        ids = np.asarray(ids, np.int64)
        return codes(source.take(ids), 0) if ids.size else np.empty((0, code_shape[1]), np_codes[chosen.code_dtype])

    return _Source(code_shape, np_codes[chosen.code_dtype], chosen.code_dtype, f"{chosen.name} codes of {source.what}",
                   fetch=fetch, close=source.close,
                   in_order=lambda start, stop: codes(source.rows(start, stop), start))  # errors name the row


def _array_source(array, dtype, what):
    return _Source(array.shape, array.dtype, dtype, what, array=array)


def _source(src):
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        layout = read_layout(path)  # every check of the reader; a store's link followed to its generation
        bf16 = layout.dtype is torch.bfloat16
        np_dtype = np.dtype("<u2") if bf16 else torch.empty(0, dtype=layout.dtype).numpy().dtype
        dtype = layout.dtype if bf16 else _writable_dtype(np_dtype)
        if layout.packed:  # its file holds the rows in hot order: read them by id through its id map
            from .disk import DiskStore

            store = DiskStore(path)

            def fetch(ids):
                rows = store.read(torch.from_numpy(np.asarray(ids, np.int64)))
                return rows.view(torch.uint8).reshape(len(ids), store.row_nbytes).numpy()

            return _Source(layout.shape, np_dtype, dtype, str(path), fetch=fetch, close=store.close)
        if math.prod(layout.shape):
            array = np.memmap(layout.path, dtype=np_dtype, mode="r", offset=layout.data_offset, shape=layout.shape)
        else:
            array = np.empty(layout.shape, np_dtype)
        return _array_source(array, dtype, str(path))
    if isinstance(src, torch.Tensor):
        if src.is_complex() or src.dtype not in TORCH_DTYPES.values():
            raise TypeError(f"{src.dtype} tables cannot be written to a disk store")
        t = src.detach()
        if t.is_cuda:
            t = t.cpu()
        if t.dim() < 1:
            raise ValueError("a feature table needs at least one dimension (the row)")
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, as <u2 (torch 2.2 has no uint16)
            return _array_source(t.contiguous().view(torch.int16).numpy().view(np.uint16), src.dtype, "tensor")
        return _array_source(t.contiguous().numpy(), src.dtype, "tensor")
    if isinstance(src, np.ndarray):
        if src.ndim < 1:
            raise ValueError("a feature table needs at least one dimension (the row)")
        return _array_source(src, _writable_dtype(src.dtype), "array")
    feat = getattr(src, "feat", None)
    if feat is not None:  # a directload.datasets Dataset (OGB's layout)
        return _source(feat.check_backing() if hasattr(feat, "check_backing") else feat)
    raise TypeError(f"write_disk_store takes a .npy path, a numpy array, a tensor or a dataset, not "
                    f"{type(src).__name__}")


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


def write_disk_store(src: object, path: os.PathLike[str] | str, *, overwrite: bool = False, progress: bool = True,
                     chunk_bytes: int = CHUNK_BYTES, order: npt.ArrayLike | None = None,
                     fetch: Callable[[np.ndarray], npt.ArrayLike] | None = None,
                     codec: str | Codec | None = None) -> Path:
    """Write a feature table as a disk store (``.npy`` plus sidecar), streaming, with a progress bar.

    The write is crash-consistent (:mod:`directload.stores.generations`): the new rows, sidecar and id
    map are written and synced as a new generation, then published by one atomic rename, so a reader, or
    the machine after a crash or ``kill -9`` at any instant, sees the old store complete or the new one
    complete.  What a killed write left behind is removed by the next write of the store.

    Parameters
    ----------
    src : str, os.PathLike, numpy.ndarray, torch.Tensor or Dataset
        A ``.npy`` file or disk store (memory-mapped and streamed, so it may exceed host memory; a
        packed store's rows are read by their ids), an array or tensor (bfloat16 included), or a loaded
        :mod:`directload.datasets` dataset (its node features).  At least 1-D.
    path : str or os.PathLike
        The store to write: a link to its current generation, whose sidecar and id map lie beside it.
    overwrite : bool
        Replace a disk store that directload wrote before.  Anything else at ``path`` is never
        overwritten.
    chunk_bytes : int
        Bytes per checksummed chunk (default 4 MiB).
    order : array of int, optional
        A permutation of the rows: row ``k`` of the new store is row ``order[k]`` of ``src`` (Sentinel's
        packing: hot rows first, so they share blocks).  The id map (old id -> new row) is written next
        to the rows, its CRC32C in the sidecar, and a :class:`~directload.stores.DiskStore` opened on the
        store applies it: reads keep the old ids.
    fetch : callable, optional
        With ``order``: ``fetch(ids) -> rows`` (a numpy array) reads the source's rows; default
        fancy indexing of ``src`` (fine in memory; a disk store's ``read`` is far faster than a cold
        memory map).
    codec : str or Codec, optional
        Encode the rows as this codec's code rows (:mod:`directload.codecs`) as they stream; the sidecar names
        it.  A ``src`` that is a disk store of codes is copied as the same codes (renumbered with ``order``),
        its codec carried over: leave ``codec`` out.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is False, or it is not a store directload wrote.
    ValueError
        ``src`` and ``path`` are one file, a bad ``chunk_bytes``, or an ``order`` that is not a
        permutation.
    directload.codecs.CodecError
        (A ``ValueError``.)  An unknown codec, a ``src`` that is not a 2-D float table or is encoded already,
        or a value the codec cannot encode (NaN, an infinity; naming the row).  Nothing of the new store
        remains.
    TypeError
        Rows a disk store cannot hold (complex, object, big-endian...).
    OSError
        The disk is full, a file-size limit, ...: the old store is left as it was, and nothing of the
        new one remains.

    Examples
    --------
    >>> import tempfile, torch
    >>> from directload.stores import DiskStore
    >>> path = write_disk_store(torch.arange(6.0).view(3, 2), tempfile.mkdtemp() + "/f.npy", progress=False)
    >>> DiskStore(path).read([2, 0]).tolist()
    [[4.0, 5.0], [0.0, 1.0]]
    """
    crc32c = require("crc32c")
    path = Path(path)
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    if isinstance(src, (str, os.PathLike)) and same_file(src, path):
        raise ValueError(f"{path}: cannot convert a file onto itself; write the store to another path")
    chosen = None if codec is None else _codec(codec)
    held = read_layout(src).codec if isinstance(src, (str, os.PathLike)) else None  # a copy of codes stays codes
    if chosen is not None and held is not None:
        raise CodecError(f"{src} holds {held} codes already: write it without codec=")
    source = _source(src)
    try:
        if chosen is not None:
            source = _encoding(source, chosen)
        named = chosen.name if chosen is not None else held
        n = source.shape[0]
        id_map = None if order is None else _inverse_permutation(order, n)
        take = source.take if fetch is None else (
            lambda ids: np.asarray(fetch(ids)).view(source.np_dtype).reshape(len(ids), source.row_elems))
        with StoreWrite(path, overwrite=overwrite) as w:
            header = header_bytes(source.np_dtype, source.shape, align=DATA_ALIGN,
                                  mark=make_mark(w.token, id_map is not None))
            with w.create("data") as f:
                f.write(header)
                chunks = _write_rows(f, source, order, take, chunk_bytes, crc32c, progress, path.name, w.step)
                size = f.tell()
            meta = {"format": FORMAT, "version": VERSION if named is None else fmt.CODEC_VERSION,
                    "generation": w.generation, "token": w.token,
                    "data": w.data_name, "dtype": dtype_name(source.dtype),
                    "npy_descr": np.lib.format.dtype_to_descr(source.np_dtype), "shape": list(source.shape),
                    "data_offset": len(header), "file_bytes": size, "chunk_bytes": chunk_bytes,
                    "checksum": "crc32c", "chunks": chunks, "source": source.what}
            if named is not None:
                meta["codec"] = named
            if id_map is not None:
                with w.create("map") as f:
                    f.write(header_bytes(np.dtype("<i8"), id_map.shape, mark=make_mark(w.token, False)))
                    f.write(memoryview(id_map.astype("<i8", copy=False)).cast("B"))
                meta["id_map"] = {"file": w.final_path("map").name, "rows": n,
                                  "crc32c": crc32c.crc32c(id_map.tobytes())}
            meta["sidecar_crc32c"] = sidecar_crc(meta)
            with w.create("sidecar", "w") as f:
                json.dump(meta, f)
            w.commit()
    finally:
        source.close()
    return path


def _write_rows(f, source, order, take, chunk_bytes, crc32c, progress, name, step):
    """Stream the rows into ``f`` (in ``order`` through ``take``, else in order) and return the CRC32C of
    each ``chunk_bytes`` piece of the data."""
    n, row_elems = source.shape[0], source.row_elems
    row_nbytes = row_elems * source.np_dtype.itemsize
    chunks = []
    with tqdm(total=n * row_nbytes, unit="B", unit_scale=True, disable=not progress, desc=f"writing {name}") as bar:
        per = max(1, chunk_bytes // max(row_nbytes, 1))  # rows per chunk written
        crc = filled = 0  # the checksum of the chunk being filled, and its bytes so far
        for start in range(0, n, per):
            stop = min(n, start + per)
            if order is None:
                part = source.rows(start, stop)
            else:  # read in file order (sorted ids), then put in the new order
                idx = np.asarray(order[start:stop], np.int64)
                srt = np.argsort(idx, kind="stable")
                part = np.empty((idx.shape[0], row_elems), source.np_dtype)
                part[srt] = take(idx[srt])
            block = memoryview(np.ascontiguousarray(part).view(np.uint8).reshape(-1))
            f.write(block)
            # checksums over fixed chunk_bytes pieces of the data, whatever the row size
            pos = 0
            while pos < len(block):
                take_n = min(chunk_bytes - filled, len(block) - pos)
                crc = crc32c.crc32c(block[pos:pos + take_n], crc)
                pos, filled = pos + take_n, filled + take_n
                if filled == chunk_bytes:
                    chunks.append(crc)
                    crc = filled = 0
            bar.update(len(block))
            step("rows")
        if filled:
            chunks.append(crc)
    return chunks
