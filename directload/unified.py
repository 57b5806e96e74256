"""The unified tensor: host memory both CPU and GPU read, with an affinity that places computation."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map

from directload.capabilities import NoDeviceError, capabilities
from directload.errors import DirectloadError
from directload.kernels import gather
from directload.kernels.bounds import ids_from_end
from directload.kernels.interop import CudaArrayView
from directload.kernels.operands import check_readable, check_strict_bounds, host_of, out_of_range

from . import memory
from .placement import (
    AFFINITIES,
    HOST_FUNCS,
    INDEX_FUNCS,
    METADATA_FUNCS,
    REFUSED_FUNCS,
    WRITE_FUNCS,
    compute_device,
    index_device,
    mutated_operands,
    write_target,
)

if TYPE_CHECKING:
    class _Watch(Protocol):
        """A mapped file's size check (:class:`directload.files.FileWatch`)."""

        def check(self) -> None: ...

__all__ = ["UnifiedTensor", "ClosedError", "MovedMemoryError", "to_unified", "empty", "zeros", "ones", "is_unified",
           "host_of"]


class ClosedError(DirectloadError, RuntimeError):
    """The unified tensor was closed; its memory may be gone.

    Examples
    --------
    >>> import directload
    >>> x = directload.zeros(2)
    >>> x.close()
    >>> x.host
    Traceback (most recent call last):
    ...
    directload.unified.ClosedError: this unified tensor was closed; create a new one
    """


class MovedMemoryError(DirectloadError, RuntimeError):
    """The host tensor a unified tensor registered was reallocated (``resize_``): the GPU's mapping is of the
    old memory, so :meth:`UnifiedTensor.cuda_view` refuses it; ``to_unified()`` again maps the new.

    Examples
    --------
    >>> issubclass(MovedMemoryError, RuntimeError)
    True
    """


class UnifiedTensor(torch.Tensor):
    """A tensor in (pinned, GPU-mapped) host memory, placed by its affinity.

    Create one with :func:`to_unified`, :func:`empty`, :func:`zeros`,
    :func:`ones` or :func:`directload.from_file`, never directly.  Its torch
    ``device`` is ``cpu`` (the bytes live in host memory); where computation
    runs follows the placement rules in :mod:`directload.placement`.

    Examples
    --------
    >>> import directload, torch
    >>> x = directload.to_unified(torch.arange(6.0).reshape(3, 2), affinity="host")
    >>> x
    UnifiedTensor(shape=(3, 2), dtype=torch.float32, affinity='host', memory=...)
    >>> rows = x[torch.tensor([2, 0])]  # a CPU index and affinity "host": the CPU gather kernel
    >>> type(rows).__name__, rows.device, rows.tolist()
    ('Tensor', device(type='cpu'), [[4.0, 5.0], [0.0, 1.0]])
    >>> x.host.data_ptr() == x.data_ptr()  # the host view: the same bytes, no copy
    True
    >>> x.with_affinity("cuda").affinity  # a view with another affinity; no data moves
    'cuda'
    >>> x.close()
    """

    is_unified = True
    # set by _wrap: the host view (None once closed: _live_host() raises), the memory behind it, and how to
    # rebuild it elsewhere
    _host: torch.Tensor | None
    _alloc: memory.Allocation
    _affinity: str
    _read_only: bool
    _origin: tuple[str, Any] | None
    _file_watch: _Watch | None
    _closed: bool
    _cuda: torch.Tensor | None

    @staticmethod
    def _wrap(host, alloc, affinity, read_only=False, origin=None, file_watch=None):
        t = torch.Tensor._make_subclass(UnifiedTensor, host, False)
        t._host = host
        t._alloc = alloc
        t._affinity = affinity
        t._read_only = read_only
        t._origin = origin  # how to rebuild in another process (shared memory or a file)
        t._file_watch = file_watch  # a mapped file's size check (directload.files), or None
        t._closed = False
        t._cuda = None
        return t

    def _live_host(self) -> torch.Tensor:
        """The host view, or :class:`ClosedError`: read once, so a ``close()`` on another
        thread cannot turn it into ``None`` between a check and its use."""
        host = self._host
        if host is None:
            raise ClosedError("this unified tensor was closed; create a new one")
        return host

    def check_backing(self) -> torch.Tensor:
        """Raise if the memory behind this tensor is gone or has changed under it.

        :class:`ClosedError` after :meth:`close`; for a table mapped from a file,
        :class:`directload.CorruptFileError` when the file's size changed since it
        was mapped (reading a page past a truncated end kills the process with
        SIGBUS, so gathers check this first; one ``fstat``).
        """
        host = self._live_host()
        if self._file_watch is not None:
            self._file_watch.check()
        return host

    # -- properties -----------------------------------------------------------------
    @property
    def affinity(self) -> str:
        """``"cuda"`` or ``"host"``: the device computation prefers."""
        return self._affinity

    @property
    def memory_kind(self) -> str:
        """``"pinned-mapped"``, ``"registered"`` or ``"host"`` (no pinning)."""
        return self._alloc.kind

    @property
    def allocation(self) -> memory.Allocation:
        """The :class:`directload.memory.Allocation` behind the bytes."""
        self._check_open()
        return self._alloc

    @property
    def read_only(self) -> bool:
        """Whether writes and in-place ops raise ``PermissionError``."""
        return self._read_only

    @property
    def host(self) -> torch.Tensor:
        """A plain CPU tensor over the same bytes (zero-copy; keeps the bytes alive).

        It is an ordinary tensor: nothing checks what is done with it.  Writes
        to the host view of a read-only table change only this process's
        copy-on-write pages (for a file) and never the file; a mapped file
        truncated underneath it raises SIGBUS on access, as with
        ``numpy.memmap``.  Index the unified tensor itself to get those checks.
        """
        return self._live_host()

    def cuda_view(self, device: torch.device | str | None = None) -> torch.Tensor:
        """A plain CUDA tensor over the same bytes, read zero-copy over PCIe.

        Any stock torch CUDA op can take it (PyTorch-Direct's "PyD Naive" path).
        It keeps the memory alive.  Raises ``RuntimeError`` without CUDA, or
        when the memory is not pinned.
        """
        host = self._live_host()
        alloc = self._alloc
        if not torch.cuda.is_available():
            raise NoDeviceError("cuda_view() needs a CUDA device; this machine has none (use .host)")
        if alloc.kind == "host":
            raise memory.PinError("this unified tensor is in unpinned memory (pinning failed and pin='auto' "
                               "fell back), so a GPU cannot map it")
        if host.data_ptr() != alloc.ptr:
            raise MovedMemoryError("the memory this unified tensor registered has moved: the tensor it was made "
                               "from was resized (resize_) and reallocated.  Its host view still reads the "
                               "new bytes; call to_unified() again to map them for the GPU")
        device = torch.device(device or "cuda")
        if self._cuda is None or self._cuda.device != device:
            nbytes = host.numel() * host.element_size()
            with torch.cuda.device(device):
                flat = torch.as_tensor(CudaArrayView(alloc.ptr, (nbytes,), 1, (host, alloc)), device=device)
            self._cuda = flat.view(self.dtype).view(self.shape)
        return self._cuda

    def with_affinity(self, affinity: str) -> UnifiedTensor:
        """The same bytes with another affinity (a view; no data moves)."""
        self._check_open()
        _check_affinity(affinity)
        return UnifiedTensor._wrap(self._live_host(), self._alloc, affinity, self._read_only, self._origin,
                                   self._file_watch)

    @property
    def compute_device(self) -> torch.device:
        """Where this tensor's affinity runs computation on this machine."""
        return compute_device([self], has_cuda=_has_cuda())

    # -- lifetime -----------------------------------------------------------------
    def close(self) -> None:
        """Drop this tensor's hold on the memory (idempotent).

        The memory is freed (returned to the pinned pool) or unregistered exactly
        once, when the last tensor or view over it is gone; with no views, that
        is now.  Any later use of this tensor raises :class:`ClosedError`.
        """
        if self._closed:
            return
        self._closed = True
        with torch._C.DisableTorchFunctionSubclass():
            # torch's stubs lack the documented set_(source: Tensor)
            torch.Tensor.set_(self, torch.empty(0, dtype=self.dtype))  # type: ignore[call-overload]
        self._host = self._cuda = None
        self._alloc = _Closed(self._alloc.kind)  # type: ignore[assignment]  # closed: only its kind is left

    def set_(self, *args: object, **kwargs: object) -> NoReturn:
        """Refused: a unified tensor's bytes are fixed (torch does not route ``set_`` through
        ``__torch_function__``, so it is overridden here)."""
        raise TypeError("set_() would swap the memory of a unified tensor, whose bytes are fixed (registered or "
                        "mapped); make a new one instead, or close() this one")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self._closed:
            raise ClosedError("this unified tensor was closed; create a new one")

    def __reduce_ex__(self, protocol):
        self._check_open()
        if self._origin is None:
            raise TypeError("a unified tensor pickles (for torch.multiprocessing or DataLoader workers) only "
                            "when it lives in shared memory or a file: create it with shared=True or with "
                            "directload.from_file, so workers map the same bytes instead of copying the table")
        return _rebuild, (self._origin, self._affinity, str(self.dtype), tuple(self.shape))

    def __repr__(self, *, tensor_contents=None):
        if self._closed:
            return "UnifiedTensor(closed)"
        return (f"UnifiedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, affinity={self._affinity!r}, "
                f"memory={self._alloc.kind!r})")

    # -- placement ----------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # The hot paths of a loader, with no argument tree to walk (about 70 us a call): PyG's filter reads
        # every node table's metadata and index_selects it at every batch.
        if len(args) == 1 and not kwargs and (func in METADATA_FUNCS or getattr(func, "__name__", "") == "__get__"):
            if func is not torch.Tensor.__repr__:  # .shape, .dtype, .size() ... of this one tensor
                args[0]._check_open()
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args)
        handler = INDEX_FUNCS.get(func)
        if handler is not None and not kwargs.keys() - {"out"}:  # x[idx], index_select, embedding
            hit = handler(*args, **kwargs)
            if hit is not None and type(hit[1]) is torch.Tensor:
                return _gather(*hit)
        flat, _ = tree_flatten((args, kwargs))
        unified = [a for a in flat if isinstance(a, UnifiedTensor)]
        if func is not torch.Tensor.__repr__:
            for u in unified:
                u._check_open()
        if func in REFUSED_FUNCS and isinstance(args[0] if args else None, UnifiedTensor):
            raise TypeError(f"{REFUSED_FUNCS[func]} would swap or reallocate the memory of a unified tensor, whose "
                            "bytes are fixed (registered or mapped); make a new one instead")
        if func in METADATA_FUNCS or getattr(func, "__name__", "") == "__get__":
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func in INDEX_FUNCS:
            hit = INDEX_FUNCS[func](*args, **kwargs)
            if hit is not None:
                return _gather(*hit)
        if func in WRITE_FUNCS:
            return _write(func, args, kwargs)
        read_only = [u for u in unified if u._read_only]
        for target in mutated_operands(func, args, kwargs):
            if isinstance(target, UnifiedTensor) and target._read_only:
                raise PermissionError(_READ_ONLY)
        if func in HOST_FUNCS:
            device = torch.device("cpu")
        else:
            device = compute_device(flat, has_cuda=_has_cuda())
        versions = [u._live_host()._version for u in read_only]
        args, kwargs = tree_map(lambda a: _view_on(a, device), (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        # Every in-place ATen op bumps the version counter: a safety net behind the
        # name rules of mutated_operands, so no write to a read-only table goes unnoticed.
        if any(u._host is not None and u._host._version != v for u, v in zip(read_only, versions)):
            raise PermissionError(_READ_ONLY + f" ({getattr(func, '__name__', func)} wrote to it; in a "
                                  "copy-on-write mapping of a file, only this process's pages changed)")
        if read_only and func in HOST_FUNCS and isinstance(out, np.ndarray):
            out.flags.writeable = False
        return out


_READ_ONLY = ("this unified tensor is read-only (from_file's default mode='r', or read_only=True): "
              "open the file with mode='r+' to write to it")


def _has_cuda():
    return capabilities().cuda


class _Closed:
    def __init__(self, kind):
        self.kind = kind


def _view_on(a, device):
    if not isinstance(a, UnifiedTensor):
        return a
    return a.cuda_view() if device.type == "cuda" else a._live_host()


def _gather(table, index, negative_from_end=False):
    """Indexing of a unified table: the aligned gather kernel, placed by the rules.

    ``negative_from_end``: ``x[idx]`` semantics, where ``-1`` is the last row.  An id outside ``-n..n-1`` gets
    one message on every path, naming the id as given (:func:`_from_end_cpu`'s; on a GPU the kernel's, through
    :func:`~directload.kernels.bounds.ids_from_end`).
    """
    # One read of the host view (and of the allocation, which stays referenced for the
    # whole gather): a close() on another thread cannot pull them out mid-call.
    host = table.check_backing()
    alloc = table._alloc  # noqa: F841 (held, not used)
    check_readable(index, "index")
    n_rows = host.shape[0]
    device = index_device(table, index, has_cuda=_has_cuda())
    if device.type == "cpu" and index.is_cuda:  # a table the GPU cannot map: the ids come to the CPU kernel
        index = _ids_to_host(index)
    from_end = negative_from_end and index.numel() > 0
    if from_end and not index.is_cuda:
        index, from_end = _from_end_cpu(index, n_rows), False  # checked here: a CPU read costs no sync
    if device.type == "cuda" and not index.is_cuda:
        # Checked here, where it costs nothing, then copied from pinned staging: a copy from pageable
        # memory would wait for the stream.
        _check_cpu_ids(index, n_rows)
        index = index.pin_memory().to(device, non_blocking=True)
    flat = index if index.dim() == 1 else index.reshape(-1)
    # The plain host view, so the kernel's checks do not re-enter __torch_function__;
    # gather reads its pinned state to decide whether a GPU may map it.
    if from_end:  # CUDA ids: shifted on the device (no sync); the kernel reports a bad one as given
        with ids_from_end():
            out = gather(host, _shift_from_end(flat, n_rows))
    else:
        out = gather(host, flat)
    return out if index.dim() == 1 else out.reshape(*index.shape, *host.shape[1:])


def _ids_to_host(index):
    """CUDA ids for a gather that runs on the CPU (the caller asked for it: a copy back, which waits)."""
    return index.cpu()


def _from_end_cpu(index, n_rows):
    """CPU ids with ``-1`` as the last row, as row ids, checked here (a CPU read costs no sync): the first id
    outside ``-n_rows..n_rows-1`` raises the one message of ``x[idx]``, naming it as given and its position."""
    lo, hi = (int(v) for v in torch.aminmax(index))
    if lo < -n_rows or hi >= n_rows:
        flat = index.reshape(-1)
        bad = int(((flat < -n_rows) | (flat >= n_rows)).nonzero()[0, 0])
        raise out_of_range(int(flat[bad]), n_rows, position=bad, negatives=True)
    return index if lo >= 0 else _shift_from_end(index, n_rows)


def _shift_from_end(index, n_rows):
    """``index`` with ``n_rows`` added to its negative ids, on its device, reading nothing back: an id below
    ``-n_rows`` stays negative, out of range.  int32 ids widen where the row ids would not fit."""
    if index.dtype == torch.int32 and n_rows > torch.iinfo(torch.int32).max:
        index = index.long()
    return torch.where(index < 0, index + n_rows, index)


def _check_cpu_ids(index, n_rows):
    """``IndexError`` for a CPU id outside ``[0, n_rows)``, before it travels to the GPU (ints only)."""
    if index.dtype in (torch.int32, torch.int64):
        check_strict_bounds(index, n_rows)


def _write(func, args, kwargs):
    dst, value, index = write_target(func, args, kwargs)
    if not isinstance(dst, UnifiedTensor):  # a plain tensor written from a unified one: a read of it
        device = dst.device
        args, kwargs = tree_map(lambda a: _view_on(a, device), (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    host = dst._live_host()
    if dst._read_only:
        raise PermissionError(_READ_ONLY)
    if index is not None:
        _check_write_index(index, dst.shape[0])
    if isinstance(value, torch.Tensor):
        if value.dtype != dst.dtype:
            raise TypeError(f"cannot write {value.dtype} values into a {dst.dtype} unified tensor; cast first")
        region = torch.empty(dst.shape, device="meta")
        target = tuple(region[tree_map(_to_meta, index)].shape) if index is not None else tuple(dst.shape)
        try:
            fits = torch.broadcast_shapes(tuple(value.shape), target) == target
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"cannot write values of shape {tuple(value.shape)} into a region of shape {target}")
    if isinstance(value, UnifiedTensor):
        value = value._live_host()
    on_cuda = isinstance(value, torch.Tensor) and value.is_cuda
    view = dst.cuda_view(value.device) if on_cuda else host
    if index is not None:
        index = tree_map(lambda t: t.to(view.device) if isinstance(t, torch.Tensor) else t, index)
    with torch._C.DisableTorchFunctionSubclass():
        if func is torch.Tensor.__setitem__:
            view[index] = value
        else:
            view.copy_(value, non_blocking=kwargs.get("non_blocking", False))
    if on_cuda:
        # The host view shares autograd's version counter with the tensor the table was
        # made from (a write through the CPU view bumps it by itself); a write through
        # the CUDA view must bump it too, or backward() would use the new values silently.
        torch.autograd.graph.increment_version(host)
    return None if func is torch.Tensor.__setitem__ else dst


def _to_meta(x):
    return x.to("meta") if isinstance(x, torch.Tensor) else x


def _check_write_index(index, n_rows):
    """Range-check tensor indices of a write: a CUDA write out of range would kill the context."""
    part = index[0] if isinstance(index, tuple) and index else index  # the row index
    if isinstance(part, (list, np.ndarray)):
        part = torch.as_tensor(part)
    if isinstance(part, torch.Tensor) and part.dtype in (torch.int32, torch.int64) and part.numel():
        lo, hi = int(part.min()), int(part.max())
        if lo < -n_rows or hi >= n_rows:
            bad = hi if hi >= n_rows else lo
            raise out_of_range(bad, n_rows, negatives=True)
    elif isinstance(part, int) and not -n_rows <= part < n_rows:
        raise out_of_range(part, n_rows, negatives=True)


def _check_affinity(affinity):
    if affinity not in AFFINITIES:
        raise ValueError(f"affinity must be one of {AFFINITIES}, got {affinity!r}")


def _from_allocation(alloc, dtype, shape, affinity, *, writable=True, origin=None):
    raw = memory.host_array(alloc, writable)[:memory.nbytes_of(shape, dtype)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only mappings: writes are refused above
        host = torch.from_numpy(raw).view(dtype).view(shape)
    return UnifiedTensor._wrap(host, alloc, affinity, read_only=not writable, origin=origin)


def empty(shape: int | Sequence[int], *, dtype: torch.dtype = torch.float32, affinity: str = "cuda",
          pin: str | bool = "require", shared: bool = False) -> UnifiedTensor:
    """A new uninitialised unified tensor.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : torch.dtype
    affinity : {"cuda", "host"}
        Where computation on it runs (see :mod:`directload.placement`).
    pin : {"require", "auto", "never"} or bool
        With CUDA: pinned, mapped memory or :class:`directload.memory.PinError`
        (``"require"``, or ``True``), a fallback to ordinary memory when
        pinning fails (``"auto"``), or ordinary memory (``"never"``, or
        ``False``).  Without CUDA the memory is ordinary host memory in every
        mode.  Anything else raises ``ValueError``.
    shared : bool
        Put it in shared memory so ``torch.multiprocessing`` workers map it.

    Returns
    -------
    UnifiedTensor

    Examples
    --------
    >>> import directload, torch
    >>> x = directload.empty((4, 3), dtype=torch.float16)
    >>> x.shape, x.is_unified
    (torch.Size([4, 3]), True)
    """
    _check_affinity(affinity)
    pin = memory.resolve_pin(pin)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    alloc = memory.allocate(memory.nbytes_of(shape, dtype), pin=pin, shared=shared)
    origin = ("shared", alloc.owner.view(-1)) if shared else None  # type: ignore[attr-defined]  # owner: a tensor
    return _from_allocation(alloc, dtype, shape, affinity, origin=origin)


def zeros(shape: int | Sequence[int], *, dtype: torch.dtype = torch.float32, affinity: str = "cuda",
          pin: str | bool = "require", shared: bool = False) -> UnifiedTensor:
    """A new unified tensor of zeros (see :func:`empty`).

    Examples
    --------
    >>> import directload
    >>> directload.zeros(3).host.tolist()
    [0.0, 0.0, 0.0]
    """
    t = empty(shape, dtype=dtype, affinity=affinity, pin=pin, shared=shared)
    t._live_host().zero_()
    return t


def ones(shape: int | Sequence[int], *, dtype: torch.dtype = torch.float32, affinity: str = "cuda",
         pin: str | bool = "require", shared: bool = False) -> UnifiedTensor:
    """A new unified tensor of ones (see :func:`empty`).

    Examples
    --------
    >>> import directload
    >>> directload.ones(2).host.tolist()
    [1.0, 1.0]
    """
    t = empty(shape, dtype=dtype, affinity=affinity, pin=pin, shared=shared)
    t._live_host().fill_(1)
    return t


def to_unified(data: torch.Tensor | np.ndarray, affinity: str = "cuda", *, copy: bool = False,
               pin: str | bool = "require", read_only: bool | None = None) -> UnifiedTensor:
    """Make a unified tensor of ``data``.

    Parameters
    ----------
    data : torch.Tensor or numpy.ndarray
        A CPU tensor or array (a ``numpy.memmap`` and ``/dev/shm`` shared
        tensors included).  By default its memory is registered in place with
        CUDA (no copy; chunked ``cudaHostRegister``) and must stay contiguous
        and alive, which the unified tensor ensures by holding it.  Without
        CUDA it is used as is.
    affinity : {"cuda", "host"}
    copy : bool
        Copy into a fresh pooled pinned allocation instead of registering.
    pin : {"require", "auto", "never"} or bool
        See :func:`empty`.
    read_only : bool, optional
        Refuse writes and in-place ops (``PermissionError``), and register
        read-only with CUDA (which never forces a copy of private pages).
        Default: whether a numpy ``data`` is read-only.

    Notes
    -----
    Without ``copy`` the unified tensor shares ``data``'s memory and holds its
    storage, so the bytes stay alive whatever happens to ``data`` itself.  It
    also shares ``data``'s autograd version counter: for a tensor that requires
    grad, a write through the unified tensor (``x[idx] = v``, ``copy_``, an
    in-place op) counts as an in-place change of ``data``, and a ``backward()``
    that needs the old values raises PyTorch's usual "modified by an inplace
    operation" error instead of silently using the new ones.  Pass
    ``copy=True`` for an independent table.

    Returns
    -------
    UnifiedTensor

    Raises
    ------
    TypeError
        ``data`` is on a CUDA device or is not a tensor/array.
    ValueError
        ``data`` is not contiguous.
    directload.memory.PinError
        Pinning failed and ``pin="require"``.

    Examples
    --------
    >>> import directload, torch
    >>> feats = directload.to_unified(torch.arange(6.0).reshape(3, 2))
    >>> feats[torch.tensor([2, 0])].tolist()
    [[4.0, 5.0], [0.0, 1.0]]
    """
    _check_affinity(affinity)
    pin = memory.resolve_pin(pin)
    if isinstance(data, UnifiedTensor):
        view = data.with_affinity(affinity)
        view._read_only = data._read_only or bool(read_only)
        return view
    if isinstance(data, np.ndarray):
        writable = data.flags.writeable if read_only is None else not read_only
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            data = torch.from_numpy(data)
    elif isinstance(data, torch.Tensor):
        writable = not read_only
    else:
        raise TypeError(f"to_unified takes a torch.Tensor or numpy.ndarray, got {type(data).__name__}")
    if data.is_cuda:
        raise TypeError("data is already in GPU memory; a unified tensor lives in host memory (use .cpu() first)")
    if data.device.type != "cpu":
        raise TypeError(f"data is on {data.device}; a unified tensor is made from CPU memory")
    if not data.is_contiguous():
        raise ValueError("data must be contiguous to be registered in place; pass data.contiguous() or copy=True")
    if copy:
        out = empty(tuple(data.shape), dtype=data.dtype, affinity=affinity, pin=pin)
        out._live_host().copy_(data)
        out._read_only = not writable
        return out
    # The host view aliases data's storage itself (and its autograd version counter), not
    # just its address: if data is later set_() elsewhere the bytes stay alive, if it is
    # resize_()d the view follows the new bytes, and writes through the unified tensor are
    # seen by autograd.
    host = data.detach()
    if type(host) is not torch.Tensor:
        host = host.as_subclass(torch.Tensor)
    nbytes = data.numel() * data.element_size()
    storage = host.untyped_storage()
    rt = memory.runtime() if pin != "never" else None
    alloc = memory.Allocation(host.data_ptr(), nbytes, "host", owner=storage)
    if rt is not None and nbytes:
        try:
            alloc = memory.register(host.data_ptr(), nbytes, storage, rt, read_only=not writable)
        except memory.PinError:
            if pin == "require":
                raise
    origin = ("shared", host.reshape(-1).view(torch.uint8)) if data.is_shared() and nbytes else None
    return UnifiedTensor._wrap(host, alloc, affinity, read_only=not writable, origin=origin)


def is_unified(x: object) -> bool:
    """Whether ``x`` is a :class:`UnifiedTensor`.

    Examples
    --------
    >>> import directload, torch
    >>> directload.is_unified(torch.zeros(1)), directload.is_unified(directload.zeros(1))
    (False, True)
    """
    return isinstance(x, UnifiedTensor)


#: Maps a file as a unified tensor (``directload.files.from_file``, which builds on this module and sets
#: this when it is imported, as ``import directload`` does).
_open_file: Callable[..., UnifiedTensor] | None = None


def _rebuild(origin, affinity, dtype, shape):
    """Unpickle in another process: map the same shared memory or file, copying nothing."""
    dtype = getattr(torch, dtype.split(".")[-1])
    if origin[0] == "file":
        return _open_file(**origin[1], affinity=affinity)
    return to_unified(origin[1][:memory.nbytes_of(shape, dtype)].view(dtype).view(shape), affinity, pin="auto")
