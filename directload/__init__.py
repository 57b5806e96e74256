"""directload: GPU-centric feature loading for mini-batch GNN training."""

__version__ = "0.1.0"

__all__ = ["__version__"]
