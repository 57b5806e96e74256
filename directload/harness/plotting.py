"""Matplotlib on the file-only Agg backend, for every report that writes a PNG."""

__all__ = ["pyplot", "save_figure"]


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path):
    """Lay out, write at 120 dpi and close."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
