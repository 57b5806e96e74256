"""Crash-consistent publication of a disk store: every write makes a new generation, and one rename
publishes it (:mod:`directload.publish`'s protocol, for a store's files).

A store at ``feat.npy`` is a symbolic link to its current generation, ``feat.npy.g<N>``, whose sidecar
(``feat.npy.g<N>.dlstore.json``) and id map (``feat.npy.g<N>.dlmap.npy``) lie beside it.  A write:

1. takes an exclusive lock on the directory (one writer at a time; the kernel drops it if the writer dies;
   a second writer waits, warned), removes what killed writes of this store left behind (see below), and
   picks ``N`` above every generation present;
2. writes each file under a temporary name (``.feat.npy.<random>.<role>.partial``) and syncs it;
3. renames each to its generation name and syncs the directory: the new generation is complete, and
   nothing names it yet;
4. **publishes**: a new link to it, renamed over ``feat.npy`` (``rename(2)`` is atomic), then syncs the
   directory again;
5. removes the old generation's files (readers that have them open keep reading them).

So at every instant a reader that follows the link finds one complete generation, the old or the new
(SQLite's and RocksDB's promise for ``kill -9`` and power loss).  Every file of a generation carries the
same random token (in the headers of the data and id map, :mod:`directload.npy`'s mark, and in the
sidecar), so a reader also refuses a mix that other hands made.

Leftovers.  A write killed before step 4 leaves partials or an unpublished generation; one killed after
it, the old generation.  The next write of the same store removes exactly those, and only files it can
tell are ours: partials by their name, generation files by their name *and* our mark (or, for a sidecar,
our format), never the current generation and never anything else in the directory.

A store written by directload before generations (a plain ``feat.npy`` with ``feat.npy.dlstore.json``)
is still read, and is replaced by a linked generation the next time it is written.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Literal, Self

from directload.npy import CorruptFileError, open_regular, read_header
from directload.publish import Publication, crash_point, current

# current and crash_point are directload.publish's, named here as before; a test that kills a write at each
# step replaces directload.publish.crash_point, which every publication calls

__all__ = ["SIDECAR_SUFFIX", "ID_MAP_SUFFIX", "FORMAT", "sidecar_path", "id_map_path", "current", "StoreWrite",
           "read_sidecar_json", "MAX_SIDECAR_BYTES", "crash_point"]

SIDECAR_SUFFIX = ".dlstore.json"
ID_MAP_SUFFIX = ".dlmap.npy"
FORMAT = "directload-disk-store"
#: A sidecar is at most this long (a CRC per 4 MiB chunk: 16 MiB of sidecar covers petabytes).
MAX_SIDECAR_BYTES = 64 << 20
_ROLES = {"data": "", "map": ID_MAP_SUFFIX, "sidecar": SIDECAR_SUFFIX}


def sidecar_path(path: os.PathLike[str] | str) -> Path:
    """The sidecar of the rows at ``path`` (a generation's data file, or a store from before generations)."""
    return Path(str(path) + SIDECAR_SUFFIX)


def id_map_path(path: os.PathLike[str] | str) -> Path:
    """Where the id map of the renumbered rows at ``path`` lives (next to the file)."""
    return Path(str(path) + ID_MAP_SUFFIX)


def read_sidecar_json(path: os.PathLike[str] | str) -> dict[str, Any]:
    """A sidecar's JSON object, or :class:`CorruptFileError` naming ``path``: not a regular file, longer
    than :data:`MAX_SIDECAR_BYTES`, not UTF-8 JSON, nested too deeply, or not an object.
    ``FileNotFoundError`` when there is none."""
    with open_regular(path) as f:
        raw = f.read(MAX_SIDECAR_BYTES + 1)
    if len(raw) > MAX_SIDECAR_BYTES:
        raise CorruptFileError(f"{path}: a sidecar of over {MAX_SIDECAR_BYTES} bytes; not reading it")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptFileError(f"{path}: unreadable sidecar ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise CorruptFileError(f"{path}: not a directload disk-store sidecar (a JSON {type(meta).__name__}, not an "
                               "object)")
    return meta


def _is_ours(path, role):
    """Whether a generation-named file is one directload wrote: data and id maps carry our mark, a
    sidecar our format.  Anything unreadable or unmarked is left alone."""
    try:
        if role == "sidecar":
            return read_sidecar_json(path).get("format") == FORMAT
        with open_regular(path) as f:
            return read_header(f, path).mark is not None
    except (OSError, ValueError):
        return False


class StoreWrite(Publication):
    """One crash-consistent write of the store at ``path`` (see the module's docstring); a context manager,
    a :class:`~directload.publish.Publication` of the roles ``"data"``, ``"map"`` and ``"sidecar"``.

    ::

        with StoreWrite(path, overwrite=True) as w:
            with w.create("data") as f: ...      # rows; the header carries w.token
            with w.create("sidecar") as f: ...   # names w.data_name, w.generation and w.token
            w.commit()                           # the one atomic publish, then the old generation goes

    Leaving the block without :meth:`commit` (an exception) removes the partials and leaves the store as
    it was.  Another process writing beside it is waited for (``contention="wait"``), with a warning.

    Examples
    --------
    >>> import os, tempfile
    >>> w = StoreWrite(os.path.join(tempfile.mkdtemp(), "x.npy"))
    >>> w.name
    'x.npy'
    """

    roles = _ROLES
    required = ("sidecar",)

    def __init__(self, path: os.PathLike[str] | str, *, overwrite: bool = False,
                 contention: Literal["raise", "wait"] = "wait", timeout: float | None = None) -> None:
        super().__init__(path, contention=contention, timeout=timeout, replace=overwrite)
        self.token = ""

    def __enter__(self) -> Self:
        super().__enter__()
        self.token = secrets.token_hex(16)
        return self

    def owns(self, path: Path, role: str) -> bool:
        """Data and id maps that carry our mark, sidecars of our format."""
        return _is_ours(path, role)

    def adopts(self, path: Path) -> bool:
        """A store written before generations: a regular file beside a sidecar of ours."""
        try:
            if read_sidecar_json(sidecar_path(path)).get("format") == FORMAT:
                with open_regular(path):
                    return True
        except (OSError, ValueError):
            pass
        return False

    def foreign_message(self) -> str:
        return (f"{self.path} was not written by directload (no disk-store sidecar, or not its link); not "
                "overwriting it")

    def exists_message(self) -> str:
        return f"{self.path} exists; pass overwrite=True (--overwrite) to replace a store directload wrote"

    def tidy(self) -> None:
        """The sidecar (and id map) of the store that was here before generations, once the link replaced it."""
        side = sidecar_path(self.path)
        try:
            meta = read_sidecar_json(side)
        except (OSError, ValueError):
            return
        if meta.get("format") != FORMAT or meta.get("version") != 1:
            return
        if isinstance(meta.get("id_map"), dict) and meta["id_map"].get("file") == id_map_path(self.path).name:
            self.remove_file(id_map_path(self.path))
        self.remove_file(side)

    @property
    def data_name(self) -> str:
        """The file name of the new generation's rows."""
        return self.generation_name
