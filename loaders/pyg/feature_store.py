"""``FeatureStore``: PyG's feature-store interface over directload tables, with one batched gather per batch."""

from __future__ import annotations

import torch
from torch_geometric.data import FeatureStore as _PygFeatureStore
from torch_geometric.data import TensorAttr

from directload.stores import FeatureStore as _Store
from directload.stores import TensorStore, check_table

__all__ = ["FeatureStore"]


def _key(attr):
    return attr.group_name, attr.attr_name


def _is_store(table):
    return isinstance(table, _Store)


class FeatureStore(_PygFeatureStore):
    """Node features for PyG's loaders, gathered by directload's kernels.

    A table is a :func:`directload.to_unified` tensor (zero-copy GPU gathers
    from pinned host memory), any other tensor or array, or a
    :class:`directload.stores.FeatureStore` (a ``DiskStore``, a cache).
    Every read goes through a store: a tensor is wrapped in a
    :class:`~directload.stores.TensorStore` at each read, so the table as it
    is then is read.
    ``NeighborLoader`` calls :meth:`multi_get_tensor` once per batch with
    every node attribute; this store starts every gather before it waits for
    any.

    Parameters
    ----------
    device : str or torch.device, optional
        Where gathered rows go.  ``None`` (the default): the index's device.

    Notes
    -----
    Memory contract of a read (``get_tensor``/``multi_get_tensor`` with an
    index):

    =====================  ==========================  ===================
    table                  index / ``device``          result
    =====================  ==========================  ===================
    unified, pinned, CUDA  CUDA (or ``device`` CUDA)   CUDA, zero-copy
                                                       gather on the GPU
    host tensor            CPU, ``device`` CPU/None    CPU, parallel CPU
                                                       gather (pooled
                                                       output from 1 MiB)
    host tensor            CPU, ``device`` CUDA        CPU gather, then
                                                       copied to CUDA
    store                  any                         what the store's
                                                       ``gather`` returns
    =====================  ==========================  ===================

    A result is a new tensor (never a view of the table); it carries no
    autograd history.  Without an index the table itself is returned.

    Examples
    --------
    >>> import torch
    >>> from directload.loaders.pyg import FeatureStore
    >>> store = FeatureStore()
    >>> store.put_tensor(torch.arange(12.0).reshape(4, 3), group_name=None, attr_name="x", index=None)
    True
    >>> store.get_tensor(group_name=None, attr_name="x", index=torch.tensor([3, 0]))
    tensor([[ 9., 10., 11.],
            [ 0.,  1.,  2.]])
    """

    def __init__(self, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.__dict__["_tables"] = {}
        self.__dict__["device"] = torch.device(device) if device is not None else None

    # -- PyG's hooks --------------------------------------------------------------------
    def _put_tensor(self, tensor, attr):
        key = _key(attr)
        if attr.index is None:
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 0:
                raise ValueError(f"{key}: a feature table needs at least one dimension (rows)")
            if not isinstance(tensor, torch.Tensor) and not _is_store(tensor):
                check_table(str(key), tensor)
                tensor = torch.as_tensor(tensor)
            self._tables[key] = tensor
            return True
        if key not in self._tables:
            raise KeyError(f"no table {key!r} to write rows into; put the whole table first (index=None)")
        self._tables[key][attr.index] = tensor
        return True

    def _get_tensor(self, attr):
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs):
        finishers = [self._start(attr) for attr in attrs]  # every gather starts before any is waited on
        return [finish() for finish in finishers]

    def _remove_tensor(self, attr):
        return self._tables.pop(_key(attr), None) is not None

    def _get_tensor_size(self, attr):
        table = self._tables.get(_key(attr))
        if table is None:
            return None
        return tuple(table.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=group, attr_name=name) for group, name in self._tables]

    # -- directload ---------------------------------------------------------------------
    def table(self, group_name: str | None, attr_name: str) -> torch.Tensor | _Store:
        """The table stored for ``(group_name, attr_name)``; ``KeyError`` as PyG's own stores raise."""
        try:
            return self._tables[group_name, attr_name]
        except KeyError:
            have = ", ".join(f"{g}/{n}" for g, n in self._tables) or "none"
            raise KeyError(f"no tensor {attr_name!r} in group {group_name!r} (stored: {have})") from None

    def stores(self) -> list[_Store]:
        """The directload stores among the tables (they take hints and count their reads)."""
        return [table for table in self._tables.values() if _is_store(table)]

    def prefetch(self, ids: torch.Tensor, group_name: str | None = None) -> None:
        """Tell the stores behind ``group_name``'s attributes which rows come next (a hint)."""
        for (group, _), table in self._tables.items():
            if group == group_name and _is_store(table):
                table.prefetch(ids)

    def _start(self, attr):
        table = self.table(attr.group_name, attr.attr_name)
        index = attr.index
        if index is None:
            return lambda: table
        if not isinstance(index, torch.Tensor):
            index = torch.as_tensor(index)
        device = self.device if self.device is not None else index.device
        if isinstance(table, torch.Tensor) and table.is_cuda and self.device is None:
            device = table.device  # as PyG does: the index goes where the table is
        if _is_store(table):
            return table.read_async(index, device=device).wait
        if index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"index must be int32 or int64 node ids, got {index.dtype}")
        # Tables the kernels do not take (autograd, subclasses, odd dtypes) are read by torch's
        # index_select inside the TensorStore, as PyG would read them.
        return TensorStore(table).read_async(index, device=device).wait

    def __repr__(self):
        names = ", ".join(f"{g}/{n}{tuple(t.shape)}" for (g, n), t in self._tables.items())
        return f"{type(self).__name__}({names})"
