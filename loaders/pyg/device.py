"""PyG's batches made on a device: the data as PyG's filters index it there, and a finished batch's leftovers
moved after it.

With ``device=`` a directload PyG loader hands PyG :func:`device_data`: every node and edge table a
:class:`~directload.batch_device.DeviceTable` (PyG's ``index.to(table.device)`` then keeps the sampled ids on
the device, and its ``index_select`` runs directload's gather from the table's pinned, mapped bytes into device
memory), and every other tensor moved once.  :func:`on_device` moves what PyG's own code leaves on the host (the
seeds' positions ``input_id``, a link batch's labels) without a wait.
"""

from __future__ import annotations

from typing import Any

import torch
from torch_geometric.data import Data, HeteroData

from directload.batch_device import BatchDevice, batch_device

__all__ = ["device_data", "on_device", "resolve_device"]


def resolve_device(device: torch.device | str | BatchDevice | None, num_workers: int) -> BatchDevice | None:
    """The :class:`~directload.batch_device.BatchDevice` a loader's ``device=`` asks for (None: the CPU), checked
    before any work: the device path samples in the loader's own process, so it takes no workers.

    >>> resolve_device(None, 0) is None and resolve_device("cpu", 4) is None
    True
    """
    path = batch_device(device)
    if path is not None and num_workers:
        raise ValueError(f"device={getattr(path, 'name', device)!r} makes batches on the GPU in this process; "
                         f"num_workers={num_workers} would fork workers that cannot use it: leave num_workers at 0")
    return path


def device_data(data: Data | HeteroData, path: BatchDevice) -> Data | HeteroData:
    """A shallow copy of ``data`` whose node and edge tables are ``path.table`` s and whose other tensors are on
    ``path``'s device; ``data`` itself is not changed (its tables may be pinned in place)."""
    out = data.__copy__()
    for store in out.stores:
        for key, value in list(store.items()):
            if not isinstance(value, torch.Tensor):
                continue
            if store.is_node_attr(key) or store.is_edge_attr(key):
                store[key] = path.table(value)
            else:
                store[key] = path.upload(value)
    return out


def on_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor on ``device``: those there stay, the rest are copied without a wait."""
    return batch.to(device, non_blocking=True) if device.type != "cpu" else batch
