"""CPU backend: naive and aligned row gathers compiled by Numba, run on all cores.

The backend's two launches, as :mod:`directload.kernels.registry` looks them up, and its parts:

* :mod:`~directload.kernels.cpu_launch`: :func:`launch` and :func:`launch_tiered` on a team of threads (torch's
  OpenMP team or Numba's), the choice of team (:func:`set_team`, :func:`team`) and its thread count;
* :mod:`~directload.kernels.cpu_kernels`: the Numba kernels, the row code shared by every form, and the tiered
  gather's;
* :mod:`~directload.kernels.cpu_path`: the gather's hot path, and when this process loads the kernels
  (:func:`prepare`, :func:`ready`, :data:`LOAD_AFTER_S`);
* :mod:`~directload.kernels.wait_policy`: how the idle threads of torch's team wait (:func:`wait_policy`);
* :mod:`~directload.kernels.intrinsics`: the LLVM intrinsics the kernels use (:func:`prefetch`).

Every kernel checks the whole index before it writes: one call checks and
copies, and an index out of range leaves the output untouched.

The names are imported from here (``from directload.kernels import cpu``); a setting such as
:data:`LOAD_AFTER_S` is changed in the module that reads it (``directload.kernels.cpu_path``).
"""

from __future__ import annotations

from .cpu_kernels import MEMCPY_BYTES, PREFETCH_LINES, PREFETCH_ROWS, first_invalid
from .cpu_launch import SERIAL_BYTES, get_num_threads, launch, launch_tiered, set_num_threads, set_team, team
from .cpu_path import LOAD_AFTER_S, note_fallback, prepare, ready
from .intrinsics import prefetch
from .wait_policy import LIBGOMP_SPINS, wait_policy

__all__ = ["launch", "launch_tiered", "first_invalid", "prefetch", "set_num_threads", "get_num_threads", "set_team",
           "team", "wait_policy", "LIBGOMP_SPINS", "prepare", "ready", "note_fallback", "LOAD_AFTER_S",
           "SERIAL_BYTES", "PREFETCH_ROWS", "PREFETCH_LINES", "MEMCPY_BYTES"]
