"""Compile directload's CPU kernels ahead of time, into Numba's on-disk cache: ``python -m directload.kernels.warm``.

directload's CPU kernels (the neighbour sampler, the row gathers, the decoding gathers) are Numba functions
compiled at their first call and kept in Numba's on-disk cache (``cache=True``): ``__pycache__`` beside their module, or
``$NUMBA_CACHE_DIR`` where it is set.  Compiling them takes seconds (tens on 2 cores), which a first run
would pay inside its first epoch.  :func:`compile_cpu_kernels` compiles them once for the types training
gives them, so every later process loads them from the cache instead (the cache is kept per source file,
and a changed file is compiled again).  ``scripts/dev.sh`` runs it while it sets a lane up; after a
``pip install`` run ``python -m directload.kernels.warm`` once.

Nothing imports this module: importing directload never compiles.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

__all__ = ["compile_cpu_kernels", "main"]

#: (indptr, indices) dtypes of the graphs the sampler gets: DGL's graphs are int64; directload's CSC keeps
#: int32 where the counts fit (PyG's graphs), indptr int64 beside int32 ids once edges pass 2**31.
INDEX_LAYOUTS = ((np.int64, np.int64), (np.int32, np.int32), (np.int64, np.int32))


def _tiny_graph(indptr_dtype, indices_dtype):
    """A 4-node graph in CSC: every node's in-edges from the other three."""
    n = 4
    indices = np.array([u for v in range(n) for u in range(n) if u != v], indices_dtype)
    indptr = np.arange(0, indices.shape[0] + 1, n - 1).astype(indptr_dtype)
    return indptr, indices


def _sampler():
    """The sampler's kernels, unweighted: one batch per index layout, layout and kind of pick."""
    from . import sampling

    for indptr_dtype, indices_dtype in INDEX_LAYOUTS:
        indptr, indices = _tiny_graph(indptr_dtype, indices_dtype)
        sampling.check_csc(indptr, indices.shape[0], indices, indptr.shape[0] - 1)
        eids = np.arange(indices.shape[0], dtype=np.int64)
        seeds = np.array([0, 1], np.int64)
        marks = np.zeros(indptr.shape[0] - 1, np.int64)
        for layout in ("dgl", "pyg"):
            for replace in (False, True):
                sampling.sample_batch(indptr, indices, eids, None, seeds, (2, -1), replace, 1, layout, marks)


def _gathers():
    """The row gathers: every element and index size, aligned and naive."""
    from . import cpu

    for aligned in (True, False):
        cpu.prepare(aligned=aligned, background=False)


def _decodes():
    """The decoding gathers: every codec, output dtype and index size."""
    import torch

    from .decode import prepare_decode

    prepare_decode(dtypes=(torch.float32, torch.float16, torch.bfloat16), background=False)


#: What :func:`compile_cpu_kernels` compiles, by name, in order.
PARTS = {"sampler": _sampler, "gathers": _gathers, "decodes": _decodes}


def compile_cpu_kernels(parts: Sequence[str] = tuple(PARTS)) -> dict[str, float]:
    """Compile (or load from Numba's on-disk cache) directload's CPU kernels for the types training uses.

    Parameters
    ----------
    parts : sequence of str
        Any of ``"sampler"`` (the neighbour sampler), ``"gathers"`` (the CPU row gathers) and ``"decodes"`` (the
        decoding gathers of compressed rows).

    Returns
    -------
    dict
        Seconds each part took, by name: tens of seconds the first time, well under one once cached.

    Raises
    ------
    ValueError
        An unknown part, before anything compiles.

    Examples
    --------
    >>> from directload.kernels.warm import compile_cpu_kernels
    >>> sorted(compile_cpu_kernels(["sampler"]))
    ['sampler']
    """
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown kernel parts {unknown}: choose from {list(PARTS)}")
    took = {}
    for name in parts:
        t0 = time.perf_counter()
        PARTS[name]()
        took[name] = time.perf_counter() - t0
    return took


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m directload.kernels.warm``: compile the CPU kernels and say how long it took."""
    p = argparse.ArgumentParser(prog="python -m directload.kernels.warm", description=__doc__.split("\n\n")[0])
    p.parse_args(argv)
    t0 = time.perf_counter()
    took = compile_cpu_kernels()
    print(f"directload's CPU kernels are in Numba's cache ({time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
