"""Zero-copy views between torch, CuPy and Numba through ``__cuda_array_interface__``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .carriers import CARRIERS

if TYPE_CHECKING:
    import torch

__all__ = ["CudaArrayView", "cuda_array"]

# By element size; 16 is the vector-unit carrier (complex128 moves 16 bytes, no arithmetic).
_TYPESTR = {size: c.typestr for size, c in CARRIERS.items()}


class CudaArrayView:
    """A CUDA array interface over a device-accessible pointer.

    Used for pinned, mapped host memory: with unified virtual addressing the
    host pointer is also the device pointer (CUDA Programming Guide, "Mapped
    Memory"), so CuPy and Numba kernels can read it directly.  ``owner`` is kept
    alive as long as this view is.

    Examples
    --------
    >>> import torch
    >>> t = torch.zeros(4, 2)
    >>> view = CudaArrayView(t.data_ptr(), t.shape, t.element_size(), owner=t)
    >>> view.__cuda_array_interface__["shape"], view.__cuda_array_interface__["typestr"]  # bits, not values
    ((4, 2), '<i4')
    >>> view.owner is t
    True
    """

    def __init__(self, ptr: int, shape: Iterable[int], itemsize: int, owner: object) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "data": (int(ptr), False),  # torch 2.11 refuses read-only views
            "shape": tuple(int(s) for s in shape),
            "typestr": _TYPESTR[itemsize],
            "strides": None,
            "version": 3,
            "stream": None,  # mapped memory has no producing stream
        }


def cuda_array(t: torch.Tensor) -> torch.Tensor | CudaArrayView:
    """An object with ``__cuda_array_interface__`` for a CUDA or pinned-host torch tensor."""
    if t.is_cuda:
        return t
    return CudaArrayView(t.data_ptr(), t.shape, t.element_size(), t)
