"""How the command line spells an option: :class:`Flag` (its name, help and how it parses) and the argparse
types the flags parse with (whole numbers, sizes, the look-ahead)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from directload.units import check_int

__all__ = ["Flag", "SAME", "int_at_least", "positive_int", "non_negative_int", "positive_float", "lookahead_arg",
           "size_arg"]


class _Same:
    """The marker of a flag whose default is its field's."""

    def __repr__(self):
        return "SAME"


#: A :class:`Flag`'s default: its field's own.
SAME: Any = _Same()


@dataclass(frozen=True)
class Flag:
    """One flag of the command line and how it maps onto the option it sets.

    Parameters
    ----------
    name : str
        The flag, ``--gpu-cache``; argparse's destination follows from it (``gpu_cache``).
    help : str
        Its help, as ``--help`` prints it.
    type : callable, optional
        How its text parses (argparse's ``type``).
    choices : sequence, optional
        The values it takes.
    switch : bool
        A flag that takes no value: given, it is True.
    nargs : str, optional
        argparse's ``nargs`` (``"+"``: one or more values).
    metavar : str, optional
        How help names its value.
    default : object
        The command line's default where it is not the option's own (:data:`SAME`).
    to_option, from_option : callable, optional
        The parsed value as the option's value, and back (default: the value itself).

    Examples
    --------
    >>> flag = Flag("--node-io-depth", "disk reads in flight", type=non_negative_int)
    >>> flag.dest, flag.to_option(8), flag.from_option(8)
    ('node_io_depth', 8, 8)
    >>> Flag("--packed", "read the packed store", switch=True).argv(True)
    ['--packed']
    """

    name: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    switch: bool = False
    nargs: str | None = None
    metavar: str | None = None
    default: Any = SAME
    to_option: Callable[[Any], Any] = lambda value: value
    from_option: Callable[[Any], Any] = lambda value: value

    @property
    def dest(self) -> str:
        """Where argparse puts its value: the flag's name without dashes, ``_`` for ``-``."""
        return self.name.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser, option_default: Any, **changes: Any) -> None:
        """Add the flag to ``parser`` with the option's default (``option_default``) as the flag gives it, unless
        the flag has a default of its own, argparse's keywords changed by ``changes`` (``choices`` or a
        ``default`` known only now)."""
        default = self.from_option(option_default) if self.default is SAME else self.default
        kw: dict[str, Any] = {"help": self.help, "default": default}
        if self.switch:
            kw["action"] = "store_true"
        for key in ("type", "choices", "nargs", "metavar"):
            if getattr(self, key) is not None:
                kw[key] = getattr(self, key)
        parser.add_argument(self.name, **{**kw, **changes})

    def argv(self, value: Any) -> list[str]:
        """The arguments that give the option ``value`` (the option's value, not the flag's): none for a
        switch that is off or a value of None."""
        value = self.from_option(value)
        if value is None or (self.switch and not value):
            return []
        if self.switch:
            return [self.name]
        values = value if self.nargs is not None else [value]
        return [self.name, *map(str, values)]


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number ``>= low``.

    Examples
    --------
    >>> int_at_least(2)("3"), int_at_least(2).__name__
    (3, 'integer >= 2')
    """
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        try:
            return check_int("value", value, low=low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}") from None

    parse.__name__ = f"integer >= {low}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def lookahead_arg(text: str) -> int | str:
    """An argparse type: a whole number >= 1, or auto."""
    if text == "auto":
        return text
    return positive_int(text)


def size_arg(text: str) -> int:
    """An argparse type: a byte size (1G, 512M, 0).

    Examples
    --------
    >>> size_arg("2K")
    2048
    """
    from directload.units import parse_size

    try:
        return parse_size(text, allow_zero=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
