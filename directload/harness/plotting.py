"""Matplotlib on the file-only Agg backend, for every report that writes a PNG."""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["pyplot", "save_figure"]


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: os.PathLike[str] | str) -> None:
    """Lay out, write at 120 dpi and close."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
