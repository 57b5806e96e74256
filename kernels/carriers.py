"""The one carrier table: the integer type that moves an element of each size, in each language the kernels use.

A gather copies bits, never values, so a table of any dtype is viewed as
unsigned or signed integers of its element size (bfloat16 and float16 as
16-bit, float32 as 32-bit, ...).  Every backend takes its names from here:
the CPU kernels (numpy), the bit views of tensors (torch), zero-copy views
(``__cuda_array_interface__``) and the CUDA C kernels (C++).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Carrier", "CARRIERS", "ELEMENT_SIZES"]


@dataclass(frozen=True)
class Carrier:
    """The integer type that moves one element of a size, named in each language the kernels use.

    Attributes
    ----------
    numpy, torch : str or None
        numpy and torch dtype names (None for the 16-byte vector unit, which no table has).
    typestr : str
        The ``__cuda_array_interface__`` typestr.
    cxx : str
        The C++ type in ``kernels/cuda/gather.cu``.

    Examples
    --------
    >>> CARRIERS[2].torch, CARRIERS[2].cxx  # float16 and bfloat16 rows move as 16-bit integers
    ('int16', 'unsigned short')
    >>> sorted(CARRIERS) == [*ELEMENT_SIZES, 16]
    True
    """

    numpy: str | None  # numpy dtype name (None: no host view)
    torch: str | None  # torch dtype name (None: no host view)
    typestr: str  # __cuda_array_interface__ typestr
    cxx: str      # C++ type in kernels/cuda/gather.cu


#: Element size in bytes -> its carrier.  16 bytes is the GPU's vector unit, never a table's element.
CARRIERS = {
    1: Carrier("uint8", "uint8", "|u1", "unsigned char"),
    2: Carrier("int16", "int16", "<i2", "unsigned short"),
    4: Carrier("int32", "int32", "<i4", "unsigned int"),
    8: Carrier("int64", "int64", "<i8", "unsigned long long"),
    16: Carrier(None, None, "<c16", "uint4"),
}

#: Element sizes a feature table may have.
ELEMENT_SIZES = (1, 2, 4, 8)
