"""The kernels compile for real GPUs with no GPU here: NVRTC for gather.cu, NVVM for Numba."""

import re

import numpy as np
import pytest

from directload.kernels import numba_cuda, nvrtc

ALL_NAMES = [nvrtc.kernel_name(a, e, i) for a in (False, True) for e in nvrtc.ELEM_TYPES for i in nvrtc.INDEX_TYPES]
TIERED_NAMES = [nvrtc.tiered_kernel_name(a, e) for a in (False, True) for e in (1, 2, 4, 8)]


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_nvrtc_ptx_has_every_specialisation(arch):
    res = nvrtc.compile_gather(arch)
    ptx = res.image.decode()
    assert f".target sm_{arch[-2:]}" in ptx
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert len(res.lowered) == len(ALL_NAMES) + len(TIERED_NAMES) == 28
    for name in ALL_NAMES + TIERED_NAMES:
        assert res.lowered[name] in entries, name


def test_nvrtc_cubin_is_an_elf():
    res = nvrtc.compile_gather("sm_90", [nvrtc.kernel_name(True, 4, 8)])
    assert res.image[:4] == b"\x7fELF"
    assert res.lowered["gather_aligned<unsigned int, long long>"].encode() in res.image


def test_nvrtc_reports_errors():
    with pytest.raises(nvrtc.NvrtcError, match="nvrtcAddNameExpression|nvrtcCompileProgram|nvrtcGetLoweredName"):
        nvrtc.compile_gather("compute_90", ["gather_aligned<no_such_type, int>"])


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("elem_dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.complex128])
def test_numba_kernels_compile_to_sm90_ptx(elem_dtype, index_dtype, aligned):
    ptx = numba_cuda.compile_ptx(aligned, elem_dtype, index_dtype, cc=(9, 0))
    assert ".target sm_90" in ptx
    kind = "_gather_aligned" if aligned else "_gather_naive"
    assert re.search(rf"\.entry\s+\w*{kind}", ptx)


def test_uint4_specialisation_issues_16_byte_vector_loads_and_stores():
    """The vector-unit kernel really loads and stores 16 bytes per lane; the 4-byte one does not."""
    for elem, vector in ((16, True), (4, False)):
        ptx = nvrtc.compile_gather("compute_90", [nvrtc.kernel_name(True, elem, 8)]).image.decode()
        loads = re.findall(r"ld\.global(?:\.nc)?\.v4\.u32", ptx)
        stores = re.findall(r"st\.global\.v4\.u32", ptx)
        assert bool(loads) == vector and bool(stores) == vector, (elem, loads, stores)


def test_numba_kernels_compile_on_any_numpy_and_numpy_is_left_as_it_was():
    # numba-cuda 0.30.4 loads np.row_stack when its NumPy support first loads, and NumPy 2.5 removed it.
    import subprocess
    import sys

    code = """
import numpy as np
before = hasattr(np, "row_stack")
from directload.kernels import numba_cuda
ptx = numba_cuda.compile_ptx(True, np.float32, np.int64, cc=(9, 0))
assert ".entry" in ptx and hasattr(np, "row_stack") == before, (before, hasattr(np, "row_stack"))
print("ok", np.__version__)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("elem_dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_numba_tiered_kernels_compile_to_sm90_ptx(elem_dtype, aligned):
    ptx = numba_cuda.compile_tiered_ptx(aligned, elem_dtype, cc=(9, 0))
    assert ".target sm_90" in ptx and "_tiered_" in ptx
