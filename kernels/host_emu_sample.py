"""Host emulation of the GPU sampler: sample.cu's kernels built with g++, run under kernels.sampling_gpu's drivers."""

import ctypes
import functools

import torch

from . import host_emu
from .indexing import persistent_grid
from .sampling_gpu import HostReads, name_expression, run_batch, run_hop

__all__ = ["POISON", "GUARD", "Launcher", "sample_hop", "sample_batch"]

#: The byte every buffer the drivers allocate is filled with, so an element no kernel wrote shows.
POISON = 0xA5
#: Poisoned elements past the end of every buffer: a kernel writing past a buffer (a bound too small) changes them.
GUARD = 16

_P, _I64, _I32, _U64, _U = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_uint
# Per kernel: its entry point's arguments after the template types' sizes and the launch shape (sample.cu's order).
_ARGS = {
    "sample_counts": [_P, _P, _P, _P, _P, _I64, _I64, _I32, _P],
    "sample_picks": [_P] * 7 + [_I64, _I32, _U64, _I64, _P, _P, _P, _P, _P],
    "relabel_claim": [_P, _P, _I64, _P],
    "place_seeds": [_P, _P, _I64, _P, _P],
    "relabel_flag": [_P, _P, _I64, _P, _P],
    "relabel_append": [_P, _P, _I64, _P, _P, _P, _P],
    "relabel_rows": [_P, _P, _I64, _P, _P],
    "reset_marks": [_P, _P, _P, _I64],
}
_TYPES = {"sample_counts": 2, "sample_picks": 4, "reset_marks": 0}  # template types; relabel kernels: 1


@functools.cache
def _entry(kernel):
    fn = getattr(host_emu.library(), f"dl_emu_{kernel}")
    fn.restype = ctypes.c_int
    fn.argtypes = [_I32] * _TYPES.get(kernel, 1) + [_U, _U] + _ARGS[kernel]
    return fn


class Launcher:
    """Runs sample.cu's kernels on the CPU for :func:`kernels.sampling_gpu.run_hop` / ``run_batch``.

    Parameters
    ----------
    grid, block : int
        The most blocks, and the threads per block, of each launch (small, so the grid-stride loops turn).
    poison : bool
        Fill every buffer the drivers allocate with :data:`POISON`, and follow it with :data:`GUARD` poisoned
        elements that :meth:`check_guards` checks.

    Attributes
    ----------
    launched : list
        ``(name expression, args)`` of every launch, in order.
    reads : HostReads
        The host reads the drivers made (:meth:`read`), as a GPU's launcher counts them.

    Examples
    --------
    >>> launcher = Launcher()
    >>> launcher.empty(2, torch.int32, torch.device("cpu")).tolist() == [int.from_bytes(bytes([POISON]) * 4,
    ...                                                                                 "little", signed=True)] * 2
    True
    """

    def __init__(self, grid=3, block=32, poison=True, reads=None):
        self.grid, self.block, self.poison = grid, block, poison
        self.reads = reads if reads is not None else HostReads()
        self.launched = []
        self._guards = []

    def launch(self, kernel, types, threads, args):
        """Run ``kernel<types>`` over ``threads`` grid-strided threads (at most ``grid`` blocks)."""
        self.launched.append((name_expression(kernel, types), args))
        grid = persistent_grid(threads, self.grid, self.block)
        with host_emu.LOCK:
            rc = _entry(kernel)(*(t.itemsize for t in types), grid, self.block, *(int(a) for a in args))
        if rc != 0:
            raise host_emu.EmulationError(f"dl_emu_{kernel} returned {rc} for types {types}")

    def empty(self, size, dtype, device):
        """A buffer of ``size`` elements, poisoned and guarded."""
        if not self.poison:
            return torch.empty(size, dtype=dtype, device=device)
        base = torch.empty(size + GUARD, dtype=dtype, device=device)
        base.view(torch.uint8).fill_(POISON)
        self._guards.append(base[size:])
        return base[:size]

    def read(self, values):
        """``values`` as ints, counted as a host read."""
        self.reads.add()
        return values.tolist()

    def check_guards(self):
        """Raise :class:`~kernels.host_emu.EmulationError` if a kernel wrote past a buffer's end."""
        for guard in self._guards:
            if not bool((guard.view(torch.uint8) == POISON).all()):
                raise host_emu.EmulationError("a kernel wrote past the end of a buffer the drivers sized")


def _tensor(a):
    return None if a is None else torch.from_numpy(a)


def sample_hop(indptr, indices, eids, weights, frontier, fanout, replace, key, hop, *, launcher=None):
    """``kernels.sampling.sample_hop`` run by sample.cu's kernels on the CPU: numpy in, numpy out.

    >>> import numpy as np
    >>> nbr, eid, offsets = sample_hop(np.array([0, 2, 3]), np.array([1, 0, 0]), None, None, np.array([0, 1]), -1,
    ...                                False, 7, 0)
    >>> nbr.tolist(), offsets.tolist()
    ([1, 0, 0], [0, 2, 3])
    """
    launcher = launcher or Launcher()
    nbr, eid, offsets = run_hop(launcher, *map(_tensor, (indptr, indices, eids, weights, frontier)), fanout, replace,
                                key, hop)
    launcher.check_guards()
    return nbr.numpy(), eid.numpy(), offsets.numpy()


def sample_batch(indptr, indices, eids, weights, seeds, fanouts, replace, key, layout, marks, *, launcher=None):
    """``kernels.sampling.sample_batch`` run by sample.cu's kernels on the CPU: numpy in, numpy out; ``marks``
    (all zero) is used in place and returned all zero.

    >>> import numpy as np
    >>> nodes, hops, nn, ne = sample_batch(np.array([0, 1, 2, 3]), np.array([1, 2, 0]), None, None, np.array([0]),
    ...                                    [1, 1], False, 7, "pyg", np.zeros(3, np.int64))
    >>> nodes.tolist(), nn, ne
    ([0, 1, 2], [1, 1, 1], [1, 1])
    """
    launcher = launcher or Launcher()
    nodes, hops, nn, ne = run_batch(launcher, *map(_tensor, (indptr, indices, eids, weights, seeds)), fanouts,
                                    replace, key, layout, torch.from_numpy(marks))
    launcher.check_guards()
    return nodes.numpy(), [tuple(t.numpy() for t in hop) for hop in hops], nn, ne
