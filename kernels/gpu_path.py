"""The GPU gather's hot path: a table's launch state cached per device, and a launch with no host sync.

What a gather of CUDA ids needs from its table (the raw pointer, the row bytes, the backend's launch function,
torch's view of mapped memory for the ``index_select`` candidate, the tuned variant per id-count bucket) is
worked out once per (table, device) into a :class:`GpuTable`, after ``kernels.api``'s full checks.  A later
gather over the same live table, at the same address, shape and dtype, finds it by a dict lookup
(:func:`gather_fast`) and goes straight to :func:`start`, which reads nothing from the device: ids are checked
by the kernels (:mod:`kernels.bounds`), the stream is the caller's, and no event is recorded.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import cast

import torch

from directload.capabilities import capabilities

from .bounds import bounds_for
from .futures import GatherFuture
from .interop import CudaArrayView
from .operands import INDEX_DTYPES, out_of_range
from .registry import BACKEND_MODULES as ALL_BACKEND_MODULES
from .registry import GPU_BACKENDS, auto_gpu_backend, backend_module
from .tune_keys import key_for
from .tuner import get_tuner
from .variants import Variant, candidates, default_variant, legal_width

__all__ = ["GpuTable", "table_for", "cached_table", "launch", "as_variant", "gather_fast", "start",
           "BACKEND_MODULES"]

#: The GPU backends' modules (:data:`directload.kernels.registry.BACKEND_MODULES` has them all).
BACKEND_MODULES = {name: ALL_BACKEND_MODULES[name] for name in GPU_BACKENDS}


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
        module = backend_module(backend)
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
            src = cast(torch.Tensor, self.src())  # a weakref's Tensor | None: the caller holds the table alive
            if src.is_cuda:
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


def gather_fast(src: torch.Tensor, index: torch.Tensor, aligned: bool,
                variant: Variant | str | None) -> GatherFuture | None:
    """The common GPU gather, over a table gathered before on this device: a cache hit and cheap attribute
    checks, then the launch; ``None`` when anything is unusual (the general path then checks it all).
    Reads nothing from the device."""
    table = cached_table(src, index.device)
    if (table is None or table.backend != _auto_backend() or index.dtype not in INDEX_DTYPES
            or index.dim() != 1 or not index.is_contiguous() or index.layout != torch.strided):
        return None
    out = torch.empty((index.shape[0], *table.row_shape), dtype=table.dtype, device=index.device)
    chosen = as_variant(variant) if variant is not None else (None if aligned else Variant("naive"))
    return start(table, index, out, chosen)


def _auto_backend():
    """The backend ``"auto"`` takes for CUDA ids on this machine."""
    caps = capabilities()
    return auto_gpu_backend(caps.cupy, caps.numba_cuda)


def start(table: GpuTable, index: torch.Tensor, out: torch.Tensor, variant: Variant | None) -> GatherFuture:
    """Start a checked gather of ``index`` over ``table`` into ``out`` on the caller's current stream of the ids'
    device, and return its future; no host sync, no event.  ``variant`` None: the table's choice for this many
    ids (the tuner's, else the default)."""
    if index.shape[0] and table.n_rows == 0:
        _no_rows(index)
    if index.shape[0] == 0:
        table.bounds.raise_pending()
        return GatherFuture(None, out)
    stream = torch.cuda.current_stream(table.device)
    if variant is None and table.row_bytes:
        variant = table.variant_for(index.shape[0], out.data_ptr(), _tuned)
    if table.device_index != torch.cuda.current_device():
        with torch.cuda.device(table.device):
            stamp = _start_on(table, index, out, variant, stream)
    else:
        stamp = _start_on(table, index, out, variant, stream)
    return GatherFuture(None, out, stream, table.bounds, stamp)


def _start_on(table, index, out, variant, stream):
    """The launch of a GPU gather (its stamp): the row kernel, or for rows of 0 bytes, with nothing to move,
    the kernels' check of the ids alone (:func:`_check_ids`), as a CPU gather checks them."""
    if table.row_bytes == 0:
        return _check_ids(table, index, stream)
    return launch(table, index, out, variant, stream)


def _check_ids(table, index, stream):
    """Check ``index`` against ``table`` on the device as every GPU gather does (:mod:`kernels.bounds`): the
    ``check_clamp`` kernel stamps the error word for an id out of range; its clamped ids are scratch.  Returns
    the launch's stamp; reads nothing back."""
    bounds = table.bounds
    bounds.raise_pending()
    stamp = bounds.stamp(index, table.n_rows)
    table.launch_check_clamp(device_id=table.device_index, index=index, clamped=torch.empty_like(index),
                             n_rows=table.n_rows, err_ptr=bounds.ptr, stamp=stamp, stream_ptr=stream.cuda_stream)
    return stamp


def _no_rows(index):
    """Every id is out of range of a table of no rows: raise, naming the first (a sync, on the error path)."""
    raise out_of_range(int(index[0]), 0, position=0)


def _tuned(table, n, out_ptr):
    """The tuner's variant for ``n`` ids over ``table``: cached, else timed now over random ids in range
    (``kernels.tuner``; None where timing is off, for the default)."""
    tuner = get_tuner()
    if not tuner.enabled:
        return None
    key = key_for(table.device, table.row_bytes, table.elem, n, table.n_rows,
                  align=legal_width(table.row_bytes, table.ptr, out_ptr))
    found = tuner.lookup(key)
    if found is not None:
        return found
    ids = torch.randint(0, table.n_rows, (n,), device=table.device)
    scratch = torch.empty((n, *table.row_shape), dtype=table.dtype, device=table.device)

    def run(variant):
        launch(table, ids, scratch, variant, torch.cuda.current_stream(table.device))

    return tuner.choose(key, candidates(table.row_bytes, table.ptr, out_ptr), run)
