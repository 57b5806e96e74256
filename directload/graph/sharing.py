"""A graph shared once per node: each part a shared table, its description published after the parts, and one
deadline for every wait."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from directload import shm
from directload.flocks import describe_holders, holders
from directload.shared import PREFIX, SHM_DIR, SharedTableError, SharedTableTimeout, check_key, shared_table
from directload.unified import UnifiedTensor, host_of
from directload.units import check_int

from .errors import SharedGraphMismatch
from .parts import PART_DTYPES, PARTS, dtype_name

if TYPE_CHECKING:
    from .csc import CSCGraph

__all__ = ["Layout", "share"]

#: Each part's dtypes, in the order a shared graph's description numbers them.
DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)
_SHARED_LAYOUT = 2  # the version of a shared graph's description (its ".meta" table)
_POLL = 0.02


def share(key: str, build: Callable[[], CSCGraph] | None, given: CSCGraph | None, *, ranks: int | None,
          affinity: str, timeout: float, directory: os.PathLike[str] | str | None
          ) -> tuple[dict[str, UnifiedTensor], Layout, UnifiedTensor]:
    """``(parts, description, description's table)`` of the graph shared under ``key``, for
    :meth:`CSCGraph.shared <directload.graph.CSCGraph.shared>`: written by this process (``build`` makes the
    graph, called only here) or mapped from another's (``build`` None: waited for); each part checked against
    the description, and ``given`` (the graph the caller has, if any) against its digest.  Every wait ends by
    one deadline, ``timeout`` seconds from now."""
    key = _graph_key(key)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    if ranks is not None:
        check_int("ranks", ranks)
    tables = _Tables(key, time.monotonic() + timeout, dict(ranks=ranks, affinity=affinity, directory=directory))
    try:
        written: dict[str, UnifiedTensor] = {}  # the parts, where this process writes them
        if build is None:
            meta = _await_description(tables)
        else:
            meta = tables.get("meta", lambda: _publish(tables, build, written))
        layout = Layout.parse(meta, key)
        if not written and given is not None and given.digest() != layout.digest:
            raise layout.mismatch(key, "the one given", Layout.of(given))
        parts = written or {name: tables.get(name) for name in layout.dtypes}
    except SharedTableTimeout as exc:
        raise SharedTableTimeout(f"shared graph {key!r} is not whole after {timeout:g} s (one deadline for the "
                                 f"whole graph): {exc}") from exc
    layout.check_parts(key, parts)
    return parts, layout, meta


def _graph_key(key):
    """``key`` when :func:`directload.shared_table` takes it and each part's table name too."""
    check_key(key)
    longest = max((f"{key}.{name}" for name in (*PARTS, "meta")), key=len)
    if len(longest) > 200:
        raise ValueError(f"key must be at most {200 - len(longest) + len(key)} characters (its parts' tables add "
                         f"{len(longest) - len(key)}), got {len(key)}")
    return key


@dataclass(frozen=True)
class _Tables:
    """One :meth:`CSCGraph.shared` call: its key, its one deadline (``time.monotonic()``), shared_table's options."""

    key: str
    deadline: float
    options: dict

    def left(self):
        return max(0.0, self.deadline - time.monotonic())

    def get(self, name, source=None):
        """The table ``f"{key}.{name}"``, waited for by what is left of the deadline."""
        return shared_table(f"{self.key}.{name}", source, timeout=self.left(), **self.options)


@dataclass(frozen=True)
class Layout:
    """A shared graph's description, as its ``.meta`` table holds it: ``[layout version, num_nodes,
    num_src_nodes, num_edges, digest, then each part's dtype (its place in DTYPES; -1: absent)]``.

    Examples
    --------
    >>> import torch
    >>> from directload.graph import CSCGraph
    >>> g = CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([1, 0], dtype=torch.int32))
    >>> layout = Layout.of(g)
    >>> Layout.parse(layout.table(), "demo") == layout
    True
    >>> layout.describe() == f"2 nodes, 2 edges (indptr int64, indices int32), digest {g.digest()}"
    True
    """

    num_nodes: int
    num_src_nodes: int
    num_edges: int
    digest: str
    dtypes: dict

    @classmethod
    def of(cls, g: CSCGraph) -> Layout:
        """The description of the graph ``g``."""
        dtypes = {name: t.dtype for name, t in g.parts.items() if t is not None}
        return cls(g.num_nodes, g.num_src_nodes, g.num_edges, g.digest(), dtypes)

    def table(self) -> torch.Tensor:
        """The description as the ``.meta`` table holds it."""
        codes = [DTYPES.index(self.dtypes[name]) if name in self.dtypes else -1 for name in PARTS]
        return torch.tensor([_SHARED_LAYOUT, self.num_nodes, self.num_src_nodes, self.num_edges,
                             int(self.digest, 16), *codes], dtype=torch.int64)

    @classmethod
    def parse(cls, meta: torch.Tensor, key: str) -> Layout:
        """The description the ``.meta`` table of ``key`` holds; SharedTableError when it is none."""
        t = host_of(meta)
        values = t.tolist() if t.dtype == torch.int64 and t.dim() == 1 and t.numel() == 5 + len(PARTS) else []
        if not values or values[0] != _SHARED_LAYOUT or min(values[1:4]) < 0 or not 0 <= values[4] < 2**32:
            raise SharedTableError(f"shared table {key + '.meta'!r} is not the description of a shared graph "
                                   "(another program's, or another directload version's): use another key")
        dtypes = {}
        for name, code in zip(PARTS, values[5:]):
            if code == -1 and name in ("eids", "weights"):
                continue
            if not 0 <= code < len(DTYPES) or DTYPES[code] not in PART_DTYPES[name]:
                raise SharedTableError(f"shared table {key + '.meta'!r} gives the part {name!r} the dtype code "
                                       f"{code}: not a shared graph's description; use another key")
            dtypes[name] = DTYPES[code]
        return cls(values[1], values[2], values[3], f"{values[4]:08x}", dtypes)

    def describe(self) -> str:
        """Its counts, the parts' dtypes and the digest, in words."""
        parts = ", ".join(f"{name} {dtype_name(d)}" for name, d in self.dtypes.items())
        return f"{self.num_nodes} nodes, {self.num_edges} edges ({parts}), digest {self.digest}"

    def mismatch(self, key: str, what: str, other: Layout) -> SharedGraphMismatch:
        """The error for ``other`` (``what``: which graph it describes) under ``key``, where this one is."""
        return SharedGraphMismatch(f"shared graph {key!r} on this node is another graph than {what}: it has "
                                   f"{self.describe()}, {what} {other.describe()}; another job uses this key, or "
                                   "the processes build different graphs")

    def check_parts(self, key: str, parts: Mapping[str, torch.Tensor]) -> None:
        """SharedGraphMismatch unless each part has the dtype and length this description gives it."""
        for name, dtype in self.dtypes.items():
            t, length = parts[name], self.num_nodes + 1 if name == "indptr" else self.num_edges
            if t.dtype != dtype or tuple(t.shape) != (length,):
                raise SharedGraphMismatch(f"shared graph {key!r}: its table {key}.{name} holds {t.dtype} "
                                          f"{tuple(t.shape)}, its description says {dtype} ({length},): another "
                                          "job's table under this key")


def _publish(tables, build, written):
    """The writing process's part, called while it holds the description's partial table: build the graph,
    share each part (into ``written``), and return the description, which is published last."""
    g = build()
    for name, t in g.parts.items():
        if t is not None:
            written[name] = tables.get(name, host_of(t).cpu())
    return Layout.of(g).table()


def _await_description(tables):
    """The description another process shares, by the deadline: waiting for a writer to start (its partial
    table appears), for it to publish (shared_table waits on its lock), or for another writer after one
    that died before publishing."""
    where = tables.options["directory"]
    where = os.fspath(where if where is not None else SHM_DIR)
    if not os.path.isdir(where):
        raise SharedTableError(f"{where} is not a directory: shared tables live in a tmpfs such as {SHM_DIR}")
    final = os.path.join(where, PREFIX + f"{tables.key}.meta")
    writer = []  # the pids last seen holding its partial table
    failed = None
    while True:
        if os.path.lexists(final) or os.path.lexists(final + ".partial"):
            writer = _holders(final + ".partial") or writer
            try:
                return tables.get("meta")
            except SharedTableTimeout:
                raise
            except SharedTableError as exc:
                if os.path.lexists(final):
                    raise  # published, and wrong
                failed = exc  # its writer died before publishing it (shared_table removed what it left)
        if time.monotonic() >= tables.deadline:
            why = (f"its writer, {describe_holders(writer)}, stopped before publishing it (killed?)" if writer
                   else "no process started writing it")
            raise SharedTableTimeout(f"{why}; share it with source= in one process, or raise timeout=") from failed
        time.sleep(_POLL)


def _holders(path):
    """The pids holding the file ``path`` locked (its writer's, for a partial table); none where it is gone."""
    try:
        fd = shm.open_ours(path, os.O_RDONLY)
    except (shm.NotOursError, OSError):
        return []
    if fd is None:
        return []
    try:
        return holders(fd, kind="FLOCK")
    finally:
        os.close(fd)
