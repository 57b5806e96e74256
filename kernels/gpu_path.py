"""The GPU gather's hot path: a table's launch state cached per device, and a launch with no host sync.

What a gather of CUDA ids needs from its table (the raw pointer, the row bytes, the backend's launch function,
torch's view of mapped memory for the ``index_select`` candidate, the tuned variant per id-count bucket) is
worked out once per (table, device) into a :class:`GpuTable`, after ``kernels.api``'s full checks.  A later
gather over the same live table, at the same address, shape and dtype, finds it by a dict lookup and goes
straight to :func:`launch`, which reads nothing from the device: ids are checked by the kernels
(:mod:`kernels.bounds`), the stream is the caller's, and no event is recorded.
"""

from __future__ import annotations

import importlib
import math
import weakref
from collections.abc import Callable

import torch

from .bounds import bounds_for
from .interop import CudaArrayView
from .variants import Variant, default_variant

__all__ = ["GpuTable", "table_for", "cached_table", "launch", "as_variant", "BACKEND_MODULES"]

BACKEND_MODULES = {"numba_cuda": ".numba_cuda", "cupy": ".cupy_backend"}


def as_variant(variant: Variant | str | None) -> Variant | None:
    """``variant`` (a :class:`Variant`, its name, or None) as a Variant or None; ``TypeError``/``ValueError``."""
    if variant is None or isinstance(variant, Variant):
        return variant
    return Variant.parse(variant)


class GpuTable:
    """What a CUDA gather over one table on one device needs, worked out once.

    Parameters
    ----------
    src : torch.Tensor
        The checked table (contiguous; device memory or pinned, mapped host memory).
    device : torch.device
        The CUDA device the gathers run on.
    backend : str
        ``"cupy"`` or ``"numba_cuda"``.

    Examples
    --------
    >>> import torch
    >>> from directload.kernels import gather
    >>> table = torch.zeros(1000, 100).pin_memory()  # doctest: +SKIP
    >>> rows = gather(table, torch.tensor([3, 1], device="cuda"))  # doctest: +SKIP
    >>> cached_table(table, rows.device).row_bytes  # the next gather finds it  # doctest: +SKIP
    400
    """

    def __init__(self, src: torch.Tensor, device: torch.device, backend: str) -> None:
        self.src = weakref.ref(src)
        self.ptr = src.data_ptr()
        self.shape = src.shape
        self.dtype = src.dtype
        self.row_shape = tuple(src.shape[1:])
        self.n_rows = src.shape[0]
        self.elem = src.element_size()
        self.row_bytes = self.elem * math.prod(self.row_shape)
        self.device = device
        self.device_index = device.index
        self.backend = backend
        module = importlib.import_module(BACKEND_MODULES[backend], __package__)
        self.launch_variant = module.launch_variant
        self.launch_check_clamp = module.launch_check_clamp
        self.bounds = bounds_for(device.index)
        self.variants: dict[int, Variant] = {}  # id-count bucket -> Variant (tuned or default)
        self._view: torch.Tensor | None = None

    def matches(self, src: torch.Tensor) -> bool:
        """Whether ``src`` is still the table this entry was made for (same object, address, shape, dtype)."""
        # Ignored below: after ``self.src() is src``, mypy takes ``src`` for the weakref's ``Tensor | None``.
        return self.src() is src and src.data_ptr() == self.ptr and src.shape == self.shape and src.dtype == self.dtype  # type: ignore[union-attr]

    def view(self) -> torch.Tensor:
        """The table as a CUDA tensor (mapped host memory seen from the device): what ``index_select`` reads."""
        if self._view is None:
            src = self.src()
            if src.is_cuda:  # type: ignore[union-attr]  # the caller holds the table alive
                self._view = src
            else:
                nbytes = self.n_rows * self.row_bytes
                with torch.cuda.device(self.device):
                    flat = torch.as_tensor(CudaArrayView(self.ptr, (nbytes,), 1, src), device=self.device)
                self._view = flat.view(self.dtype).view(self.shape)
        return self._view

    def variant_for(self, n: int, out_ptr: int,
                    choose: Callable[[GpuTable, int, int], Variant | None] | None = None) -> Variant:
        """The variant for ``n`` ids: cached per power-of-two bucket; ``choose(self, n, out_ptr)`` on a miss
        (the tuner), else rowvec at its default width."""
        bucket = n.bit_length()
        found = self.variants.get(bucket)
        if found is None:
            found = choose(self, n, out_ptr) if choose is not None else None
            if found is None:
                found = default_variant(self.row_bytes, self.ptr, out_ptr)
            self.variants[bucket] = found
        return found


_tables: dict[tuple[int, torch.device], GpuTable] = {}


def cached_table(src: torch.Tensor, device: torch.device) -> GpuTable | None:
    """The :class:`GpuTable` of ``src`` on ``device`` if one is cached and still matches, else None."""
    entry = _tables.get((id(src), device))
    if entry is not None and entry.matches(src):
        return entry
    return None


def table_for(src: torch.Tensor, device: torch.device, backend: str) -> GpuTable:
    """The :class:`GpuTable` of a checked ``src`` on ``device`` for ``backend`` (made and cached on a miss).

    The entry goes when the table dies.
    """
    key = (id(src), device)
    entry = _tables.get(key)
    if entry is None or not entry.matches(src) or entry.backend != backend:
        entry = GpuTable(src, device, backend)
        entry.src = weakref.ref(src, lambda _: _tables.pop(key, None))
        _tables[key] = entry
    return entry


def launch(table: GpuTable, index: torch.Tensor, out: torch.Tensor, variant: Variant, stream: torch.cuda.Stream) -> int:
    """Start ``out[i] = table[index[i]]`` on ``stream``: no host sync, no event.

    ``index`` is a checked, contiguous CUDA int32/int64 tensor on ``table.device``; ``out`` a checked,
    contiguous ``[len(index), *row_shape]`` tensor there.  Ids out of range are clamped and reported
    through the device's error word (:mod:`kernels.bounds`).  Returns the launch's stamp.
    """
    bounds = table.bounds
    bounds.raise_pending()
    stamp = bounds.stamp(index, table.n_rows)
    ids, pos = torch.sort(index) if variant.sorted else (index, None)
    handle = stream.cuda_stream
    if variant.kernel == "index_select":
        clamped = torch.empty_like(ids)
        table.launch_check_clamp(device_id=table.device_index, index=ids, clamped=clamped, n_rows=table.n_rows,
                                 err_ptr=bounds.ptr, stamp=stamp, stream_ptr=handle)
        if pos is None:
            torch.index_select(table.view(), 0, clamped, out=out)
        else:
            out.index_copy_(0, pos, torch.index_select(table.view(), 0, clamped))
    else:
        table.launch_variant(variant, device_id=table.device_index, src_ptr=table.ptr, n_rows=table.n_rows,
                             row_bytes=table.row_bytes, elem_bytes=table.elem, index=ids, positions=pos,
                             out_ptr=out.data_ptr(), err_ptr=bounds.ptr, stamp=stamp, stream_ptr=handle)
    return stamp
