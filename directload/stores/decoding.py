"""``DecodingStore``: decoded rows over a stack of stores that carry codes.

Every tier under it (a disk store, the host and GPU caches, a tiered or partitioned store, a row exchange) moves
and holds the codes as its rows, so each carries 2x (float16, bfloat16) to 3.7x (int8 at 100 features) the rows
per byte, and a cache's capacity counts encoded bytes.  Only the last hop decodes: a read gathers code rows
through the stack onto the result's device (a GPU result crosses PCIe as codes) and decodes them there: on the
CPU by the decoding gather's kernel over the code rows in order, on a GPU by the reference decode
(:meth:`directload.codecs.Codec.decode`), bit for bit the same.  Over a store of codes in memory, a
:class:`~directload.stores.TensorStore` of an :class:`~directload.codecs.EncodedTable` decodes inside the
gather itself instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from directload.codecs import DECODED_DTYPES, Codec, CodecError, EncodedTable
from directload.codecs import codec as find_codec
from directload.kernels import gather

from .base import FeatureStore
from .futures import ReadFuture
from .reads import deliver
from .wrapper import WrapperStore

if TYPE_CHECKING:
    from .reads import Ids

__all__ = ["DecodingStore"]


class DecodingStore(WrapperStore[FeatureStore]):
    """Rows decoded from ``inner``'s code rows, in ``dtype``.

    Parameters
    ----------
    inner : FeatureStore
        A store whose rows are ``codec``'s code rows: 1-D rows of :attr:`~directload.codecs.Codec.code_dtype`
        (a :class:`~directload.stores.DiskStore` written with ``codec=``, and any cache or tier over one).
    codec : str or Codec
        The codes' codec.
    dtype : torch.dtype
        What reads return: float32 (the default), float16 or bfloat16.
    own : bool
        Close ``inner`` with this store.

    Raises
    ------
    CodecError
        ``inner``'s rows are not ``codec``'s codes (another dtype, or not 1-D, or too short), or ``dtype`` is
        not one a decode writes; before any read.

    Examples
    --------
    >>> import torch
    >>> from directload.codecs import encode
    >>> from directload.stores import HostCache, TensorStore
    >>> codes = encode(torch.tensor([[0.0, 1.0], [2.0, 4.0], [5.0, 5.0]]), "int8").codes
    >>> store = DecodingStore(HostCache(TensorStore(codes), capacity_bytes=20), "int8")  # caches 2 code rows
    >>> store.shape, store.dtype, store.read([1, 2]).tolist()
    ((3, 2), torch.float32, [[2.0, 4.0], [5.0, 5.0]])
    """

    tier = "decode"

    def __init__(self, inner: FeatureStore, codec: str | Codec, *, dtype: torch.dtype = torch.float32,
                 own: bool = False) -> None:
        chosen = find_codec(codec)
        super().__init__(inner, own=own)
        if inner.dtype != chosen.code_dtype or len(inner.row_shape) != 1:
            raise CodecError(f"{inner!r} does not hold {chosen.name} codes: they are 1-D rows of "
                             f"{chosen.code_dtype}")
        if dtype not in DECODED_DTYPES:
            raise CodecError(f"a decode writes float32, float16 or bfloat16, not {dtype}")
        self.codec = chosen
        self._dim = chosen.dim_of(inner.row_shape[0])
        self._dtype = dtype

    @property
    def row_shape(self) -> tuple[int, ...]:
        return (self._dim,)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def capabilities(self) -> frozenset[str]:
        """``"warm"`` where ``inner`` declares it (its caches of codes are warmed), besides the wrapper's own."""
        return super().capabilities | (self.inner.capabilities & {"warm"})

    def warm(self, ids: Ids | None = None, *, background: bool = False,
             progress: bool = False) -> int | dict[str, int]:
        """Warm ``inner``'s caches of code rows with ``ids`` (default its hot ids): the ids are the same."""
        self.check_open()
        self.inner.check_capability("warm")
        return self.inner.warm(ids, background=background, progress=progress)

    @property
    def encoded_row_nbytes(self) -> int:
        """Bytes of one code row: what every tier under this store moves and holds per row."""
        return self.inner.row_nbytes

    def _read_async(self, index, out, run_device, out_device):
        codes = self.inner.read_async(index, device=out_device)

        def decoded():
            return deliver(self._decode(codes.wait(), out), out, out_device)

        return ReadFuture(decoded, done=codes.done)

    def _decode(self, codes: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """``codes`` decoded: on the CPU by the decoding gather's kernel over them in order (every row once, on
        torch's threads; 2.5x the reference decode's speed for int8), straight into ``out`` where it fits, so
        bit for bit the reference decode, which runs elsewhere."""
        if codes.device.type != "cpu" or not len(codes) or not codes.is_contiguous():
            return self.codec.decode(codes, self._dtype)
        fits = out is not None and out.device.type == "cpu" and out.dtype == self._dtype and out.is_contiguous()
        into = out if fits else torch.empty((len(codes), self._dim), dtype=self._dtype)
        return gather(EncodedTable(codes, self.codec), torch.arange(len(codes)), out=into)

    def _stage(self, rows, into, mapped):
        # Under a cache (a cache of decoded rows): the decoded rows, read into the caller's buffer.  The inner
        # store's own staging would give code rows.
        return self._copy_stage(rows, into)

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return f"{type(self).__name__}({self.inner!r}, {self.codec.name!r}, dtype={self._dtype}{state})"
