"""Matplotlib on the file-only Agg backend, for every report that writes a PNG."""

from __future__ import annotations

import os
import textwrap
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure
    from matplotlib.text import Text

__all__ = ["pyplot", "save_figure", "fit_titles"]

#: Pixels a title keeps clear of the edge it must fit within.
TITLE_MARGIN_PX = 8


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rewrap(text: Text, width_px: float, renderer: RendererBase) -> None:
    """Wrap each line of ``text`` at word boundaries, as wide as fits within ``width_px`` (a word wider than that
    stays whole, on a line of its own)."""
    lines = text.get_text().split("\n")
    for chars in range(max(map(len, lines)) - 1, 0, -1):
        text.set_text("\n".join(textwrap.fill(line, chars, break_long_words=False) for line in lines))
        if text.get_window_extent(renderer).width <= width_px:
            return


def fit_titles(fig: Figure) -> None:
    """Wrap every title of ``fig`` that is wider than where it sits: an axes' title within its axes (it is
    centred over them), the figure's suptitle (and any other text on the figure) within the figure.  Short
    titles stay as they are.

    Examples
    --------
    >>> from directload.harness.plotting import fit_titles, pyplot
    >>> fig, ax = pyplot().subplots(figsize=(3, 2))
    >>> _ = ax.set_title("a title far too long for a figure three inches wide, on one line")
    >>> fit_titles(fig)
    >>> ax.get_title().count("\\n") >= 1
    True
    >>> pyplot().close(fig)
    """
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's canvas has one
    figure_px = fig.bbox.width - 2 * TITLE_MARGIN_PX
    placed = [(ax.title, ax.bbox.width - TITLE_MARGIN_PX) for ax in fig.get_axes()]
    placed += [(text, figure_px) for text in fig.texts]  # suptitle() adds its text here
    for text, room in placed:
        if text.get_text() and text.get_window_extent(renderer).width > room:
            _rewrap(text, room, renderer)


def save_figure(fig: Figure, path: os.PathLike[str] | str) -> None:
    """Fit the titles (:func:`fit_titles`), lay out, write at 120 dpi and close."""
    fit_titles(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
