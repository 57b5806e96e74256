"""Before and after: one benchmark of this checkout against the same benchmark of an earlier commit, side by side.

The commit's tree is exported (``git archive``) into a temporary directory and its packages laid out as
installed there, on ``PYTHONPATH``, with this environment's editable install of directload hidden from it;
nothing of this checkout or its git state is changed.  Rounds alternate, earlier commit then this
checkout, so both see the same drift of a shared machine.  After each run the JSON it wrote is read back
and flattened into dotted paths (a list of records is keyed by each record's name, config, model, loader
or row size); ``--metric`` picks the paths to compare (shell patterns).  The table gives each metric's
median over the rounds, with its spread (min-max), for both sides, and the median of the ratios
this/earlier taken round by round; the whole process's wall time is always compared.

A relative path in the benchmark's own arguments (``--root data``) names the same place on both sides:
the earlier tree gets a link to this checkout's ``data``.  Writes ``results/versus_<name>.json`` and
``.png``.

Examples: ``directload bench versus --ref c0f2fd9 --metric 'summary.*.epoch_s' -- loader --seeds 1``;
``directload bench versus --ref HEAD~3 --rounds 2 --metric '*diskstore_iops*' -- disk --gib 2``.
"""

import argparse
import fnmatch
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _common import RESULTS, print_table, pyplot, save_figure, system_facts, write_json

from directload.harness.commands.bench import BENCH_SCRIPTS
from directload.harness.parser import HelpFormatter

ROOT = Path(__file__).resolve().parent.parent
_KEYS = ("config", "name", "model", "loader", "policy", "row_bytes")  # what names a record in a list
_SKIP = ("system", "args", "meta", "rounds")  # facts and raw samples, not figures to compare
_HIDE_EDITABLE = '''import sys
# the earlier tree's packages must not be shadowed by the environment's editable install of this checkout
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
'''


def flatten(value, prefix=""):
    """Every number in a JSON value, by dotted path; records in a list are keyed by their name.  Pure.

    Examples
    --------
    >>> flatten({"rows": [{"config": "lru", "s": 1.5}, {"config": "sieve", "s": 2}], "args": {"n": 3}})
    {'rows.lru.s': 1.5, 'rows.sieve.s': 2.0}
    """
    out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            if not prefix and k in _SKIP:
                continue
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            label = str(i)
            if isinstance(v, dict):
                named = [str(v[k]) for k in _KEYS if isinstance(v.get(k), (str, int)) and not isinstance(v[k], bool)]
                label = "/".join(named) or label
            out.update(flatten(v, f"{prefix}{label}."))
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        out[prefix[:-1]] = float(value)
    return out


def pick(figures, patterns):
    """The figures whose path matches one of the shell ``patterns``.  Pure.

    Examples
    --------
    >>> pick({"a.x_s": 1.0, "a.y": 2.0, "b.x_s": 3.0}, ["*.x_s"])
    {'a.x_s': 1.0, 'b.x_s': 3.0}
    """
    return {k: v for k, v in figures.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def commit_of(ref):
    """The commit ``ref`` names in this checkout; ``ValueError`` where it names none."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise ValueError(f"{ref!r} is not a commit of this checkout")
    return sha.stdout.strip()


def export_tree(ref, into):
    """``ref``'s tree of this checkout, exported into ``into`` with its packages laid out as installed in
    ``into/site``; returns (tree, site, environment to run it in)."""
    tree, site = Path(into) / "tree", Path(into) / "site"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit_of(ref)],
                             capture_output=True, check=True)
    with tempfile.TemporaryFile() as f:
        f.write(archive.stdout)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(tree, filter="data")
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    from lint_imports import installed_layout

    site.mkdir()
    installed_layout(tree, site)
    for name in ("directload", "kernels", "loaders"):  # `python -m directload` run in the tree must not see them
        shutil.rmtree(tree / name)
    (site / "sitecustomize.py").write_text(_HIDE_EDITABLE)
    if (ROOT / "data").exists():
        (tree / "data").symlink_to(ROOT / "data", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    probe = subprocess.run([sys.executable, "-c", "import directload; print(directload.__file__)"],
                           cwd=tree, env=env, capture_output=True, text=True)
    if not probe.stdout.strip().startswith(str(site)):
        raise RuntimeError(f"{ref}'s directload is not the one imported: {probe.stdout or probe.stderr}")
    return tree, env


def _outputs(tree):
    return [tree / "benchmarks" / "results", tree / "directload-results"]


def run_once(tree, env, script, rest, log):
    """One run of ``script`` in ``tree``: (wall seconds, figures of the JSON files it wrote)."""
    start = time.time()
    t0 = time.perf_counter()
    with open(log, "a") as out:
        code = subprocess.call([sys.executable, str(tree / "benchmarks" / script), *rest], cwd=tree, env=env,
                               stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{script} in {tree} exited with {code}: see {log}")
    figures = {"wall_s": wall}
    for folder in _outputs(tree):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            if path.stat().st_mtime >= start and not path.name.startswith("versus_"):
                figures.update(flatten(json.loads(path.read_text()), f"{path.stem}."))
    return figures


def _spread(values):
    return statistics.median(values), min(values), max(values)


def compare(before, after, patterns):
    """Rows of the comparison: each metric's spread on both sides and the round-by-round ratio.  Pure."""
    rows = []
    names = sorted(set.intersection(*(set(pick(f, patterns + ["wall_s"])) for f in before + after)))
    for name in names:
        b = [f[name] for f in before]
        a = [f[name] for f in after]
        ratios = [x / y for x, y in zip(a, b) if y]
        rows.append({"metric": name, "before": _spread(b), "after": _spread(a),
                     "ratio": _spread(ratios) if ratios else None})
    return rows


def shared_prefix(names):
    """The dotted prefix every name but ``wall_s`` shares (a report's file stem), to print once.  Pure.

    Examples
    --------
    >>> shared_prefix(["r.summary.a", "r.summary.b", "wall_s"])
    'r.summary.'
    """
    parts = [n.split(".")[:-1] for n in names if n != "wall_s"]
    if not parts:
        return ""
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common) + "." if common else ""


def _cell(spread, fmt="{:.4g}"):
    if spread is None:
        return "-"
    return f"{fmt.format(spread[0])} ({fmt.format(spread[1])}-{fmt.format(spread[2])})"


def plot(rows, path, title, prefix=""):
    rows = [r for r in rows if r["ratio"]]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.5))
    y = range(len(rows))
    med = [r["ratio"][0] for r in rows]
    err = [[m - r["ratio"][1] for m, r in zip(med, rows)], [r["ratio"][2] - m for m, r in zip(med, rows)]]
    ax.barh(list(y), med, xerr=err, color="#4c72b0", capsize=3)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(list(y), [r["metric"].removeprefix(prefix) for r in rows], fontsize=7)
    ax.set_xlabel("this / earlier: median ratio of the rounds (min-max)")
    ax.set_title(title + (f"\n{prefix}..." if prefix else ""), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--ref", required=True, help="the earlier commit (any git revision of this checkout)")
    p.add_argument("--this", default=None, metavar="REF",
                   help="a commit for the other side too, so edits to the checkout during the rounds do not "
                        "reach them (default: the checkout as it is)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating")
    p.add_argument("--metric", action="append", default=[], metavar="PATTERN",
                   help="dotted JSON paths to compare, shell patterns (repeat); the wall time always")
    p.add_argument("--name", default=None, help="results/versus_<name>.json and .png (default: the benchmark)")
    p.add_argument("bench", choices=sorted(k for k in BENCH_SCRIPTS if k != "versus"), help="the benchmark")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="its arguments, after --")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    for ref in filter(None, (args.ref, args.this)):
        try:
            commit_of(ref)
        except ValueError as exc:
            p.error(str(exc))
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: the run stops and the exports go
    script = BENCH_SCRIPTS[args.bench]
    with tempfile.TemporaryDirectory(prefix="directload-versus-") as tmp:
        (Path(tmp) / "ref").mkdir()
        old_tree, old_env = export_tree(args.ref, Path(tmp) / "ref")
        new_tree, new_env = ROOT, dict(os.environ)
        if args.this is not None:
            (Path(tmp) / "this").mkdir()
            new_tree, new_env = export_tree(args.this, Path(tmp) / "this")
        log = Path(tmp) / "runs.log"
        this = args.this or "this checkout"
        before, after = [], []
        for i in range(args.rounds):
            print(f"round {i + 1}/{args.rounds}: {args.ref}", flush=True)
            before.append(run_once(old_tree, old_env, script, rest, log))
            print(f"round {i + 1}/{args.rounds}: {this}", flush=True)
            after.append(run_once(new_tree, new_env, script, rest, log))
        rows = compare(before, after, args.metric)
    prefix = shared_prefix([r["metric"] for r in rows])
    print(f"\n{args.bench} {' '.join(rest)}: {args.ref} against {this}, {args.rounds} alternating rounds; "
          f"medians (min-max){f'; metrics under {prefix}' if prefix else ''}")
    print_table([{"metric": r["metric"].removeprefix(prefix), "earlier": _cell(r["before"]), "this": _cell(r["after"]),
                  "this/earlier": _cell(r["ratio"], "{:.3f}")} for r in rows],
                ["metric", "earlier", "this", "this/earlier"])
    name = f"versus_{args.name or args.bench}"
    write_json(name, {"system": system_facts(), "args": vars(args), "rows": rows,
                      "before": before, "after": after})
    plot(rows, RESULTS / f"{name}.png", f"{args.bench}: {this} against {args.ref}", prefix)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
