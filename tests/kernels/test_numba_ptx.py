"""The Numba backend offline (no GPU): element size and line math folded to constants (no division in the
aligned and rowvec kernels), trace code compiled out of production kernels, and the real-GPU launch path
packing exactly Numba's own kernel arguments from raw pointers, allocating nothing per call."""

import ctypes
import inspect
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numba import config

from directload.kernels import numba_cuda, numba_kernels
from directload.kernels.variants import Variant

if config.ENABLE_CUDASIM:  # pragma: no cover - the simulator lane has its own tests
    pytest.skip("offline compiles need numba's real CUDA target, not the simulator", allow_module_level=True)

DIV64 = re.compile(r"\b(?:div|rem)\.[su]64\b")
DIV_ANY = re.compile(r"\b(?:div|rem)\.[su](?:16|32|64)\b")
CARRIERS = (np.uint8, np.uint16, np.uint32, np.uint64, np.complex128)
N_PARAMS = 57  # src, idx, pos, out, 3 scalars, err, stamp, 2 trace arrays (an array is 7 + 2 x ndim params)


def _params(ptx):
    return re.findall(r"\.param\s+\.(\w+)\s+\w+_param_(\d+)", ptx)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("elem_dtype", CARRIERS, ids=lambda d: np.dtype(d).name)
def test_aligned_kernel_has_no_division(elem_dtype, index_dtype):
    """The element size is a compile-time constant: no ``div``/``rem`` (it had 10 with ``elem`` an argument)."""
    ptx = numba_cuda.compile_ptx(True, elem_dtype, index_dtype)
    assert DIV64.findall(ptx) == [] and DIV_ANY.findall(ptx) == []
    assert len(_params(ptx)) == N_PARAMS  # no element-size parameter


@pytest.mark.parametrize(("elem_dtype", "lanes"), [(np.uint8, 32), (np.uint16, 1), (np.uint32, 8),
                                                    (np.uint64, 4), (np.complex128, 16)])
def test_rowvec_kernel_has_no_division(elem_dtype, lanes):
    ptx = numba_cuda.compile_kernel_ptx("rowvec", elem_dtype, np.int64, lanes=lanes)
    assert DIV_ANY.findall(ptx) == [] and len(_params(ptx)) == N_PARAMS


def test_tiered_aligned_kernel_has_no_division():
    assert DIV_ANY.findall(numba_cuda.compile_tiered_ptx(True, np.uint32)) == []


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
def test_production_kernels_never_touch_the_trace_arrays(aligned):
    """The untraced specialisation compiles the trace stores out: its trace parameters are never read."""
    kind = "aligned" if aligned else "naive"
    plain = numba_cuda.compile_kernel_ptx(kind, np.uint32, np.int64)
    traced = numba_cuda.compile_kernel_ptx(kind, np.uint32, np.int64, traced=True)
    trace_data = (N_PARAMS - 14 + 4, N_PARAMS - 7 + 4)  # the data pointers of trace_tid and trace_step
    for k in trace_data:
        assert not re.search(rf"_param_{k}\]", plain) and re.search(rf"_param_{k}\]", traced)
    assert len(re.findall(r"st\.global", plain)) < len(re.findall(r"st\.global", traced))


def test_check_clamp_compiles_per_index_type():
    for index_dtype in (np.int32, np.int64):
        ptx = numba_cuda.compile_kernel_ptx("check_clamp", np.uint8, index_dtype)
        assert ".entry" in ptx and len(_params(ptx)) == 7 + 7 + 1 + 7 + 1


# ---- the real-GPU launch path, with the driver calls recorded instead of made ----

class _Recorder(numba_cuda._DeviceLaunches):
    """The device launcher with its three driver touch points (load, stream, launch) recorded."""

    MAX_BLOCKS = 264  # an H100-like device: 132 SMs x 2 resident blocks

    def __init__(self):
        super().__init__()
        self.loads, self.launches, self.readied = [], [], []
        self._config = lambda grid, block: SimpleNamespace(grid=grid, block=block)
        self._from_handle = lambda handle: ("stream", handle)
        self._launch = lambda stream, cfg, kernel, *args: self.launches.append((stream, cfg, kernel, args))

    def _make_ready(self, device_id):
        self.readied.append(device_id)
        self._tls.ready = {device_id}

    def _load(self, device_id, spec):
        self.loads.append((device_id, spec))
        loaded = self._kernels[device_id, spec] = (("kernel", spec), self.MAX_BLOCKS, {})
        return loaded


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(numba_cuda, "_RUN", rec)
    from numba import cuda

    for name in ("device_array", "device_array_like", "to_device", "mapped_array", "pinned_array",
                 "as_cuda_array", "from_cuda_array_interface", "external_stream"):
        monkeypatch.setattr(cuda, name, _refuse(name))
    return rec


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"cuda.{name} called on a production launch")
    return refuse


def _numba_packing(monkeypatch, sig, values):
    """Numba's own kernel arguments for ``values`` (arrays as the shim a DeviceNDArray of that pointer, shape
    and dtype gives), from ``numba.cuda.dispatcher._Kernel._prepare_args``."""
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import devicearray

    monkeypatch.setattr(devicearray, "_to_strided_memory_view", lambda obj, **kw: (obj, False))
    args = []
    for ty, value in zip(sig, values, strict=True):
        dispatcher._Kernel._prepare_args(SimpleNamespace(extensions=[]), ty, value, 0, [], args)
    return args


def _shim(ptr, shape, dtype):
    from numba.cuda.cudadrv.devicearray import _StridedLayoutShim, _StridedMemoryViewShim

    dtype = np.dtype(dtype)
    strides = (shape[1] * dtype.itemsize, dtype.itemsize) if len(shape) == 2 else (dtype.itemsize,)
    layout = _StridedLayoutShim(strides_in_bytes=strides, is_contiguous_c=True, is_contiguous_f=len(shape) == 1,
                                is_contiguous_any=True)
    return _StridedMemoryViewShim(ptr=ptr, shape=tuple(shape), dtype=dtype, size=int(np.prod(shape)),
                                  _layout=layout)


def _comparable(args):
    """Each argument's 8 bytes as cuda.core passes them: a Python int as intptr_t, a ctypes value as itself."""
    return [bytes(a) if isinstance(a, ctypes._SimpleCData) else bytes(ctypes.c_int64(a)) for a in args]


@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
@pytest.mark.parametrize("variant", [Variant("rowvec", 16, 8), Variant("aligned"), Variant("naive")],
                         ids=lambda v: v.name)
def test_device_launch_packs_numbas_own_arguments(variant, sort, recorder, monkeypatch):
    src = torch.zeros(50, 100, dtype=torch.float32)  # 400-byte rows: 16-byte units for rowvec and aligned
    index = torch.arange(37, dtype=torch.int32).flip(0)
    ids, pos = torch.sort(index) if sort else (index, None)
    out = torch.empty(37, 100)
    err = torch.zeros(1, dtype=torch.int64)
    chosen = Variant(variant.kernel, variant.width, variant.lanes, sort)
    numba_cuda.launch_variant(chosen, device_id=3, src_ptr=src.data_ptr(), n_rows=50, row_bytes=400, elem_bytes=4,
                              index=ids, positions=pos, out_ptr=out.data_ptr(), err_ptr=err.data_ptr(),
                              stamp=2**64 - 2, stream_ptr=0xABC)
    (stream, cfg, kernel, args), = recorder.launches
    carrier = 4 if variant.kernel == "naive" else 16
    unit = numba_kernels.CARRIER_DTYPES[carrier]
    row_elems = 400 // carrier
    spec = (variant.kernel, carrier, 4, variant.lanes, False)
    assert recorder.loads == [(3, spec)] and kernel == ("kernel", spec) and stream == ("stream", 0xABC)
    values = (_shim(src.data_ptr(), (50, row_elems), unit), _shim(ids.data_ptr(), (37,), np.int32),
              _shim(pos.data_ptr(), (37,), np.int64) if sort else _shim(0, (0,), np.int64),
              _shim(out.data_ptr(), (37, row_elems), unit), row_elems, src.data_ptr() % 128, 50,
              _shim(err.data_ptr(), (1,), np.uint64), 2**64 - 2, _shim(0, (0,), np.int64), _shim(0, (0,), np.int32))
    want = _numba_packing(monkeypatch, numba_kernels.signature(spec), values)
    assert len(args) == N_PARAMS and _comparable(args) == _comparable(want)
    threads = 37 * {"naive": row_elems, "aligned": 32, "rowvec": variant.lanes}[variant.kernel]
    assert (cfg.grid, cfg.block) == (min(_Recorder.MAX_BLOCKS, -(-threads // 256)), 256)


def test_device_launches_reuse_kernels_configs_and_streams(recorder):
    src = torch.zeros(8000, 16, dtype=torch.int16)
    out = torch.empty(8000, 16, dtype=torch.int16)
    for n in (10, 8000, 8000, 10):  # 8000 x 16 threads want 500 blocks
        index = torch.arange(n)
        numba_cuda.launch_variant(Variant("naive"), device_id=0, src_ptr=src.data_ptr(), n_rows=8000, row_bytes=32,
                                  elem_bytes=2, index=index, positions=None, out_ptr=out.data_ptr(), err_ptr=0,
                                  stamp=0, stream_ptr=7)
    assert len(recorder.loads) == 1 and recorder.readied == [0]  # once per thread and device
    grids = [cfg.grid for _, cfg, _, _ in recorder.launches]
    assert grids == [1, _Recorder.MAX_BLOCKS, _Recorder.MAX_BLOCKS, 1]  # persistent: never more than resident
    assert recorder.launches[1][1] is recorder.launches[2][1]
    assert len(recorder._streams) == 1


def test_device_check_clamp_and_the_shared_launches_pack_numbas_arguments(recorder, monkeypatch):
    index = torch.tensor([4, -1, 2], dtype=torch.int64)
    clamped = torch.empty_like(index)
    numba_cuda.launch_check_clamp(device_id=0, index=index, clamped=clamped, n_rows=5, err_ptr=0, stamp=9,
                                  stream_ptr=0)
    spec = ("check_clamp", 0, 8, 0, False)
    values = (_shim(index.data_ptr(), (3,), np.int64), _shim(clamped.data_ptr(), (3,), np.int64), 5,
              _shim(0, (0,), np.uint64), 9)
    want = _numba_packing(monkeypatch, numba_kernels.signature(spec), values)
    assert _comparable(recorder.launches[-1][3]) == _comparable(want)
    cache, flat = torch.zeros(60, dtype=torch.int32), torch.zeros(90, dtype=torch.int32)
    where, out = torch.tensor([1, -4]), torch.empty(2, 6, dtype=torch.int32)
    numba_cuda.launch_tiered(cache, flat, where, out, aligned=True, stream=0)
    spec = ("tiered_aligned", 4, 8, 0, False)
    values = (_shim(cache.data_ptr(), (60,), np.uint32), _shim(flat.data_ptr(), (90,), np.uint32),
              _shim(where.data_ptr(), (2,), np.int64), _shim(out.data_ptr(), (2, 6), np.uint32), 6,
              cache.data_ptr() % 128, flat.data_ptr() % 128)
    want = _numba_packing(monkeypatch, numba_kernels.signature(spec), values)
    assert _comparable(recorder.launches[-1][3]) == _comparable(want)
    assert numba_cuda.launch(out, torch.tensor([1, 0]), torch.empty(2, 6, dtype=torch.int32)) == -1
    assert recorder.launches[-1][2] == ("kernel", ("aligned", 4, 8, 0, False))


def test_the_numba_internals_the_device_path_uses_exist():
    """numba-cuda internals the device launcher relies on (checked here, since no GPU runs it in CI)."""
    from numba.cuda import codegen, dispatcher
    from numba.cuda.cudadrv import driver

    assert callable(dispatcher._Kernel._prepare_args) and callable(dispatcher._Kernel.max_cooperative_grid_blocks)
    assert callable(dispatcher._Kernel.bind) and callable(codegen.CUDACodeLibrary.get_cufunc)
    assert driver.Function is driver.CudaPythonFunction and "kernel" in driver.CudaPythonFunction.__slots__
    from cuda.core import LaunchConfig, Stream, launch  # noqa: F401

    assert callable(Stream.from_handle)


def test_launch_signatures_are_the_shared_contract():
    """The keyword-only signatures every GPU backend shares (the CuPy backend has the same)."""
    variant = inspect.signature(numba_cuda.launch_variant)
    assert list(variant.parameters) == ["variant", "device_id", "src_ptr", "n_rows", "row_bytes", "elem_bytes",
                                        "index", "positions", "out_ptr", "err_ptr", "stamp", "stream_ptr"]
    clamp = inspect.signature(numba_cuda.launch_check_clamp)
    assert list(clamp.parameters) == ["device_id", "index", "clamped", "n_rows", "err_ptr", "stamp", "stream_ptr"]
    assert all(p.kind is p.KEYWORD_ONLY for p in [*list(variant.parameters.values())[1:],
                                                   *clamp.parameters.values()])


def test_carrier_choice():
    assert numba_cuda.carrier_for("rowvec", 16, 400, 4, 0x1000, 0x2000) == 16
    assert numba_cuda.carrier_for("rowvec", 8, 400, 4, 0x1000, 0x2000) == 8
    assert numba_cuda.carrier_for("rowvec", 16, 404, 4, 0x1000, 0x2000) == 4
    assert numba_cuda.carrier_for("rowvec", 16, 400, 4, 0x1004, 0x2000) == 4
    assert numba_cuda.carrier_for("aligned", 0, 404, 4, 0x1000, 0x2000) == 4
    assert numba_cuda.carrier_for("naive", 0, 400, 2, 0x1000, 0x2000) == 2
    with pytest.raises(ValueError, match="Numba backend launches"):
        numba_cuda.carrier_for("index_select", 0, 400, 4, 0, 0)


@pytest.mark.parametrize("index_bytes", [4, 8])
@pytest.mark.parametrize("out_id", [0, 1, 2])
@pytest.mark.parametrize("codec_id", [0, 1, 2])
def test_the_numba_decoding_gather_compiles_without_a_fused_multiply_add(codec_id, out_id, index_bytes):
    """The Numba CUDA decoding gather compiles offline for sm_90; its int8 decode multiplies and adds with
    libdevice's singly rounded ops (NVVM would contract a plain ``a * b + c`` into a fused multiply-add, which
    rounds once, unlike the reference decode)."""
    from directload.kernels.decode_cuda import decode_ptx

    ptx = decode_ptx(codec_id, out_id, index_bytes)
    assert ".entry" in ptx and not re.search(r"\bfma\.", ptx)
    if codec_id == 2:
        assert re.search(r"mul\.rn\.f32", ptx) and re.search(r"add\.rn\.f32", ptx)
