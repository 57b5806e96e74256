"""The unified tensor: host memory both CPU and GPU read, with an affinity that places computation."""

import warnings

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import memory
from .placement import (
    AFFINITIES,
    HOST_FUNCS,
    INDEX_FUNCS,
    METADATA_FUNCS,
    WRITE_FUNCS,
    compute_device,
    index_device,
    write_target,
)

__all__ = ["UnifiedTensor", "ClosedError", "to_unified", "empty", "zeros", "ones", "is_unified"]


class ClosedError(RuntimeError):
    """The unified tensor was closed; its memory may be gone."""


class UnifiedTensor(torch.Tensor):
    """A tensor in (pinned, GPU-mapped) host memory, placed by its affinity.

    Create one with :func:`to_unified`, :func:`empty`, :func:`zeros`,
    :func:`ones` or :func:`directload.from_file`, never directly.  Its torch
    ``device`` is ``cpu`` (the bytes live in host memory); where computation
    runs follows the placement rules in :mod:`directload.placement`.
    """

    is_unified = True

    @staticmethod
    def _wrap(host, alloc, affinity, read_only=False, origin=None):
        t = torch.Tensor._make_subclass(UnifiedTensor, host, False)
        t._host = host
        t._alloc = alloc
        t._affinity = affinity
        t._read_only = read_only
        t._origin = origin  # how to rebuild in another process (shared memory or a file)
        t._closed = False
        t._cuda = None
        return t

    # -- properties -----------------------------------------------------------------
    @property
    def affinity(self):
        """``"cuda"`` or ``"host"``: the device computation prefers."""
        return self._affinity

    @property
    def memory_kind(self):
        """``"pinned-mapped"``, ``"registered"`` or ``"host"`` (no pinning)."""
        return self._alloc.kind

    @property
    def allocation(self):
        """The :class:`directload.memory.Allocation` behind the bytes."""
        self._check_open()
        return self._alloc

    @property
    def host(self):
        """A plain CPU tensor over the same bytes (zero-copy; keeps the memory alive)."""
        self._check_open()
        return self._host

    def cuda_view(self, device=None):
        """A plain CUDA tensor over the same bytes, read zero-copy over PCIe.

        Any stock torch CUDA op can take it (PyTorch-Direct's "PyD Naive" path).
        It keeps the memory alive.  Raises ``RuntimeError`` without CUDA, or
        when the memory is not pinned.
        """
        from directload.kernels.interop import cuda_array

        self._check_open()
        if not torch.cuda.is_available():
            raise RuntimeError("cuda_view() needs a CUDA device; this machine has none (use .host)")
        if self._alloc.kind == "host":
            raise RuntimeError("this unified tensor is in unpinned memory (pinning failed and pin='auto' "
                               "fell back), so a GPU cannot map it")
        device = torch.device(device or "cuda")
        if self._cuda is None or self._cuda.device != device:
            with torch.cuda.device(device):
                flat = torch.as_tensor(cuda_array(self._host.view(torch.uint8).reshape(-1)), device=device)
            self._cuda = flat.view(self.dtype).view(self.shape)
        return self._cuda

    def with_affinity(self, affinity):
        """The same bytes with another affinity (a view; no data moves)."""
        self._check_open()
        _check_affinity(affinity)
        return UnifiedTensor._wrap(self._host, self._alloc, affinity, self._read_only, self._origin)

    @property
    def compute_device(self):
        """Where this tensor's affinity runs computation on this machine."""
        return compute_device([self], has_cuda=_has_cuda())

    # -- lifetime -----------------------------------------------------------------
    def close(self):
        """Drop this tensor's hold on the memory (idempotent).

        The memory is freed (returned to the pinned pool) or unregistered exactly
        once, when the last tensor or view over it is gone; with no views, that
        is now.  Any later use of this tensor raises :class:`ClosedError`.
        """
        if self._closed:
            return
        self._closed = True
        with torch._C.DisableTorchFunctionSubclass():
            torch.Tensor.set_(self, torch.empty(0, dtype=self.dtype))
        self._host = self._cuda = None
        self._alloc = _Closed(self._alloc.kind)

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
        if func is torch.Tensor.__getitem__ and len(args) == 2 and type(args[1]) is torch.Tensor:
            # x[idx], the hot path of a loader: no argument tree to walk.
            args[0]._check_open()
            hit = INDEX_FUNCS[func](*args)
            if hit is not None:
                return _gather(*hit)
        flat, _ = tree_flatten((args, kwargs))
        unified = [a for a in flat if isinstance(a, UnifiedTensor)]
        if func is not torch.Tensor.__repr__:
            for u in unified:
                u._check_open()
        if func in METADATA_FUNCS or getattr(func, "__name__", "") == "__get__":
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func in INDEX_FUNCS:
            hit = INDEX_FUNCS[func](*args, **kwargs)
            if hit is not None:
                return _gather(*hit)
        if func in WRITE_FUNCS:
            return _write(func, args, kwargs)
        if func in HOST_FUNCS:
            device = torch.device("cpu")
        else:
            device = compute_device(flat, has_cuda=_has_cuda())
        args, kwargs = tree_map(lambda a: _view_on(a, device), (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _has_cuda():
    from .capabilities import capabilities

    return capabilities().cuda


class _Closed:
    def __init__(self, kind):
        self.kind = kind


def _view_on(a, device):
    if not isinstance(a, UnifiedTensor):
        return a
    return a.cuda_view() if device.type == "cuda" else a._host


def _gather(table, index, negative_from_end=False):
    """Indexing of a unified table: the aligned gather kernel, placed by the rules.

    ``negative_from_end``: ``x[idx]`` semantics, where ``-1`` is the last row.
    """
    from directload.kernels import gather

    if negative_from_end and index.numel():
        n_rows = table._host.shape[0]
        lo = int(index.min())
        if lo < 0:
            if lo < -n_rows:
                raise IndexError(f"index {lo} is out of range for {n_rows} rows")
            index = torch.where(index < 0, index + n_rows, index)
    device = index_device(table, index, has_cuda=_has_cuda())
    if device.type == "cuda" and not index.is_cuda:
        index = index.to(device, non_blocking=True)
    if device.type == "cpu" and index.is_cuda:
        index = index.cpu()
    # The plain host view, so the kernel's checks do not re-enter __torch_function__;
    # gather reads its pinned state to decide whether a GPU may map it.
    if index.dim() == 1:
        return gather(table._host, index)
    out = gather(table._host, index.reshape(-1))
    return out.reshape(*index.shape, *table._host.shape[1:])


def _write(func, args, kwargs):
    dst, value, index = write_target(func, args, kwargs)
    dst._check_open()
    if dst._read_only:
        raise PermissionError("this unified tensor is read-only (opened with mode='r'); open it with mode='r+'")
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
    on_cuda = isinstance(value, torch.Tensor) and value.is_cuda
    view = dst.cuda_view(value.device) if on_cuda else dst._host
    if index is not None:
        index = tree_map(lambda t: t.to(view.device) if isinstance(t, torch.Tensor) else t, index)
    with torch._C.DisableTorchFunctionSubclass():
        if func is torch.Tensor.__setitem__:
            view[index] = value
            return None
        view.copy_(value, non_blocking=kwargs.get("non_blocking", False))
    return dst


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
            raise IndexError(f"index {bad} is out of range for {n_rows} rows")
    elif isinstance(part, int) and not -n_rows <= part < n_rows:
        raise IndexError(f"index {part} is out of range for {n_rows} rows")


def _check_affinity(affinity):
    if affinity not in AFFINITIES:
        raise ValueError(f"affinity must be one of {AFFINITIES}, got {affinity!r}")


def _from_allocation(alloc, dtype, shape, affinity, *, writable=True, origin=None):
    raw = memory.host_array(alloc, writable)[:memory.nbytes_of(shape, dtype)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only mappings: writes are refused above
        host = torch.from_numpy(raw).view(dtype).view(shape)
    return UnifiedTensor._wrap(host, alloc, affinity, read_only=not writable, origin=origin)


def empty(shape, *, dtype=torch.float32, affinity="cuda", pin="require", shared=False):
    """A new uninitialised unified tensor.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : torch.dtype
    affinity : {"cuda", "host"}
        Where computation on it runs (see :mod:`directload.placement`).
    pin : {"require", "auto", "never"}
        With CUDA: pinned, mapped memory or :class:`directload.memory.PinError`
        (``"require"``), or a fallback to ordinary memory (``"auto"``).  Without
        CUDA the memory is ordinary host memory either way.
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
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    alloc = memory.allocate(memory.nbytes_of(shape, dtype), pin=pin, shared=shared)
    origin = ("shared", alloc.owner.view(-1)) if shared else None
    return _from_allocation(alloc, dtype, shape, affinity, origin=origin)


def zeros(shape, *, dtype=torch.float32, affinity="cuda", pin="require", shared=False):
    """A new unified tensor of zeros (see :func:`empty`).

    Examples
    --------
    >>> import directload
    >>> directload.zeros(3).host.tolist()
    [0.0, 0.0, 0.0]
    """
    t = empty(shape, dtype=dtype, affinity=affinity, pin=pin, shared=shared)
    t._host.zero_()
    return t


def ones(shape, *, dtype=torch.float32, affinity="cuda", pin="require", shared=False):
    """A new unified tensor of ones (see :func:`empty`).

    Examples
    --------
    >>> import directload
    >>> directload.ones(2).host.tolist()
    [1.0, 1.0]
    """
    t = empty(shape, dtype=dtype, affinity=affinity, pin=pin, shared=shared)
    t._host.fill_(1)
    return t


def to_unified(data, affinity="cuda", *, copy=False, pin="require", read_only=None):
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
    pin : {"require", "auto", "never"}
        See :func:`empty`.
    read_only : bool, optional
        Refuse writes, and register read-only with CUDA (which never forces a
        copy of private pages).  Default: whether a numpy ``data`` is read-only.

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
    if isinstance(data, UnifiedTensor):
        return data.with_affinity(affinity)
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
    if not data.is_contiguous():
        raise ValueError("data must be contiguous to be registered in place; pass data.contiguous() or copy=True")
    if copy:
        out = empty(tuple(data.shape), dtype=data.dtype, affinity=affinity, pin=pin)
        out._host.copy_(data)
        return out
    nbytes = data.numel() * data.element_size()
    rt = memory.runtime() if pin != "never" else None
    alloc = memory.Allocation(data.data_ptr(), nbytes, "host", owner=data)
    if rt is not None and nbytes:
        try:
            alloc = memory.register(data.data_ptr(), nbytes, data, rt, read_only=not writable)
        except memory.PinError:
            if pin == "require":
                raise
    origin = ("shared", data.reshape(-1).view(torch.uint8)) if data.is_shared() and nbytes else None
    return _from_allocation(alloc, data.dtype, tuple(data.shape), affinity, writable=writable, origin=origin)


def is_unified(x):
    """Whether ``x`` is a :class:`UnifiedTensor`.

    Examples
    --------
    >>> import directload, torch
    >>> directload.is_unified(torch.zeros(1)), directload.is_unified(directload.zeros(1))
    (False, True)
    """
    return isinstance(x, UnifiedTensor)


def _rebuild(origin, affinity, dtype, shape):
    """Unpickle in another process: map the same shared memory or file, copying nothing."""
    dtype = getattr(torch, dtype.split(".")[-1])
    if origin[0] == "file":
        from .files import from_file

        return from_file(**origin[1], affinity=affinity)
    return to_unified(origin[1][:memory.nbytes_of(shape, dtype)].view(dtype).view(shape), affinity, pin="auto")
