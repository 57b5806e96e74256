"""Host bytes as numpy arrays: the views the CPU kernels and the host pool read and write through."""

import math

import numpy as np

__all__ = ["host_view", "nbytes_of"]


class _Raw:
    """Exposes ``[ptr, ptr+nbytes)`` as a numpy buffer that keeps ``owner`` alive."""

    def __init__(self, ptr, nbytes, owner, writable):
        self.owner = owner
        self.__array_interface__ = {"data": (ptr, not writable), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


def host_view(ptr, nbytes, owner, writable=True):
    """A uint8 numpy array over ``[ptr, ptr+nbytes)`` that keeps ``owner`` alive while it lives."""
    return np.asarray(_Raw(ptr, nbytes, owner, writable))


def nbytes_of(shape, dtype):
    """Bytes of a C-contiguous tensor of ``shape`` and torch ``dtype``."""
    return math.prod(shape) * dtype.itemsize
