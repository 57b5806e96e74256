"""The kernels compile for real GPUs with no GPU here: NVRTC for gather.cu, NVVM for Numba."""

import re

import numpy as np
import pytest
import torch

from directload.kernels import cupy_backend, numba_cuda, nvrtc
from directload.kernels.variants import Variant

ALL_NAMES = [nvrtc.kernel_name(a, e, i) for a in (False, True) for e in nvrtc.ELEM_TYPES for i in nvrtc.INDEX_TYPES]
TIERED_NAMES = [nvrtc.tiered_kernel_name(a, e) for a in (False, True) for e in (1, 2, 4, 8)]
ROWVEC_NAMES = [nvrtc.rowvec_kernel_name(w, i) for w in nvrtc.ROWVEC_WIDTHS for i in nvrtc.INDEX_TYPES]
CLAMP_NAMES = [nvrtc.check_clamp_kernel_name(i) for i in nvrtc.INDEX_TYPES]
DECODE_NAMES = [nvrtc.decode_kernel_name(c, o, i) for c in range(3) for o in range(3) for i in nvrtc.INDEX_TYPES]
NAIVE_NAMES = [nvrtc.kernel_name(False, e, i) for e in nvrtc.ELEM_TYPES for i in nvrtc.INDEX_TYPES]
#: Any 64-bit integer division or remainder (PTX spells them div/rem.{s,u}64).
DIV64 = re.compile(r"\b(?:div|rem)\.[su]64\b")


@pytest.fixture(scope="module")
def ptx90():
    """Every specialisation compiled once for compute_90: ``(CompileResult, {name expression: PTX of its entry})``."""
    res = nvrtc.compile_gather("compute_90")
    ptx = res.image.decode()
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"\.entry\s+(\w+)\(", ptx)]
    bodies = {sym: ptx[a:b] for (a, sym), (b, _) in zip(starts, [*starts[1:], (len(ptx), None)])}
    return res, {name: bodies[sym] for name, sym in res.lowered.items()}


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_nvrtc_ptx_has_every_specialisation(arch):
    res = nvrtc.compile_gather(arch)
    ptx = res.image.decode()
    assert f".target sm_{arch[-2:]}" in ptx
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    names = ALL_NAMES + TIERED_NAMES + ROWVEC_NAMES + CLAMP_NAMES + DECODE_NAMES
    assert len(res.lowered) == len(names) == len(set(names)) == 58
    assert sorted(names) == sorted(nvrtc.all_kernel_names())
    for name in names:
        assert res.lowered[name] in entries, name


@pytest.mark.parametrize("index_bytes", [4, 8])
@pytest.mark.parametrize("width, load", [(16, r"ld\.global(?:\.nc)?\.v4\.u32"),
                                         (8, r"ld\.global(?:\.nc)?\.(?:u64|v2\.u32)"),
                                         (4, r"ld\.global(?:\.nc)?\.u32")])
def test_rowvec_body_loads_whole_vectors_of_its_width(ptx90, width, load, index_bytes):
    """rowvec's row loop issues loads of its full width (four of them in flight before its stores)."""
    body = ptx90[1][nvrtc.rowvec_kernel_name(width, index_bytes)]
    assert len(re.findall(load, body)) >= 4, (width, re.findall(r"ld\.global\S*", body))
    if width == 16:
        assert re.search(r"st\.global\.v4\.u32", body)  # and stores them whole where the output allows
    else:
        assert not re.search(r"ld\.global(?:\.nc)?\.v4", body)


def test_rowvec_and_naive_bodies_have_no_64_bit_division(ptx90):
    """The per-row and per-element arithmetic is shifts, masks and multiplies: no div/rem.s64/u64 anywhere in
    rowvec or naive (the old naive kernel had a 64-bit / and % per element)."""
    for name in ROWVEC_NAMES + NAIVE_NAMES:
        body = ptx90[1][name]
        assert not DIV64.search(body), (name, DIV64.findall(body))
    assert DIV64.search("div.s64 \t%rd9, %rd7, %rd8;") and DIV64.search("rem.u64 %rd1, %rd2, %rd3;")


def _param_bytes(body):
    return [int(bits) // 8 for bits in re.findall(r"\.param\s+\.[usb](\d+)\s", body.split(")", 1)[0])]


def test_cupy_launches_pass_arguments_of_the_kernels_parameter_sizes(ptx90, monkeypatch):
    """No GPU needed: each CuPy launch's numpy scalars match its kernel's PTX parameters one by one."""
    launched = []
    monkeypatch.setattr(cupy_backend, "_run", lambda dev, name, threads, args, stream: launched.append((name, args)))
    rows = torch.zeros(10, 20, dtype=torch.int32)
    for dtype in (torch.int32, torch.int64):
        ids = torch.arange(4, dtype=dtype)
        common = dict(device_id=0, src_ptr=rows.data_ptr(), n_rows=10, row_bytes=80, elem_bytes=4, index=ids,
                      positions=torch.arange(4), out_ptr=rows.data_ptr(), err_ptr=0, stamp=3, stream_ptr=0)
        for variant in (Variant("rowvec", 16, 8), Variant("rowvec", 1, 32, True), Variant("naive"),
                        Variant("aligned")):
            cupy_backend.launch_variant(variant, **common)
        cupy_backend.launch_check_clamp(device_id=0, index=ids, clamped=ids.clone(), n_rows=10, err_ptr=0, stamp=3,
                                        stream_ptr=0)
    assert len(launched) == 10
    for name, args in launched:
        assert all(isinstance(a, np.generic) for a in args), name
        assert [a.itemsize for a in args] == _param_bytes(ptx90[1][name]), name
    assert "gather_aligned<uint4, int>" in [n for n, _ in launched]  # 80-byte rows, 16-byte aligned tables


def test_cupy_launch_refuses_the_index_select_candidate():
    with pytest.raises(ValueError, match="not 'index_select'"):
        cupy_backend.launch_variant(Variant("index_select"), device_id=0, src_ptr=0, n_rows=1, row_bytes=4,
                                    elem_bytes=4, index=torch.zeros(1, dtype=torch.int64), positions=None,
                                    out_ptr=0, err_ptr=0, stamp=0, stream_ptr=0)


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


@pytest.mark.parametrize("name", DECODE_NAMES)
def test_the_decoding_gather_rounds_each_step_and_never_divides_64_bit(ptx90, name):
    """The int8 decode is code * scale rounded, then + offset rounded (the reference decode's two torch ops): the
    PTX multiplies and adds with explicit rounding (``mul.rn``/``add.rn``, which ptxas never fuses) and has no
    fused multiply-add; the grid stride divides no 64-bit integer."""
    _, bodies = ptx90
    body = bodies[name]
    assert not re.search(r"\bfma\.", body), name
    assert not DIV64.search(body), name
    if name.startswith("gather_decode<2"):
        assert re.search(r"mul\.rn\.f32", body) and re.search(r"add\.rn\.f32", body), name
