"""``directload tune``: the GPU gather's tuned choices, as a table or JSON, or cleared."""

from __future__ import annotations

import argparse
import json

__all__ = ["run"]


def _span(low, factor, unit=False):
    """A bucket ``[low, low * factor)`` in words: ``1024-2047`` ids, or ``256 MiB-1 GiB``."""
    def size(n):
        for name, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if n >= 1 << shift and n % (1 << shift) == 0:
                return f"{n >> shift} {name}"
        return f"{n} B"

    if low == 0:
        return "0"
    return f"{size(low)}-{size(low * factor)}" if unit else f"{low}-{low * factor - 1}"


def _tune_lines(rows):
    """``directload tune``'s table: one block per machine and software, one line per kind of gather."""
    lines, env = [], None
    for row in rows:
        here = (row["gpu"], row["driver"], row["torch"], row["cuda"], row["sources"])
        if here != env:
            env = here
            lines += ["", "{}, driver {}, torch {}, CUDA {}, kernel sources {}".format(*here),
                      f"  {'row B':>7} {'elem B':>6} {'align':>5} {'ids':>13} {'table':>17}  {'chosen':<18} "
                      f"{'ms':>8} {'vs index_select':>15}"]
        times = row["times_ms"]
        best = times.get(row["chosen"])
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        lines.append(f"  {row['row_bytes']:>7} {row['elem_bytes']:>6} {row['align']:>5} {_span(row['ids'], 2):>13} "
                     f"{_span(row['table'], 4, unit=True):>17}  {row['chosen']:<18} "
                     f"{'-' if best is None else f'{best:.3f}':>8} {speedup:>15}")
        ranked = sorted(times.items(), key=lambda kv: kv[1])
        lines.append("      timed (ms): " + (", ".join(f"{name} {ms:.3f}" for name, ms in ranked) or "none"))
        lines += [f"      failed: {name} ({why})" for name, why in row["failed"].items()]
        if row["untimed"]:
            lines.append("      not timed (the budget ran out): " + ", ".join(row["untimed"]))
        if row["note"]:
            lines.append(f"      note: {row['note']}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the tuner's choices (a table, or ``--json``), or remove its cache file (``--clear``)."""
    from directload.kernels.tuner import ENV_VAR, Tuner, tuning_enabled

    tuner = Tuner()
    path = tuner.store.path  # type: ignore[union-attr]  # Tuner() keeps the default cache file
    if args.clear:
        print(f"removed {path}" if tuner.clear() else f"no tuner cache at {path}")
        return 0
    rows = tuner.table()
    if args.json:
        print(json.dumps({"enabled": tuning_enabled(), "cache": str(path), "choices": rows}, indent=2))
        return 0
    state = "on" if tuning_enabled() else f"off ({ENV_VAR}=0: every GPU gather takes the default kernel)"
    print(f"tuner: {state}; cache {path}: {len(rows)} choice{'' if len(rows) == 1 else 's'}")
    if not rows:
        print("nothing tuned yet: the first GPU gather of each kind times its candidates and keeps the fastest")
    for line in _tune_lines(rows):
        print(line)
    return 0
