"""The decoding gather: ``gather(EncodedTable, ids, out=)`` writes decoded rows straight into ``out``.

A table of codes (:class:`directload.codecs.EncodedTable`) is gathered by one of two paths, each bit for bit the
reference decode (:meth:`directload.codecs.Codec.decode`) of the gathered code rows:

* the fused kernel, which reads each code row once, whole, and writes the decoded features into ``out`` with no
  copy of the codes in between: on the CPU :mod:`directload.kernels.decode_cpu` on torch's thread team, on a GPU
  ``gather_decode`` of ``kernels/cuda/gather.cu`` through CuPy;
* torch's own path: ``index_select`` of the code rows, then the decode in torch.

CPU ids: the fused kernel once it is loaded in this process (loads start as the plain gather's do, once torch's
path has gathered for :data:`LOAD_AFTER_S`; :func:`prepare_decode` loads at once, as a training run does);
torch's path before, or where torch has no OpenMP team.  CUDA ids: the faster of the two, timed with CUDA events
on the first gather of a kind (device, codec, output dtype, row bytes, a power-of-two bucket of the id count) and
kept for the process; ``DIRECTLOAD_TUNE=0`` takes the fused kernel.  Without CuPy (the Numba backend), torch's
path runs on a GPU; the Numba CUDA kernel (:mod:`directload.kernels.decode_cuda`) serves the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from directload.codecs import DECODED_DTYPES, CodecError, EncodedTable
from directload.units import dtype_name

from . import cpu_path, futures, gpu_path
from .cpu_launch import launch_decode, team
from .decode_cpu import CODEC_IDS, OUT_IDS, decode_team_kernel
from .devices import memory_of
from .futures import GatherFuture
from .loads import KernelLoads
from .operands import as_index, check_devices, check_no_overlap, check_out, out_of_range
from .registry import backend_module, choose_backend
from .tune_keys import key_for
from .tuner import CudaEventTimer, time_candidates, tuning_enabled
from .variants import Variant

__all__ = ["gather_encoded", "prepare_decode", "decode_ready", "torch_path", "FUSED", "TORCH_PATH", "LOAD_AFTER_S"]

#: The tuner's names of the two paths on a GPU: the fused kernel, and torch's index_select then decode.
FUSED, TORCH_PATH = Variant("rowvec", 16, 32), Variant("index_select")


def gather_encoded(table: EncodedTable, index: torch.Tensor | np.ndarray, *, out: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None, backend: str = "auto", background: bool = False,
                   strict: bool = False, path: str | None = None) -> GatherFuture:
    """Start ``out[i] = decode(table.codes[index[i]])`` and return its future (what ``gather_async`` does for an
    :class:`~directload.codecs.EncodedTable`; ``gather`` waits for it).

    ``dtype`` is the decoded dtype (float32, float16 or bfloat16): ``out``'s when given, else float32.  The
    checks, devices and errors are the plain gather's (:func:`directload.kernels.gather`): ``TypeError`` for an
    ``out`` of another dtype (or one that ``dtype`` contradicts), :class:`~directload.codecs.CodecError` for a
    ``dtype`` no decode writes.

    ``path`` forces a GPU gather's path (benchmarks and tests compare them): ``"fused"`` (the fused kernel,
    through CuPy) or ``"torch"`` (``index_select`` then the decode); None: the faster, as timed.  CPU ids
    ignore it.
    """
    if not isinstance(table, EncodedTable):
        raise TypeError(f"gather_encoded takes an EncodedTable, got {type(table).__name__}")
    if path not in (None, "fused", "torch"):
        raise ValueError(f"path must be None, 'fused' or 'torch', got {path!r}")
    if isinstance(out, torch.Tensor) and out.dtype not in DECODED_DTYPES:
        raise TypeError(f"a decoding gather writes float32, float16 or bfloat16 rows, got out of {out.dtype}")
    if dtype is None:
        dtype = out.dtype if isinstance(out, torch.Tensor) else torch.float32
    if dtype not in DECODED_DTYPES:
        raise CodecError(f"a decode writes float32, float16 or bfloat16, not {dtype}")
    rows, dim = table.shape
    index = as_index(index, rows, cpu_bounds=False, strict=strict)
    device = index.device
    codes = table.codes
    if index.is_cuda:
        location = memory_of(codes)
        location = location if isinstance(location, str) else "cuda"
        name = choose_backend(backend, True, location)
        check_devices(device, location, codes.device)
    else:
        name = choose_backend(backend, False, "cuda" if codes.is_cuda else "host")
    if out is None:
        out = (cpu_path.new_output((index.shape[0], dim), dtype) if not index.is_cuda
               else torch.empty((index.shape[0], dim), dtype=dtype, device=device))
    else:
        check_out(out, (index.shape[0], dim), dtype, device)
        check_no_overlap(out, codes, index)
    if index.is_cuda:
        return _start_gpu(table, index, out, name, path)
    if background:
        return futures.submit(lambda: _run_cpu(table, index, out), out)
    return GatherFuture(None, _run_cpu(table, index, out))


# ---------------------------------------------------------------- CPU

#: Seconds of gathering on torch's path after which a process loads the decoding kernel (the plain gather waits
#: :data:`directload.kernels.cpu_path.LOAD_AFTER_S`, 5 s, for a kernel 7-19% faster than torch's path).  Torch's
#: path decodes at 0.08-0.83x the kernel's rows/s (measured, ``bench codecs``), so the load (about 0.75 s in a
#: process that has loaded no Numba kernel yet, 0.3 s after) pays after about a second; a 3-epoch run on
#: synth-small gathered int8 rows 5.6x slower than float32 ones while it waited for the 5 s.
LOAD_AFTER_S = 1.0


def _load(key: tuple[str, str, int]) -> None:
    decode_team_kernel(*key)


#: The decoding kernels in this process, by (codec, output dtype's name, index size).
LOADS: KernelLoads[tuple[str, str, int]] = KernelLoads(_load, name="directload-decode-load")


def _key(codec_name: str, out_dtype: torch.dtype, index_size: int) -> tuple[str, str, int]:
    return codec_name, dtype_name(out_dtype), int(index_size)


def decode_ready(codec_name: str, out_dtype: torch.dtype, index_size: int) -> bool:
    """Whether this process has loaded the CPU kernel decoding ``codec_name`` to ``out_dtype`` by ids of
    ``index_size`` bytes (a gather then runs it at once)."""
    return LOADS.ready(_key(codec_name, out_dtype, index_size))


def prepare_decode(codecs: Sequence[str] = tuple(CODEC_IDS), dtypes: Sequence[torch.dtype] = (torch.float32,),
                   index_sizes: Sequence[int] = (8, 4), *, background: bool = True) -> None:
    """Load the CPU decoding kernels of these codecs, output dtypes and index sizes (from Numba's on-disk cache;
    compiled once per machine): on a daemon thread (``background``, the default) or now (a failed load raises).
    Idempotent.  Not where torch has no OpenMP team (torch's path gathers there), nor in a forked child (see
    ``cpu_path.prepare``)."""
    if team() != "torch":
        return
    LOADS.prepare([_key(c, d, i) for c in codecs for d in dtypes for i in index_sizes], background=background)


def _run_cpu(table, index, out):
    """The CPU decoding gather, checked: ``out``, or ``IndexError`` (nothing written)."""
    key = _key(table.codec.name, out.dtype, index.element_size())
    if LOADS.ready(key):
        bad = launch_decode(table.codes, index, out, table.codec.name)
    else:
        t0 = time.perf_counter()
        bad = torch_path(table, index, out)
        if team() == "torch":
            LOADS.note_fallback(time.perf_counter() - t0, [key], after=LOAD_AFTER_S)
    if bad >= 0:
        raise out_of_range(int(index[bad]), table.codes.shape[0], position=bad)
    return out


def torch_path(table: EncodedTable, index: torch.Tensor, out: torch.Tensor) -> int:
    """Torch's own path on the CPU: ``index_select`` of the code rows, then the reference decode into ``out``
    (what runs until the kernel is loaded; benchmarks time it beside the kernel).  ``index`` a contiguous CPU
    int32/int64 tensor, ``out`` ``[len(index), dim]`` of a decoded dtype.  Returns -1, or the position of the
    first id out of range (then nothing was written)."""
    bad = cpu_path.first_out_of_range(index, table.codes.shape[0])
    if bad < 0:
        out.copy_(table.codec.decode(torch.index_select(table.codes, 0, index), out.dtype))
    return bad


# ---------------------------------------------------------------- GPU

_choices: dict[tuple, Variant] = {}


def _start_gpu(table, index, out, backend, path=None):
    """Start the decoding gather of CUDA ids on the caller's current stream: no host sync; ids checked by the
    kernels (``kernels.bounds``), as a plain GPU gather's."""
    codes = table.codes
    entry = gpu_path.table_for(codes, index.device, backend)
    n = index.shape[0]
    if n and entry.n_rows == 0:
        raise out_of_range(int(index[0]), 0, position=0)
    if n == 0 or out.shape[1] == 0:
        if n:
            gpu_path.start(entry, index, torch.empty((n, 0), dtype=codes.dtype, device=index.device), None)
        return GatherFuture(None, out)
    stream = torch.cuda.current_stream(index.device)
    with torch.cuda.device(index.device):
        if path is None:
            variant = _choice(table, entry, index, out, backend)
        elif path == "fused" and backend == "cupy":  # only CuPy runs the fused kernel on a GPU
            variant = FUSED
        else:
            variant = TORCH_PATH
        stamp = _launch(table, entry, index, out, variant, backend, stream)
    return GatherFuture(None, out, stream, entry.bounds, stamp)


def _launch(table, entry, index, out, variant, backend, stream):
    bounds = entry.bounds
    bounds.raise_pending()
    stamp = bounds.stamp(index, entry.n_rows)
    if variant == FUSED and backend == "cupy":
        backend_module(backend).launch_decode(
            device_id=entry.device_index, codes_ptr=entry.ptr, n_rows=entry.n_rows, code_row_bytes=entry.row_bytes,
            dim=out.shape[1], codec_id=CODEC_IDS[table.codec.name], out_id=OUT_IDS[dtype_name(out.dtype)], index=index,
            out_ptr=out.data_ptr(), err_ptr=bounds.ptr, stamp=stamp, stream_ptr=stream.cuda_stream)
    else:
        clamped = torch.empty_like(index)
        entry.launch_check_clamp(device_id=entry.device_index, index=index, clamped=clamped, n_rows=entry.n_rows,
                                 err_ptr=bounds.ptr, stamp=stamp, stream_ptr=stream.cuda_stream)
        out.copy_(table.codec.decode(torch.index_select(entry.view(), 0, clamped), out.dtype))
    return stamp


def _choice(table, entry, index, out, backend):
    """The path for this kind of gather: timed once per process (torch's path first), else the fused kernel."""
    if backend != "cupy":
        return TORCH_PATH
    kind = (entry.device, table.codec.name, out.dtype, entry.row_bytes, index.shape[0].bit_length())
    found = _choices.get(kind)
    if found is not None:
        return found
    if not tuning_enabled():
        found = FUSED
    else:
        n = index.shape[0]
        ids = torch.randint(0, entry.n_rows, (n,), device=index.device)
        scratch = torch.empty_like(out)
        stream = torch.cuda.current_stream(index.device)
        key = key_for(entry.device, entry.row_bytes, entry.elem, n, entry.n_rows)
        record = time_candidates(key, [TORCH_PATH, FUSED],
                                 lambda v: _launch(table, entry, ids, scratch, v, backend, stream),
                                 timer=CudaEventTimer())
        found = FUSED if record.chosen == FUSED.name else TORCH_PATH
    _choices[kind] = found
    return found
