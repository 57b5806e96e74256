"""Tables and the GPU report: long result rows pivoted to one column per method, and a Markdown report
rewritten whole after every section, so a run cut short leaves every section it finished.  Pure but for
:class:`Report`'s file."""

import re
from pathlib import Path

from _common import table_text

__all__ = ["fmt_time", "fmt_ratio", "fmt_gbps", "cell", "pivot", "wide_table", "failures", "sort_gains", "Report",
           "gpu_tables"]


def fmt_time(stat):
    """A time :class:`~_gpu.Stat` (as a dict, microseconds): median and half the interquartile range.

    >>> fmt_time({"median": 123.45, "p25": 120.0, "p75": 127.0, "n": 7})
    '123.5 ±3%'
    """
    spread = 50 * (stat["p75"] - stat["p25"]) / stat["median"] if stat["median"] else 0.0
    return f"{stat['median']:.1f} ±{spread:.0f}%"


def fmt_ratio(stat):
    """A ratio :class:`~_gpu.Stat` (as a dict): the median of the round-by-round ratios and their quartiles.

    >>> fmt_ratio({"median": 0.934, "p25": 0.91, "p75": 0.95, "n": 7})
    '0.93 (0.91-0.95)'
    """
    return f"{stat['median']:.2f} ({stat['p25']:.2f}-{stat['p75']:.2f})"


def fmt_gbps(value):
    return f"{value:.2f}"


def cell(row, metric, fmt):
    """``row[metric]`` formatted, ``n/a`` for a method this checkout lacks, ``failed`` for one that failed."""
    if "failed" in row:
        return "n/a" if row["failed"].startswith("n/a") else "failed"
    if metric not in row:
        return ""
    return fmt(row[metric])


def pivot(rows, index, metric, fmt, columns=None):
    """``(table_rows, header)``: one row per distinct ``index`` tuple, one column per method (first-seen
    order, or ``columns``), each cell ``fmt(row[metric])``.

    >>> rows = [{"count": 8, "method": "a", "gbps": 1.0}, {"count": 8, "method": "b", "failed": "n/a: none"}]
    >>> pivot(rows, ("count",), "gbps", fmt_gbps)
    ([{'count': 8, 'a': '1.00', 'b': 'n/a'}], ['count', 'a', 'b'])
    """
    methods = list(columns or dict.fromkeys(r["method"] for r in rows))
    table = {}
    for r in rows:
        key = tuple(r.get(k) for k in index)
        table.setdefault(key, dict(zip(index, key)))
        if r["method"] in methods:
            table[key][r["method"]] = cell(r, metric, fmt)
    return list(table.values()), [*index, *methods]


def wide_table(rows, index, metric, fmt, title, columns=None):
    """A titled text table of :func:`pivot`."""
    body, header = pivot(rows, index, metric, fmt, columns)
    return f"{title}\n{table_text(body, header)}"


def failures(rows):
    """One line per method that failed or is missing, with why (the tables only say ``failed``/``n/a``)."""
    seen = {}
    for r in rows:
        if "failed" in r:
            seen.setdefault((r["method"], r["failed"]), []).append(r)
    return [f"{method}: {why} ({len(rs)} point{'s' * (len(rs) > 1)})" for (method, why), rs in seen.items()]


def sort_gains(rows, index=("row_bytes", "count")):
    """Per point and kernel: what sorting the ids gained, measured two ways, beside the model's prediction.

    - ``kernel+sort``: the variant that sorts (the sort included) over the same kernel unsorted, on random
      ids: ``t(X) / t(X+sort)``, the median of the round-by-round ratios (above 1: sorting pays);
    - ``presorted``: the kernel on random ids over the same kernel on ids the caller sorted:
      ``t(X, random) / t(X, sorted)``, a ratio of medians from two runs of the point (the sort's own cost
      left out: the most sorting can give);
    - the model's gains (``kernels.pcie_model.sorting_gain``), where the rows carry them.

    >>> rows = [{"row_bytes": 256, "count": 8, "ids": "random", "method": "aligned", "gpu": [2.0, 2.0]},
    ...         {"row_bytes": 256, "count": 8, "ids": "random", "method": "aligned+sort", "gpu": [1.0, 1.0]},
    ...         {"row_bytes": 256, "count": 8, "ids": "sorted", "method": "aligned", "gpu": [0.8, 0.8]}]
    >>> sort_gains([{**r, "gpu_us": {"median": r.pop("gpu")[0]}} for r in rows])
    [{'row_bytes': 256, 'count': 8, 'kernel': 'aligned', 'kernel+sort': '2.00', 'presorted': '2.50'}]
    """
    by = {}
    for r in rows:
        if "failed" not in r and "gpu_us" in r:
            by[(tuple(r.get(k) for k in index), r.get("ids"), r["method"])] = r
    out = []
    for (key, ids, method), r in by.items():
        if ids != "random" or method.endswith("+sort") or method in ("ideal_copy", "tuner"):
            continue
        line = {**dict(zip(index, key)), "kernel": method}
        sorted_variant = by.get((key, "random", method + "+sort"))
        if sorted_variant is not None:
            line["kernel+sort"] = fmt_gbps(r["gpu_us"]["median"] / sorted_variant["gpu_us"]["median"])
        presorted = by.get((key, "sorted", method))
        if presorted is not None:
            line["presorted"] = fmt_gbps(r["gpu_us"]["median"] / presorted["gpu_us"]["median"])
        for k, v in r.get("model_sort_gain", {}).items():
            line[f"model_{k}"] = fmt_gbps(v)
        if len(line) > len(index) + 1:
            out.append(line)
    return out


_MARK = re.compile(r"^<!-- section: (\S+) -->$", re.M)


class Report:
    """A Markdown report of titled sections, each kept under a marker and rewritten whole on every
    :meth:`put`, so a killed run leaves the sections it finished.

    ``keep=True`` starts from the sections already in ``path`` (a second call of a split run): a section
    put again replaces its old text, in place; new ones are appended.
    """

    def __init__(self, path, head, *, keep=False):
        self.path = Path(path)
        self.head = head.rstrip() + "\n"
        self.sections = {}
        if keep and self.path.exists():
            parts = _MARK.split(self.path.read_text())
            self.sections = {parts[i]: parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}

    def put(self, key, text):
        """Set section ``key`` to ``text`` and write the whole report."""
        self.sections[key] = text.strip("\n")
        self.write()

    def write(self):
        body = "".join(f"\n<!-- section: {k} -->\n{v}\n" for k, v in self.sections.items())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(self.head + body)
        tmp.replace(self.path)


def _union_header(rows):
    return list(dict.fromkeys(k for r in rows for k in r))


def gpu_tables(rows, index=("row_bytes", "count")):
    """The text of a GPU sweep's tables: per id order, GB/s by GPU time, the time over torch's
    ``index_select`` (GPU and pipelined, round by round), pipelined and host microseconds per call; then
    sorting's gains, the tuner's picks, the calls that wait on the GPU, and what failed."""
    parts = []
    for order in dict.fromkeys(r.get("ids") for r in rows):
        sub = [r for r in rows if r.get("ids") == order]
        parts += [
            wide_table(sub, index, "gbps", fmt_gbps, f"GB/s by GPU time, {order} ids"),
            wide_table(sub, index, "vs_torch", fmt_ratio,
                       f"GPU time over torch's index_select (median of per-round ratios, quartiles), {order} ids"),
            wide_table(sub, index, "vs_torch_pipe", fmt_ratio,
                       f"pipelined time over torch's index_select (per-round ratios), {order} ids"),
            wide_table(sub, index, "pipe_us", fmt_time, f"pipelined us per call (±: half the IQR), {order} ids"),
            wide_table(sub, index, "host_us", fmt_time, f"host us per call, from an idle GPU, {order} ids"),
        ]
    gains = sort_gains(rows, index)
    if gains:
        parts.append("sorting's gain (time unsorted over sorted; above 1 pays), beside the model's "
                     "(kernels.pcie_model.sorting_gain)\n" + table_text(gains, _union_header(gains)))
    notes = [f"tuner's pick at {', '.join(f'{k}={r.get(k)}' for k in index)}, {r.get('ids')} ids: {r['pick']}"
             for r in rows if r.get("method") == "tuner" and "pick" in r]
    notes += [f"waits on the GPU (its GPU time includes host work) in {100 * r['uncovered']:.0f}% of samples: "
              f"{r['method']} at {', '.join(f'{k}={r.get(k)}' for k in index)}, {r.get('ids')} ids"
              for r in rows if r.get("uncovered", 0) > 0.5]
    notes += [f"not measured: {line}" for line in failures(rows)]
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts)
