"""Crash-consistent publication of a disk store: every write makes a new generation, and one rename
publishes it.

A store at ``feat.npy`` is a symbolic link to its current generation, ``feat.npy.g<N>``, whose sidecar
(``feat.npy.g<N>.dlstore.json``) and id map (``feat.npy.g<N>.dlmap.npy``) lie beside it.  A write:

1. takes an exclusive lock on the directory (one writer at a time; the kernel drops it if the writer dies),
   removes what killed writes of this store left behind (see below), and picks ``N`` above every
   generation present;
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

import contextlib
import fcntl
import json
import os
import re
import secrets
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Self

from directload.atomic import fsync_dir, new_partial, partial_pattern
from directload.npy import CorruptFileError, open_regular, read_header

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


def crash_point(step: str) -> None:
    """Called after every step of a write (``step`` names it); does nothing.  The crash-consistency tests
    replace it in a child process to kill that process at each step in turn (SQLite's crash-point
    injection), so every instant of a write is tried."""


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


def _generation_re(name):
    return re.compile(re.escape(name) + r"\.g([0-9]{1,18})(" + "|".join(re.escape(s) for s in _ROLES.values() if s)
                      + r")?")


def current(path: os.PathLike[str] | str) -> tuple[Path, int] | tuple[None, None]:
    """``(generation file, N)`` when ``path`` is a link to its generation ``N`` (``path.g<N>`` beside it),
    else ``(None, None)``.  Reads the link only; the generation may be missing."""
    path = Path(path)
    try:
        target = os.readlink(path)
    except (FileNotFoundError, NotADirectoryError, OSError):
        return None, None
    found = re.fullmatch(re.escape(path.name) + r"\.g([0-9]{1,18})", target)
    if found is None:
        return None, None
    return path.parent / target, int(found.group(1))


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


class StoreWrite:
    """One crash-consistent write of the store at ``path`` (see the module's docstring); a context manager.

    ::

        with StoreWrite(path, overwrite=True) as w:
            with w.create("data") as f: ...      # rows; the header carries w.token
            with w.create("sidecar") as f: ...   # names w.data_name, w.generation and w.token
            w.commit()                           # the one atomic publish, then the old generation goes

    Leaving the block without :meth:`commit` (an exception) removes the partials and leaves the store as
    it was.  ``is_ours`` says whether ``path`` was a store directload wrote (checked with ``overwrite``).

    Examples
    --------
    >>> import os, tempfile
    >>> w = StoreWrite(os.path.join(tempfile.mkdtemp(), "x.npy"))
    >>> w.name
    'x.npy'
    """

    def __init__(self, path: os.PathLike[str] | str, *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.directory = self.path.parent
        self.name = self.path.name
        self._overwrite = overwrite
        self._lock_fd: int | None = None
        self._partials: dict[str, Path] = {}
        self._committed = False

    # ------------------------------------------------------------ ownership
    def _old_store(self):
        """What is at ``path``: ``("none", None)``, ``("link", generation file)`` for our link,
        ``("plain", None)`` for a store written before generations, or ``("foreign", None)``."""
        if not os.path.lexists(self.path):
            return "none", None
        target, _ = current(self.path)
        if target is not None:
            return "link", target
        if os.path.islink(self.path):
            return "foreign", None
        try:
            if read_sidecar_json(sidecar_path(self.path)).get("format") == FORMAT:
                with open_regular(self.path):
                    return "plain", None
        except (OSError, ValueError):
            pass
        return "foreign", None

    def __enter__(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                warnings.warn(f"{self.directory}: another directload process is writing a store here; waiting for "
                              "it to finish", RuntimeWarning, stacklevel=2)
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            kind, self._old_target = self._old_store()
            if kind == "foreign":
                raise FileExistsError(f"{self.path} was not written by directload (no disk-store sidecar, or not "
                                      "its link); not overwriting it")
            broken = kind == "link" and not os.path.exists(self._old_target)  # its generation is gone
            if kind != "none" and not broken and not self._overwrite:
                raise FileExistsError(f"{self.path} exists; pass overwrite=True (--overwrite) to replace a store "
                                      "directload wrote")
            self._old_kind = kind
            keep = None if self._old_target is None else self._old_target.name
            self.sweep(keep)
            self.generation = 1 + max(self._generations_present(), default=0)
            self.token = secrets.token_hex(16)
        except BaseException:
            self._unlock()
            raise
        return self

    def _generations_present(self):
        pattern = _generation_re(self.name)
        out = []
        for entry in os.scandir(self.directory):
            found = pattern.fullmatch(entry.name)
            if found:
                out.append(int(found.group(1)))
        _, now = current(self.path)
        return out + ([now] if now is not None else [])

    def sweep(self, keep: str | None) -> None:
        """Remove what killed writes of this store left: partials, generations the link does not name
        (``keep`` is the one it names) and, once the store is a link, a pre-generation sidecar and map."""
        partial = partial_pattern(self.name)
        pattern = _generation_re(self.name)
        roles = {suffix: role for role, suffix in _ROLES.items()}
        for entry in list(os.scandir(self.directory)):
            if partial.fullmatch(entry.name) and (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                _remove(entry.path)
                continue
            found = pattern.fullmatch(entry.name)
            if found is None or not entry.is_file(follow_symlinks=False):
                continue
            role = roles[found.group(2) or ""]
            if keep is not None and entry.name == keep + _ROLES[role]:
                continue
            if _is_ours(entry.path, role):
                _remove(entry.path)
        if current(self.path)[0] is not None:
            self._remove_plain_store_files()

    def _remove_plain_store_files(self):
        """The sidecar (and id map) of the store that was here before generations, once the link replaced it."""
        side = sidecar_path(self.path)
        try:
            meta = read_sidecar_json(side)
        except (OSError, ValueError):
            return
        if meta.get("format") != FORMAT or meta.get("version") != 1:
            return
        if isinstance(meta.get("id_map"), dict) and meta["id_map"].get("file") == id_map_path(self.path).name:
            _remove(id_map_path(self.path))
        _remove(side)

    # ------------------------------------------------------------- writing
    @property
    def data_name(self) -> str:
        """The file name of the new generation's rows."""
        return f"{self.name}.g{self.generation}"

    def final_path(self, role: str) -> Path:
        return self.directory / (self.data_name + _ROLES[role])

    @contextlib.contextmanager
    def create(self, role: str, mode: str = "wb") -> Iterator[IO[Any]]:
        """A new partial file for ``role`` (``"data"``, ``"map"`` or ``"sidecar"``), opened with ``mode``;
        flushed and synced when the block ends."""
        if role not in _ROLES or role in self._partials:
            raise ValueError(f"role must be one of {sorted(_ROLES)}, each once, got {role!r}")
        fd, tmp = new_partial(self.directory, self.name, role)
        self._partials[role] = tmp
        # (mypy: a text mode's encoding, passed as **kwargs, matches no overload of a mode not known statically)
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:  # type: ignore[call-overload]
            yield f
            f.flush()
            os.fsync(f.fileno())
        crash_point(f"written:{role}")

    def step(self, name: str) -> None:
        """A writer's own step (a chunk of rows written, ...), for :func:`crash_point`."""
        crash_point(name)

    def commit(self) -> None:
        """Rename the partials to the new generation, publish it with one rename of the link, then remove
        the old generation."""
        if "data" not in self._partials or "sidecar" not in self._partials:
            raise RuntimeError("a store generation needs its data and its sidecar before it is published")
        for role in ("data", "map", "sidecar"):
            if role in self._partials:
                os.replace(self._partials[role], self.final_path(role))
                del self._partials[role]
                crash_point(f"renamed:{role}")
        fsync_dir(self.directory)
        crash_point("synced")
        fd, link = new_partial(self.directory, self.name, "link")
        os.close(fd)
        os.unlink(link)  # the name only: symlink() cannot replace a file
        os.symlink(self.data_name, link)
        crash_point("linked")
        os.replace(link, self.path)  # the one atomic step: readers see the old generation, then the new
        self._committed = True
        crash_point("published")
        fsync_dir(self.directory)
        crash_point("published:synced")
        self.sweep(self.data_name)
        crash_point("swept")

    # ------------------------------------------------------------ lifetime
    def _unlock(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __exit__(self, *exc: object) -> None:
        try:
            for tmp in self._partials.values():
                _remove(tmp)
            if exc[0] is not None and not self._committed:
                for role in _ROLES:  # renamed but never published: nothing names them
                    path = self.final_path(role) if hasattr(self, "generation") else None
                    if path is not None and os.path.lexists(path) and _is_ours(path, role):
                        _remove(path)
        finally:
            self._unlock()


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        crash_point("removed")
