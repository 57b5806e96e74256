"""Gather kernels: naive and aligned row gathers on CPU, Numba CUDA and CuPy."""

from .api import BACKENDS, GatherFuture, gather, gather_async, resolve_backend

__all__ = ["gather", "gather_async", "GatherFuture", "resolve_backend", "BACKENDS"]
