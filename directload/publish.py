"""Crash-safe publication: what a writer makes (a set of files, or a directory) becomes the next generation
of a name in one atomic step.

``<path>`` is a symbolic link to its current generation, ``<path>.g<N>`` beside it: a file, with sibling
files ``<path>.g<N><suffix>`` for its other roles (a disk store's rows, id map and sidecar), or a directory
(a set of DistDGL partitions).  A :class:`Publication`:

1. locks the directory that holds ``path`` (one writer at a time; the kernel drops the lock if the writer
   dies).  Another writer at work is a parameter, ``contention``: ``"raise"`` refuses at once
   (:class:`PublishBusyError`), ``"wait"`` warns and waits for it, for ever or up to ``timeout`` seconds
   (:class:`PublishTimeout` naming its pid);
2. looks at ``path``: nothing, our link, or something a subclass adopts (directload's own layout from before
   generations); anything else is refused with ``FileExistsError`` and left as it is;
3. removes what killed publications of ``path`` left, and picks ``N`` above every generation present;
4. lets the writer fill partials: files ``.<name>.<random>.<role>.partial``, each synced when written, or a
   directory of that name holding a build mark until it is complete;
5. **commits**: renames each partial to its generation name and syncs the directory (the new generation is
   complete, and nothing names it yet); renames a new link over ``path`` (``rename(2)``, atomic), or, where
   ``path`` is an adopted directory, exchanges the two (``renameat2(RENAME_EXCHANGE)``); syncs again; then
   removes the old generation.

So at every instant a reader that resolves ``path`` once finds one complete generation, the old or the new
(SQLite's and RocksDB's promise for ``kill -9`` and power loss), and a writer killed at any instant leaves
one of them.

Trust.  Nothing directload did not make is deleted or overwritten.  A sweep removes partials of ``path``
(files and links by their name; a directory only when it is empty, holds the build mark or the subclass
owns it), generations the link does not name (by their name *and* :meth:`Publication.owns`), and never
the current generation or anything else in the directory.

Every step calls :func:`crash_point`; the crash-consistency tests replace it in a child process to kill
that process at each step in turn.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, ClassVar, Literal, Self

from .atomic import fsync_dir, new_partial, partial_pattern, umask
from .errors import DirectloadError, DirectloadWarning
from .flocks import LockTimeout, describe_holders, wait_lock

__all__ = ["Publication", "PublishBusyError", "PublishTimeout", "PublishError", "PublishWaitWarning", "current",
           "crash_point", "CONTENTION"]

#: What a publication does when another process is publishing in the same directory.
CONTENTION = ("raise", "wait")
_RENAME_EXCHANGE = 2  # linux/fs.h


class PublishBusyError(DirectloadError, BlockingIOError):
    """Another process is publishing in the same directory, and the publication was told not to wait
    (``contention="raise"``).

    Examples
    --------
    >>> issubclass(PublishBusyError, BlockingIOError)
    True
    """


class PublishTimeout(PublishBusyError, TimeoutError):
    """Another process kept publishing in the same directory past the publication's ``timeout``; the
    message names its pid.

    Examples
    --------
    >>> issubclass(PublishTimeout, PublishBusyError), issubclass(PublishTimeout, TimeoutError)
    (True, True)
    """


class PublishWaitWarning(DirectloadWarning, RuntimeWarning):
    """Another process is writing where this one would publish (``contention="wait"``): it waits for it.

    Examples
    --------
    >>> issubclass(PublishWaitWarning, RuntimeWarning)
    True
    """


class PublishError(DirectloadError, RuntimeError):
    """A publication was committed without the entry its link names.

    Examples
    --------
    >>> issubclass(PublishError, RuntimeError)
    True
    """


def crash_point(step: str) -> None:
    """Called after every step of a publication (``step`` names it); does nothing.  The crash-consistency
    tests replace it in a child process to kill that process at each step in turn (SQLite's crash-point
    injection), so every instant of a publication is tried.

    Examples
    --------
    >>> crash_point("published")
    """


def current(path: os.PathLike[str] | str) -> tuple[Path, int] | tuple[None, None]:
    """``(generation, N)`` when ``path`` is a link to its generation ``N`` (``path.g<N>`` beside it), else
    ``(None, None)``.  Reads the link only; the generation may be missing.

    Examples
    --------
    >>> import tempfile
    >>> where = tempfile.mkdtemp()
    >>> os.symlink("f.npy.g3", os.path.join(where, "f.npy"))
    >>> current(os.path.join(where, "f.npy"))[1], current(where)
    (3, (None, None))
    """
    path = Path(path)
    try:
        target = os.readlink(path)
    except OSError:
        return None, None
    found = re.fullmatch(re.escape(path.name) + r"\.g([0-9]{1,18})", target)
    if found is None:
        return None, None
    return path.parent / target, int(found.group(1))


class Publication:
    """One crash-safe publication of ``path`` (see the module's docstring); a context manager.

    ::

        with Publication(path) as p:           # locked, swept, p.generation picked
            with p.create("data") as f: ...    # a partial file (or p.build(role): a partial directory)
            p.commit()                         # the one atomic publish, then the old generation goes

    Leaving the block without :meth:`commit` (an exception) removes the partials and leaves ``path`` as
    it was.  A subclass says what its generations look like (:attr:`roles`, :attr:`directory_roles`) and
    which files are its own (:meth:`owns`, :meth:`adopts`); this class owns nothing, so it never removes a
    generation it cannot tell is ours.

    Parameters
    ----------
    path : str or os.PathLike
        The name published: a link to its current generation.
    contention : {"raise", "wait"}
        Another process publishing in ``path``'s directory: :class:`PublishBusyError` at once, or a
        ``RuntimeWarning`` and a wait for it.
    timeout : float or None
        With ``"wait"``, the most seconds to wait before :class:`PublishTimeout` (None: for ever).
    replace : bool
        Whether a generation of ours (or a layout :meth:`adopts`) at ``path`` may be replaced; else
        ``FileExistsError``.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "notes.txt")
    >>> with Publication(path) as p:
    ...     with p.create("data", "w") as f:
    ...         _ = f.write("hello")
    ...     p.commit()
    >>> os.readlink(path), open(path).read()
    ('notes.txt.g1', 'hello')
    """

    #: Each role's suffix after ``<name>.g<N>``; the role with the suffix ``""`` is what the link names.
    roles: ClassVar[Mapping[str, str]] = {"data": ""}
    #: The roles a generation needs before it is published (besides the one the link names).
    required: ClassVar[tuple[str, ...]] = ()
    #: The roles built as directories (:meth:`build`), not files (:meth:`create`).
    directory_roles: ClassVar[frozenset[str]] = frozenset()
    #: Inside a partial directory until it is complete.
    build_mark: ClassVar[str] = ".directload-build"
    #: Before every step's name, for :func:`crash_point`.
    label: ClassVar[str] = ""

    def __init__(self, path: os.PathLike[str] | str, *, contention: Literal["raise", "wait"] = "raise",
                 timeout: float | None = None, replace: bool = True) -> None:
        if contention not in CONTENTION:
            raise ValueError(f"contention must be one of {CONTENTION}, not {contention!r}")
        if timeout is not None and (contention != "wait" or isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf):
            raise ValueError(f"timeout is seconds > 0 to wait with contention='wait', not {timeout!r}")
        self.path = Path(path)
        self.directory = self.path.parent
        self.name = self.path.name
        self.contention, self.timeout, self.replace = contention, timeout, replace
        self.generation = 0
        self._lock_fd: int | None = None
        self._partials: dict[str, Path] = {}
        self._renamed: list[str] = []
        self._link: Path | None = None
        self._old = "none"
        self._committed = False
        self._main = next((role for role, suffix in self.roles.items() if suffix == ""), None)
        if self._main is None or not {*self.directory_roles, *self.required} <= set(self.roles):
            raise TypeError(f"{type(self).__name__}.roles needs one role with the suffix '' (the one the link names), "
                            "and directory_roles and required must be roles")

    # ------------------------------------------------------------ what a subclass says
    def owns(self, path: Path, role: str) -> bool:
        """Whether the entry at ``path`` (a generation's file or directory of ``role``, or a partial directory
        of ``role`` that is no longer empty and lost its build mark) is one this kind of publication made;
        a subclass reads its own marks.  Never: this class cannot tell."""
        return False

    def adopts(self, path: Path) -> bool:
        """Whether what is at ``path`` (not a link of ours) is directload's own from before generations, to be
        replaced (a file) or exchanged (a directory).  Never: this class adopts nothing."""
        return False

    def foreign_message(self) -> str:
        """The one-line refusal of what is at ``path`` when it is neither our link nor adopted."""
        return f"{self.path} was not published by directload; not replacing it"

    def exists_message(self) -> str:
        """The one-line refusal of a generation of ours at ``path`` when ``replace`` is False."""
        return f"{self.path} exists; pass replace=True to replace it"

    def tidy(self) -> None:
        """Once ``path`` is our link: remove what an adopted layout left beside it (nothing here), with
        :meth:`remove_file`."""

    def remove_file(self, path: os.PathLike[str] | str) -> None:
        """Remove the file (or link) at ``path``, where it is still there; a crash point after."""
        _remove(path, self.label)

    # ------------------------------------------------------------ lock, look, sweep
    def __enter__(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            self._old = self._inspect()
            if self._old in ("link", "file", "dir") and not self.replace:
                raise FileExistsError(self.exists_message())
            self.sweep()
            self.generation = 1 + max(self._generations_present(), default=0)
        except BaseException:
            self._unlock()
            raise
        return self

    def _lock(self):
        self._lock_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if self.contention == "raise":
                    raise PublishBusyError(errno.EWOULDBLOCK, f"another directload process is writing in "
                                           f"{self.directory}; run again once it has finished") from None
            warnings.warn(f"{self.directory}: another directload process is writing here; waiting for it to finish"
                          + ("" if self.timeout is None else f" (at most {self.timeout:g} s)"), PublishWaitWarning,
                          stacklevel=3)
            if self.timeout is None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                return
            try:
                wait_lock(self._lock_fd, time.monotonic() + self.timeout)
            except LockTimeout as exc:
                raise PublishTimeout(errno.ETIMEDOUT, f"{self.directory}: {describe_holders(exc.pids)} kept writing "
                                     f"here for more than {self.timeout:g} s; run again once it has finished") from exc
        except BaseException:
            self._unlock()
            raise

    def _inspect(self):
        """What is at ``path``: ``"none"`` (nothing, or our link to a generation that is gone), ``"link"``
        (ours), ``"file"`` or ``"dir"`` (adopted); ``FileExistsError`` for anything else."""
        if not os.path.lexists(self.path):
            return "none"
        target, _ = current(self.path)
        if target is not None:
            return "link" if os.path.exists(target) else "none"
        if not os.path.islink(self.path) and self.adopts(self.path):
            return "dir" if self.path.is_dir() else "file"
        raise FileExistsError(self.foreign_message())

    def _pattern(self):
        """A generation's names: ``<name>.g<N>`` and a role's suffix."""
        suffixes = "|".join(re.escape(s) for s in self.roles.values() if s)
        return re.compile(re.escape(self.name) + r"\.g([0-9]{1,18})" + (f"({suffixes})?" if suffixes else "()"))

    def _generations_present(self):
        pattern = self._pattern()
        found = [int(m.group(1)) for m in map(pattern.fullmatch, os.listdir(self.directory)) if m]
        _, now = current(self.path)
        return found + ([now] if now is not None else [])

    def sweep(self) -> None:
        """Remove what killed publications of ``path`` left: partials, and generations the link does not
        name, each only where it is ours; then, once ``path`` is our link, :meth:`tidy`."""
        partial, pattern = partial_pattern(self.name), self._pattern()
        roles = {suffix: role for role, suffix in self.roles.items()}
        _, keep = current(self.path)
        for entry in list(os.scandir(self.directory)):
            found = partial.fullmatch(entry.name)
            if found:
                role = (found.group(1) or ".")[1:]
                if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                    _remove(entry.path, self.label)
                elif entry.is_dir(follow_symlinks=False) and self._partial_dir_is_ours(entry.path, role):
                    _remove_tree(entry.path, self.label)
                continue
            found = pattern.fullmatch(entry.name)
            if found is None or int(found.group(1)) == keep or entry.is_symlink():
                continue
            role = roles[found.group(2) or ""]
            if role in self.directory_roles:
                if entry.is_dir(follow_symlinks=False) and self._dir_is_ours(entry.path, role):
                    _remove_tree(entry.path, self.label)
            elif entry.is_file(follow_symlinks=False) and self.owns(Path(entry.path), role):
                _remove(entry.path, self.label)
        if current(self.path)[0] is not None:
            self.tidy()

    def _dir_is_ours(self, path, role):
        """A directory of ``role`` we made: empty (a build that never began), marked, or owned."""
        try:
            names = os.listdir(path)
        except OSError:
            return False
        return not names or self.build_mark in names or self.owns(Path(path), role)

    def _partial_dir_is_ours(self, path, role):
        if role in self.directory_roles:
            return self._dir_is_ours(path, role)
        if role == "link":  # an adopted directory, exchanged out by a publication killed before removing it
            return self._empty(path) or self.adopts(Path(path))
        return False

    @staticmethod
    def _empty(path):
        try:
            return not os.listdir(path)
        except OSError:
            return False

    # ------------------------------------------------------------ writing
    def final_path(self, role: str) -> Path:
        """Where ``role``'s entry of the new generation goes."""
        return self.directory / (self.generation_name + self.roles[role])

    @property
    def generation_name(self) -> str:
        """The name of the new generation (what the link will name)."""
        return f"{self.name}.g{self.generation}"

    def _claim(self, role):
        if role not in self.roles or role in self._partials or role in self._renamed:
            raise ValueError(f"role must be one of {sorted(self.roles)}, each once, got {role!r}")
        if self._lock_fd is None:
            raise PublishError(f"{self.path}: a publication makes its partials inside its with block")

    @contextlib.contextmanager
    def create(self, role: str, mode: str = "wb") -> Iterator[IO[Any]]:
        """A new partial file for ``role``, opened with ``mode``; flushed and synced when the block ends."""
        self._claim(role)
        if role in self.directory_roles:
            raise ValueError(f"{role!r} is built as a directory (build()), not a file")
        fd, tmp = new_partial(self.directory, self.name, role)
        self._partials[role] = tmp
        # (mypy: a text mode's encoding, passed as **kwargs, matches no overload of a mode not known statically)
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:  # type: ignore[call-overload]
            yield f
            f.flush()
            os.fsync(f.fileno())
        self.step(f"written:{role}")

    def build(self, role: str) -> Path:
        """A new partial directory for ``role`` (one of :attr:`directory_roles`), holding the build mark
        until :meth:`commit`, with the umask's permissions; its path."""
        self._claim(role)
        if role not in self.directory_roles:
            raise ValueError(f"{role!r} is written as a file (create()), not built as a directory")
        tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{self.name}.", suffix=f".{role}.partial"))
        self._partials[role] = tmp
        os.chmod(tmp, 0o777 & ~umask())  # a temporary directory would be private
        (tmp / self.build_mark).touch()
        self.step(f"created:{role}")
        return tmp

    def step(self, name: str) -> None:
        """A writer's own step (a chunk of rows written, ...), for :func:`crash_point`."""
        crash_point(self.label + name)

    def commit(self) -> None:
        """Rename the partials to the new generation, publish it with one atomic step, then remove the old
        generation."""
        missing = [role for role in (self._main, *self.required) if role not in self._partials]
        if missing:
            raise PublishError(f"{self.path}: a generation needs its {' and '.join(map(repr, missing))} before it is "
                               "published")
        for role in self.roles:
            if role in self._partials:
                tmp = self._partials[role]
                if role in self.directory_roles:
                    _fsync_tree(tmp)
                    os.unlink(tmp / self.build_mark)  # the subclass's own record marks it ours from here
                os.replace(tmp, self.final_path(role))
                del self._partials[role]
                self._renamed.append(role)
                self.step(f"renamed:{role}")
        fsync_dir(self.directory)
        self.step("synced")
        fd, self._link = new_partial(self.directory, self.name, "link")
        os.close(fd)
        os.unlink(self._link)  # the name only: symlink() cannot replace a file
        os.symlink(self.generation_name, self._link)
        self.step("linked")
        if self._old == "dir":
            _exchange(self._link, self.path)  # the old directory is now at the link's name
        else:
            os.replace(self._link, self.path)  # the one atomic step: readers see the old generation, then the new
        self._committed = True
        self.step("published")
        fsync_dir(self.directory)
        self.step("published:synced")
        if self._old == "dir":
            if self._empty(self._link):
                with contextlib.suppress(OSError):
                    os.rmdir(self._link)
            elif self.adopts(self._link):
                _remove_tree(self._link, self.label)
        self._link = None
        self.sweep()
        self.step("swept")

    # ------------------------------------------------------------ lifetime
    def _unlock(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __exit__(self, *exc: object) -> None:
        try:
            for role, tmp in self._partials.items():
                if role in self.directory_roles:
                    _remove_tree(tmp, self.label)
                else:
                    _remove(tmp, self.label)
            self._partials.clear()
            if self._link is not None and not self._committed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._link)
            if not self._committed:  # renamed but never published: nothing names them
                for role in self._renamed:
                    path = self.final_path(role)
                    if role in self.directory_roles and path.is_dir() and not path.is_symlink() \
                            and self._dir_is_ours(path, role):
                        _remove_tree(path, self.label)
                    elif path.is_file() and not path.is_symlink() and self.owns(path, role):
                        _remove(path, self.label)
        finally:
            self._unlock()


def _remove(path, label):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        crash_point(label + "removed")


def _remove_tree(path, label):
    shutil.rmtree(path, ignore_errors=True)
    crash_point(label + "removed")


def _fsync_tree(root):
    for where, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(where, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(where)


def _exchange(a, b):
    """Swap the names ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if not hasattr(libc, "renameat2") or libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b),
                                                        _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno() if hasattr(libc, "renameat2") else errno.ENOSYS
        raise OSError(code, f"cannot swap {b} for its new generation in one step ({os.strerror(code)}): move the "
                      f"old {b} away and publish again")
