"""A graph's files: one ``.npy`` file a part, then ``graph.json`` naming them, written last; each checked before a
byte of it is read."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from directload.atomic import write_atomically
from directload.files import from_file
from directload.npy import CorruptFileError, NpyHeader, open_regular, read_header
from directload.unified import host_of

from .errors import GraphError
from .parts import PART_DTYPES, PARTS, dtype_name

if TYPE_CHECKING:
    from .csc import CSCGraph

__all__ = ["MANIFEST", "FORMAT", "Manifest", "save", "read_manifest", "load_parts"]

MANIFEST = "graph.json"
#: The ``format`` :func:`save` writes; :func:`read_manifest` also reads format 1 (no ``digest``).
FORMAT = 2
FIELDS = {1: ("format", "parts", "num_nodes", "num_src_nodes", "num_edges", "source"),
          2: ("format", "parts", "num_nodes", "num_src_nodes", "num_edges", "source", "digest")}
MANIFEST_BYTES = 1 << 16  # a graph's manifest is a few hundred bytes

#: The numpy dtypes of the parts, in this machine's byte order (a byte-swapped one is not among them).
_TORCH_OF = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
             np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
_JSON_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


@dataclass(frozen=True)
class Manifest:
    """A saved graph's ``graph.json`` (at ``path``), every field checked.

    Examples
    --------
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from directload.graph import CSCGraph
    >>> from directload.graph.files import read_manifest
    >>> where = Path(tempfile.mkdtemp())
    >>> CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([1, 0])).save(where, source="demo")
    >>> m = read_manifest(where)
    >>> m.format, m.parts, m.length("indptr"), m.source
    (2, ('indptr', 'indices'), (3, 'num_nodes'), 'demo')
    """

    path: Path
    format: int
    parts: tuple[str, ...]
    num_nodes: int
    num_src_nodes: int
    num_edges: int
    source: str | None
    digest: str | None

    def length(self, part: str) -> tuple[int, str]:
        """The entries ``part`` has, and the field that says so."""
        return (self.num_nodes + 1, "num_nodes") if part == "indptr" else (self.num_edges, "num_edges")


def _show(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_manifest(directory: Path) -> Manifest:
    """``directory``'s ``graph.json``, checked as a whole: a JSON object of a known format with exactly its fields,
    each of its type; else :class:`GraphError` naming the file and the field (FileNotFoundError: none)."""
    path = directory / MANIFEST
    try:
        with open_regular(path) as f:
            text = f.read(MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"no graph in {directory}: {MANIFEST} is missing (CSCGraph.save writes it "
                                "last)") from None
    except CorruptFileError as exc:
        raise GraphError(f"{exc} (a graph's {MANIFEST})") from exc
    if len(text) > MANIFEST_BYTES:
        raise GraphError(f"{path}: more than {MANIFEST_BYTES} bytes: not a graph's manifest")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise GraphError(f"{path}: not JSON ({exc}): not a graph's manifest") from exc
    if not isinstance(meta, dict):
        raise GraphError(f"{path}: a JSON {_JSON_KINDS.get(type(meta), 'value')}, not an object: not a graph's "
                         "manifest")
    fmt = meta.get("format")
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt not in FIELDS:
        raise GraphError(f"{path}: field 'format' is {_show(fmt)}; this directload reads formats "
                         f"{', '.join(map(str, FIELDS))} (save the graph again)")
    fields = FIELDS[fmt]
    for name in fields:
        if name not in meta:
            raise GraphError(f"{path}: field {name!r} is missing (format {fmt} has {', '.join(fields)})")
    for name in meta:
        if name not in fields:
            raise GraphError(f"{path}: field {_show(name)} is not one of format {fmt}'s ({', '.join(fields)})")
    for name in ("num_nodes", "num_src_nodes", "num_edges"):
        value = meta[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GraphError(f"{path}: field {name!r} is {_show(value)}; it is a count (an integer >= 0)")
    parts = _manifest_parts(path, meta["parts"])
    if meta["source"] is not None and not isinstance(meta["source"], str):
        raise GraphError(f"{path}: field 'source' is {_show(meta['source'])}; it is a string or null")
    digest = meta.get("digest")
    if fmt >= 2 and not (isinstance(digest, str) and len(digest) == 8 and all(c in "0123456789abcdef"
                                                                              for c in digest)):
        raise GraphError(f"{path}: field 'digest' is {_show(digest)}; it is 8 lowercase hex digits")
    return Manifest(path, fmt, parts, meta["num_nodes"], meta["num_src_nodes"], meta["num_edges"], meta["source"],
                     digest)


def _manifest_parts(path, parts):
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise GraphError(f"{path}: field 'parts' is {_show(parts)}; it is a list of part names")
    for name in parts:
        if name not in PARTS:
            raise GraphError(f"{path}: field 'parts' names an unknown part {_show(name)} (known: "
                             f"{', '.join(PARTS)})")
        if parts.count(name) > 1:
            raise GraphError(f"{path}: field 'parts' names {name!r} twice")
    for name in ("indptr", "indices"):
        if name not in parts:
            raise GraphError(f"{path}: field 'parts' lacks {name!r}: every graph has it")
    return tuple(parts)


def _load_part(manifest, name, mmap, affinity):
    """The part ``name``: its header checked against ``manifest`` before a byte of it is read; then mapped,
    or read from that same open file."""
    path = manifest.path.parent / f"{name}.npy"
    try:
        with open_regular(path) as f:
            head = read_header(f, path)
            dtype = _check_part(manifest, name, path, head)
            if not mmap:
                return torch.from_numpy(_read_data(f, head, path))
        t = from_file(os.fspath(path), affinity=affinity, pin="auto")
    except FileNotFoundError:
        raise GraphError(f"{path}: missing, and {manifest.path.name} field 'parts' names {name!r}") from None
    except CorruptFileError as exc:
        raise GraphError(f"{exc} (the graph's part {name!r}, field 'parts' of {manifest.path.name})") from exc
    if t.dtype != dtype or tuple(t.shape) != head.shape:
        raise GraphError(f"{path}: it changed while it was loaded (now {t.dtype} {tuple(t.shape)}); load again")
    return t


def _check_part(manifest, name, path, head: NpyHeader):
    """The part's torch dtype once its header agrees with ``manifest``; else GraphError."""
    dtype = _TORCH_OF.get(head.dtype)
    if dtype not in PART_DTYPES[name] or len(head.shape) != 1:
        allowed = " or ".join(dtype_name(d) for d in PART_DTYPES[name])
        raise GraphError(f"{path}: its header says {head.dtype.str} of shape {head.shape}; the part {name!r} is a "
                         f"1-d array of {allowed} in this machine's byte order")
    length, field = manifest.length(name)
    if head.shape[0] != length:
        raise GraphError(f"{path}: {head.shape[0]} entries, and {manifest.path.name} field {field!r} "
                         f"({getattr(manifest, field)}) gives {name!r} {length}")
    return dtype


def _read_data(f, head, path):
    array = np.empty(head.shape, head.dtype)
    view = memoryview(array).cast("B")
    f.seek(head.offset)
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise GraphError(f"{path}: it was truncated while it was read; load again")
        done += n
    return array


def save(graph: CSCGraph, directory: os.PathLike[str] | str, source: str | None) -> None:
    """:meth:`CSCGraph.save <directload.graph.CSCGraph.save>`: each part's ``.npy`` file, then ``graph.json``."""
    if source is not None and not isinstance(source, str):
        raise TypeError(f"source must be a str or None, got {type(source).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / MANIFEST
    if manifest.exists():
        manifest.unlink()  # the parts change below: no reader may take a mix of two graphs
    parts = []
    for name, t in graph.parts.items():
        if t is not None:
            # mypy cannot infer a lambda with a default argument; it takes the file as write_atomically asks
            write_atomically(directory / f"{name}.npy",
                             lambda f, t=t: np.save(f, host_of(t).cpu().numpy()))  # type: ignore[misc]
            parts.append(name)
    meta = {"format": FORMAT, "parts": parts, "num_nodes": graph.num_nodes, "num_src_nodes": graph.num_src_nodes,
            "num_edges": graph.num_edges, "source": source, "digest": graph.digest()}
    write_atomically(manifest, lambda f: f.write(json.dumps(meta).encode()))


def load_parts(directory: os.PathLike[str] | str, *, mmap: bool, affinity: str, source: str | None
               ) -> tuple[Manifest, dict[str, torch.Tensor]]:
    """The checked ``graph.json`` of ``directory`` and its parts (each header checked against it before a byte
    is read; memory-mapped unified tensors, or read whole with ``mmap=False``), for
    :meth:`CSCGraph.load <directload.graph.CSCGraph.load>`."""
    manifest = read_manifest(Path(directory))
    if source is not None and manifest.source != source:
        raise GraphError(f"{manifest.path}: field 'source' is {manifest.source!r}, not {source!r}: the graph "
                         "was built from something else")
    return manifest, {name: _load_part(manifest, name, mmap, affinity) for name in manifest.parts}
