"""The one carrier table: every backend's name for an element size moves exactly that many bytes."""

import numpy as np
import torch

from directload.kernels import cpu_kernels, interop, nvrtc, views
from directload.kernels.carriers import CARRIERS, ELEMENT_SIZES


def test_each_carrier_is_its_element_size_in_every_language():
    for size, c in CARRIERS.items():
        assert np.dtype(c.typestr).itemsize == size
        if size in ELEMENT_SIZES:
            assert np.dtype(c.numpy).itemsize == size and getattr(torch, c.torch).itemsize == size
            assert np.dtype(c.numpy).kind in "iu" and not getattr(torch, c.torch).is_floating_point
    assert set(ELEMENT_SIZES) < set(CARRIERS)


def test_every_backend_reads_the_same_table():
    assert {s: str(t).removeprefix("torch.") for s, t in views.TORCH_CARRIERS.items()} == \
        {s: CARRIERS[s].torch for s in ELEMENT_SIZES}
    assert {s: np.dtype(t).name for s, t in cpu_kernels.NP_CARRIER.items()} == \
        {s: CARRIERS[s].numpy for s in ELEMENT_SIZES}
    assert interop._TYPESTR == {s: c.typestr for s, c in CARRIERS.items()}
    assert nvrtc.ELEM_TYPES == {s: c.cxx for s, c in CARRIERS.items()}
