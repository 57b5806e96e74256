"""Configuration values, checked in one place: sizes in bytes (one parser, one check and one formatter for
every budget: caches, staging, memory caps) and whole-number settings (batch sizes, look-ahead, queue depths,
epochs)."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any, overload

import numpy as np

__all__ = ["parse_size", "check_bytes", "check_int", "format_size", "dtype_name"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*")


def parse_size(text: str, *, allow_zero: bool = False) -> int:
    """Bytes in ``"1.5G"``, ``"768M"``, ``"4096"`` (K, M, G, T are powers of 1024; ``B``/``iB`` optional).
    Pure.

    Raises ``ValueError`` for anything else (an empty string included), and for 0 unless ``allow_zero``.

    Examples
    --------
    >>> parse_size("1.5G"), parse_size("768m"), parse_size("4096"), parse_size("2 GiB")
    (1610612736, 805306368, 4096, 2147483648)
    >>> parse_size("0", allow_zero=True)
    0
    """
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a size: {text!r} (use bytes, or a number with K, M, G or T)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value < (0 if allow_zero else 1):
        raise ValueError(f"a size must be at least {0 if allow_zero else 1} byte, got {text!r}")
    return value


def format_size(nbytes: float) -> str:  # type: ignore[return]  # its loop returns at TiB
    """``nbytes`` for a message, in the largest of B, KiB, MiB, GiB and TiB that leaves at least 1 (two
    decimals above bytes), so that a tiny size never reads as ``0.00 GiB``.  Pure.

    Examples
    --------
    >>> format_size(0), format_size(1023), format_size(4096 + 512), format_size(64 << 20), format_size(3 << 40)
    ('0 B', '1023 B', '4.50 KiB', '64.00 MiB', '3.00 TiB')
    """
    nbytes = int(nbytes)
    if abs(nbytes) < 1024:
        return f"{nbytes} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        nbytes /= 1024
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.2f} {unit}"


def check_bytes(name: str, value: int | np.integer | str) -> int:
    """``value`` as an int number of bytes >= 0: an integer, or a size string (:func:`parse_size`);
    ``ValueError`` naming ``name`` for anything else (booleans, empty strings, floats, negatives).

    Examples
    --------
    >>> check_bytes("host_bytes", "1G"), check_bytes("host_bytes", 4096), check_bytes("host_bytes", "0")
    (1073741824, 4096, 0)
    """
    if isinstance(value, str):
        try:
            return parse_size(value, allow_zero=True)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a number of bytes (an integer >= 0, or a size such as '512M'), got "
                         f"{value!r}")
    return int(value)


@overload
def check_int(name: str, value: Any, *, low: int = 1, high: int | None = None) -> int: ...


@overload
def check_int(name: str, value: Any, *, low: int = 1, high: int | None = None,
              also: Collection[str]) -> int | str: ...


def check_int(name: str, value: Any, *, low: int = 1, high: int | None = None,
              also: Collection[str] = ()) -> int | str:
    """``value`` when it is a whole number in ``[low, high]`` (or one of ``also``, e.g. ``"auto"``), else the one
    ``ValueError`` naming ``name``.  Booleans are refused (``True`` is not a batch size).

    Examples
    --------
    >>> check_int("batch_size", 64), check_int("retries", 0, low=0), check_int("lookahead", "auto", also=("auto",))
    (64, 0, 'auto')
    >>> check_int("batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be a positive integer, got 0
    """
    if isinstance(value, str) and value in also:
        return value
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= low
    if ok and (high is None or value <= high):
        return int(value)
    want = "a positive integer" if low == 1 else f"an integer >= {low}"
    if high is not None:
        want = f"an integer in {low}..{high}"
    alternatives = "".join(f" or {a!r}" for a in also)
    raise ValueError(f"{name} must be {want}{alternatives}, got {value!r}")


def dtype_name(dtype: object) -> str:
    """A torch dtype's name without its module, as sidecars, keys and messages spell it: ``"float32"`` for
    ``torch.float32``.

    >>> import torch
    >>> dtype_name(torch.bfloat16)
    'bfloat16'
    """
    return str(dtype).removeprefix("torch.")
