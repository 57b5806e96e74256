"""Where the CUDA C sources live and where compiled artifacts are cached (shared by NVRTC, CuPy and the emulation)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CUDA_DIR", "cache_dir"]

#: ``kernels/cuda``: gather.cu and the host-emulation shims.
CUDA_DIR = Path(__file__).with_name("cuda")


def cache_dir() -> Path:
    """``$DIRECTLOAD_CACHE``, else ``$XDG_CACHE_HOME/directload`` (``~/.cache/directload``)."""
    root = os.environ.get("DIRECTLOAD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "directload")
    return Path(root)
