"""The tuner's records (what timing one key found) and its cache file, written whole or not at all."""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from directload.errors import DirectloadWarning

from .sources import cache_dir
from .tune_keys import TuneKey
from .variants import Variant

__all__ = ["TuneRecord", "ChoiceFile", "TunerCacheWarning", "FORMAT", "one_line"]

#: The version of the cache file's layout; a file of another version is ignored.
FORMAT = 1


def one_line(exc: BaseException) -> str:
    """An exception as one line of at most 300 characters: ``"TypeName: message"``.

    >>> one_line(ValueError("bad\\n  thing"))
    'ValueError: bad thing'
    """
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


class TunerCacheWarning(DirectloadWarning, RuntimeWarning):
    """The tuner's cache file could not be read or written: the tuner goes on in memory.

    >>> issubclass(TunerCacheWarning, RuntimeWarning)
    True
    """


@dataclass(frozen=True)
class TuneRecord:
    """What the timing of one key found.

    Attributes
    ----------
    key : TuneKey
        What it holds for.
    chosen : str
        The winning :attr:`Variant.name`.
    times_ms : tuple of (str, float)
        Each timed candidate's median milliseconds, in timing order (``index_select`` first).
    failed : tuple of (str, str)
        Each candidate that raised, with its error in one line; never timed again for this key.
    untimed : tuple of str
        Candidates the budget did not reach.
    note : str
        Why ``chosen`` is not simply the fastest (every candidate failed), or ``""``.
    budget_ms : float
        The budget it was timed within.

    Examples
    --------
    >>> key = TuneKey("GPU", "1", "2", "12", "abc", 400, 4, 16, 1024, 1 << 28)
    >>> rec = TuneRecord(key, "rowvec16x16", (("index_select", 0.4), ("rowvec16x16", 0.2)), (), (), "", 300.0)
    >>> rec.speedup, rec.complete, TuneRecord.from_json(rec.to_json()) == rec
    (2.0, True, True)
    """

    key: TuneKey
    chosen: str
    times_ms: tuple[tuple[str, float], ...]
    failed: tuple[tuple[str, str], ...]
    untimed: tuple[str, ...]
    note: str
    budget_ms: float

    @property
    def complete(self) -> bool:
        """Every candidate was timed or failed."""
        return not self.untimed

    @property
    def speedup(self) -> float | None:
        """``index_select``'s time over the choice's (``None`` where either was not timed)."""
        times = dict(self.times_ms)
        base, best = times.get("index_select"), times.get(self.chosen)
        return base / best if base and best else None

    def to_json(self) -> dict[str, Any]:
        """A plain dict, the key's fields under ``"key"``."""
        return {"key": self.key.to_json(), "chosen": self.chosen, "times_ms": dict(self.times_ms),
                "failed": dict(self.failed), "untimed": list(self.untimed), "note": self.note,
                "budget_ms": self.budget_ms}

    @classmethod
    def from_json(cls, data: Any) -> TuneRecord:
        """The inverse of :meth:`to_json`; ``ValueError`` for anything else."""
        try:
            times = tuple((str(k), float(v)) for k, v in data["times_ms"].items())
            failed = tuple((str(k), str(v)) for k, v in data["failed"].items())
            record = cls(TuneKey.from_json(data["key"]), Variant.parse(data["chosen"]).name, times, failed,
                         tuple(str(n) for n in data["untimed"]), str(data["note"]), float(data["budget_ms"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a tuner record: {exc!r:.200}") from exc
        if not all(math.isfinite(ms) and ms >= 0 for _, ms in times):
            raise ValueError("a tuner record's times are finite milliseconds >= 0")
        return record

    def row(self) -> dict[str, Any]:
        """One row of :meth:`Tuner.table`: the key's fields, then the outcome."""
        return {**self.key.to_json(), "chosen": self.chosen, "times_ms": dict(self.times_ms),
                "failed": dict(self.failed), "untimed": list(self.untimed), "note": self.note,
                "speedup": self.speedup}


def _default_path():
    return cache_dir() / "tuner" / "choices.json"


class ChoiceFile:
    """The tuner's cache file: JSON records, replaced whole (a partial file, then ``os.replace``).

    A missing file holds nothing; an unreadable or garbled one, or one of another :data:`FORMAT`, holds
    nothing either, with a :class:`TunerCacheWarning`, and is replaced by the next save.  Two processes
    saving at once may lose one's new record, which is then timed again.

    Examples
    --------
    >>> store = ChoiceFile("tuner-example/choices.json")
    >>> store.load()
    []
    """

    def __init__(self, path: os.PathLike[str] | str | None = None) -> None:
        self.path = Path(path) if path is not None else _default_path()

    def load(self) -> list[TuneRecord]:
        """The records in the file (``[]`` if none)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            return self._ignored(f"cannot be read ({one_line(exc)})")
        try:
            data = json.loads(text)
        except ValueError:
            return self._ignored("is not JSON")
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
            return self._ignored(f"is not a tuner cache of format {FORMAT}")
        records, bad = [], 0
        for item in data["records"]:
            try:
                records.append(TuneRecord.from_json(item))
            except ValueError:
                bad += 1
        if bad:
            warnings.warn(f"{bad} garbled record(s) in the tuner cache {self.path} ignored", TunerCacheWarning,
                          stacklevel=3)
        return records

    def _ignored(self, why):
        warnings.warn(f"the tuner cache {self.path} {why}; it is ignored (and replaced by the next choice)",
                      TunerCacheWarning, stacklevel=4)
        return []

    def save(self, records: Iterable[TuneRecord]) -> bool:
        """Add ``records`` to the file's (replacing those of the same keys); ``False``, with a warning, if
        it cannot be written."""
        merged = {r.key: r for r in self.load()}
        merged.update((r.key, r) for r in records)
        text = json.dumps({"format": FORMAT, "records": [r.to_json() for r in merged.values()]}, indent=1)
        partial = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, partial = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".partial")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, self.path)
        except OSError as exc:
            if partial is not None:
                Path(partial).unlink(missing_ok=True)
            warnings.warn(f"the tuner cache {self.path} cannot be written ({one_line(exc)}); choices stay in "
                          "memory", TunerCacheWarning, stacklevel=3)
            return False
        return True

    def clear(self) -> bool:
        """Remove the file and any partial of it a killed save left; whether the file was there."""
        for partial in self.path.parent.glob(self.path.name + ".*.partial"):
            partial.unlink(missing_ok=True)
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True
