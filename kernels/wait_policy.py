"""How the idle threads of torch's OpenMP team wait between parallel regions, as libgomp reads it."""

from __future__ import annotations

import os

__all__ = ["wait_policy", "LIBGOMP_SPINS"]

#: Rounds libgomp spins before an idle thread sleeps, where neither ``$GOMP_SPINCOUNT`` nor ``$OMP_WAIT_POLICY``
#: says (about 3 ms by libgomp's own estimate).
LIBGOMP_SPINS = 300_000


def wait_policy() -> str:
    """How the idle threads of torch's OpenMP team (libgomp) wait between parallel regions, by the variables
    libgomp reads when it loads (setting them later changes nothing in this process): ``"passive"`` (they
    sleep at once, ``OMP_WAIT_POLICY=PASSIVE``), ``"active"`` (they spin), or ``"spin N"``: N rounds, then
    sleep (``GOMP_SPINCOUNT``, which wins over ``OMP_WAIT_POLICY``, or libgomp's default
    :data:`LIBGOMP_SPINS`).

    Spinning costs nothing on a quiet machine and a great deal on a busy one: beside two busy processes on
    2 cores, a GraphSAGE epoch took a median 3.1-3.6x its quiet time with either loader at libgomp's
    default (3 runs in 10 at about 6x, all their epochs), against 1.8-2.0x spinning 10,000 rounds or
    sleeping at once (``directload bench loader --hog 2``; the guide to the benchmarks has the tables).

    Examples
    --------
    >>> wait_policy() in ("passive", "active") or wait_policy().startswith("spin ")
    True
    """
    count = os.environ.get("GOMP_SPINCOUNT", "").strip().lower()
    if count in ("infinite", "infinity"):
        return "active"
    scale = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}.get(count[-1:], 1)  # libgomp's suffixes
    digits = count[:-1].strip() if scale > 1 else count
    if digits.isdigit():
        spins = int(digits) * scale
        return "passive" if spins == 0 else f"spin {spins}"
    value = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    return value if value in ("passive", "active") else f"spin {LIBGOMP_SPINS}"
