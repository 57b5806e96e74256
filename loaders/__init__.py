"""DGL DataLoader integration (drop-in ``directload.loaders.DataLoader``)."""

__all__ = []
