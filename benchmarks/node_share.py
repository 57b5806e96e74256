"""One node, many jobs: 1-4 concurrent out-of-core training jobs under one memory cgroup, each job's host
cache either sized by one node budget they share (directload's arbiter, ``--node-budget``) or sized alone
as if the job had the node to itself (today's configuration, which oversubscribes).

Every job is one ``directload train`` process (DGL, GraphSAGE, ``--features tiered``: a host cache in front
of the dataset's disk store, read with io_uring and O_DIRECT) started at the same moment as the others;
all of a run's jobs live in one memory cgroup (needs root) of ``budget + jobs x --headroom`` bytes, the
budget being ``--budget-frac`` of the feature table:

* ``arbiter``: every job runs with ``--node-budget budget`` (and ``--node-io-depth``), so the jobs' caches
  and read-ahead slots add up to the budget whatever the number of jobs, each resized as others come and go;
* ``alone``: every job runs with ``--host-cache budget - staging``, what one would configure for a job
  alone on the node; k jobs ask for k budgets.

For each run the table gives the aggregate feature rows per second (rows read through the jobs' host
caches in their steady epochs), each job's slowdown against one job alone (its steady epoch over the
one-job arbiter run's), Jain's fairness index over the jobs' rows per second, and the cgroup's peak memory
against the budget (the cgroup's own ``max_usage_in_bytes``).  A job the OOM killer ends counts as zero rows
per second.  Writes ``results/node_share.json`` and ``.png``.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import RESULTS, pack_disk_store, print_table, system_facts, write_json

from directload.datasets import dataset_exists, load, synthesize
from directload.datasets.synthetic import SynthConfig
from directload.harness import memcap
from directload.harness.parser import HelpFormatter
from directload.harness.plotting import pyplot, save_figure
from directload.units import parse_size

#: The dataset made when missing: 1 GiB of float32 features over 500k nodes, 2,000 training seeds.
SHARE_DATASET = SynthConfig(num_nodes=500_000, avg_degree=10, num_feats=512, split=(0.004, 0.004))


def jain(values):
    """Jain's fairness index: 1 when every value is equal, 1/n when one gets everything.

    >>> jain([1, 1, 1]), round(jain([1, 0]), 2)
    (1.0, 0.5)
    """
    values = [float(v) for v in values]
    square = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * square) if square else 0.0


def job_args(args, mode, budget, name, out_dir):
    cmd = [sys.executable, "-m", "directload", "train", "--dataset", args.dataset, "--root", args.root,
           "--framework", "dgl", "--loader", "directload", "--model", "sage", "--features", "tiered",
           "--epochs", str(args.epochs), "--seeds", "1", "--fanouts", *map(str, args.fanouts),
           "--batch-size", str(args.batch_size), "--eval-nodes", "500", "--eval-batch-size", "512",
           "--staging", str(args.staging), "--policy", args.policy, "--threads", "1", "--no-progress",
           "--out", str(out_dir)]
    if mode in ("arbiter", "packed", "shared"):
        cmd += ["--node-budget", str(budget), "--budget-name", name]
        if args.io_depth:
            cmd += ["--node-io-depth", str(args.io_depth)]
        if mode != "arbiter":  # the packed store (hot rows first), and with shared its hot rows once per node
            cmd += ["--packed"] + (["--shared-hot", str(int(budget * args.hot_frac))] if mode == "shared" else [])
    elif mode == "base":  # read-ahead slots and no cached rows, in a budget of just those
        cmd += ["--node-budget", str(args.staging), "--budget-name", name, "--host-cache", "1"]
    else:  # alone, roomy: each job's cache sized as if it had the node to itself
        cmd += ["--host-cache", str(budget - args.staging)]
    return cmd


def group(spec_path):
    """Inside the run's cgroup: start every job at once, wait for all, record each one's exit and the
    cgroup's peak memory."""
    memcap.enter_capped_child()  # dies with the guardian; every task left in the cgroup is killed after the run
    spec = json.loads(Path(spec_path).read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIRECTLOAD_MEMORY_")}  # jobs are not guarded
    cg = memcap.capped_group()
    peak_anon, stop = [0], threading.Event()

    def sample():  # the jobs' own memory (anonymous pages), not the page cache the graph's files fill
        while not stop.wait(0.05):
            peak_anon[0] = max(peak_anon[0], anon_bytes(cg))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # the finally below runs
    procs = []
    try:
        procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
                 for cmd in spec["jobs"]]
        errors = [p.communicate()[1] for p in procs]
    finally:  # interrupted: no job outlives the run
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    stop.set()
    sampler.join()
    peak = None
    for knob in ("memory.max_usage_in_bytes", "memory.peak"):
        if cg is not None and (cg / knob).exists():
            peak = int((cg / knob).read_text())
            break
    Path(spec["result"]).write_text(json.dumps({"exits": [p.returncode for p in procs], "peak": peak,
                                                "peak_anon": peak_anon[0], "errors": [e[-800:] for e in errors]}))


def anon_bytes(cg):
    """The cgroup's anonymous memory now (v1 ``total_rss``, v2 ``anon``), 0 where it cannot be read."""
    try:
        stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
    except (OSError, TypeError, ValueError):
        return 0
    return int(stat.get("total_rss", stat.get("anon", 0)))


def read_job(out_dir):
    """A job's steady epochs: rows read through its host cache per second, and epoch seconds."""
    paths = list(Path(out_dir).glob("*.json"))
    if not paths:
        return None
    run = json.loads(paths[0].read_text())["runs"][0]
    steady = run["epochs"][1:] or run["epochs"]
    seconds = sum(e["epoch_s"] for e in steady)
    out = {"epoch_s": statistics.median(e["epoch_s"] for e in steady), "test_acc": run["test_acc"],
           "budget": run.get("budget")}
    if all(e.get("tiers") for e in run["epochs"]):
        top = "hot" if "hot" in run["epochs"][0]["tiers"] else "host"  # rows asked of the job's whole store
        out["rows_per_s"] = sum(e["tiers"][top]["rows"] for e in steady) / seconds
        out["hit_rate"] = statistics.median(
            sum(e["tiers"][t]["hit_rows"] for t in ("hot", "host") if t in e["tiers"]) / max(e["tiers"][top]["rows"], 1)
            for e in steady)
        out["capacity_rows"] = [e["tiers"]["host"]["capacity_rows"] for e in run["epochs"]]
        out["hot_rows"] = run["epochs"][0]["tiers"]["hot"]["capacity_rows"] if top == "hot" else 0
    return out


def run(args, jobs, mode, budget, disk_file):
    memcap.drop_page_cache(disk_file)
    # roomy: the memory k jobs sized alone need between them, to see what they do with it
    limit = (jobs if mode == "roomy" else 1) * budget + jobs * args.headroom_bytes
    with tempfile.TemporaryDirectory() as work:
        outs = [Path(work) / f"job{i}" for i in range(jobs)]
        name = f"bench-share-{os.getpid()}-{jobs}-{mode}"
        spec = {"jobs": [job_args(args, mode, budget, name, o) for o in outs], "result": str(Path(work) / "r.json")}
        Path(work, "spec.json").write_text(json.dumps(spec))
        t0 = time.perf_counter()
        status = memcap.run_capped(limit, [sys.executable, __file__, "--group", str(Path(work) / "spec.json")])
        if status in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # the run was interrupted: so is the benchmark
            raise KeyboardInterrupt
        wall = time.perf_counter() - t0
        got = json.loads(Path(spec["result"]).read_text()) if Path(spec["result"]).exists() else {}
        per_job = [read_job(o) if code == 0 else None for o, code in zip(outs, got.get("exits", [None] * jobs))]
    return {"jobs": jobs, "mode": mode, "limit": limit, "status": status, "wall_s": wall,
            "exits": got.get("exits"), "peak": got.get("peak"), "peak_anon": got.get("peak_anon"),
            "errors": [e for e in got.get("errors", []) if e], "per_job": per_job}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--root", default="data")
    p.add_argument("--dataset", default="synth-share",
                   help="a dataset under --root; synth-share (1 GiB of features) is made when missing")
    p.add_argument("--jobs", default="1,2,3,4", help="comma-separated numbers of concurrent jobs")
    p.add_argument("--modes", default="arbiter,packed,shared,alone,roomy",
                   help="comma-separated: arbiter (one shared budget), packed (the same over the packed store), "
                        "shared (packed, its hottest rows once per node: --hot-frac of the budget), alone (each "
                        "sized alone, the same cgroup), roomy (each sized alone, a cgroup with room for all)")
    p.add_argument("--hot-frac", type=float, default=0.5,
                   help="with shared: the hot rows held once per node, as a fraction of the budget")
    p.add_argument("--pack-epochs", type=int, default=3, help="pre-sampled epochs profiled for the packed store")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--budget-frac", type=float, default=0.5, help="the node budget, as a fraction of the table")
    p.add_argument("--staging", default="48M", help="each job's read-ahead slots (part of its share)")
    p.add_argument("--io-depth", type=int, default=64, help="disk reads in flight shared by the arbiter's jobs")
    p.add_argument("--policy", default="lookahead")
    p.add_argument("--headroom", default="1G", help="the cgroup's memory per job besides the budget")
    p.add_argument("--group", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.group:
        return group(args.group)
    args.headroom_bytes = parse_size(args.headroom)
    args.staging = parse_size(args.staging)
    if not dataset_exists(args.root, args.dataset):
        if args.dataset != "synth-share":
            raise SystemExit(f"{args.dataset} is not under {args.root}")
        synthesize(args.root, args.dataset, SHARE_DATASET)
    ds = load(args.root, args.dataset)
    table_bytes = int(ds.feat.numel()) * ds.feat.element_size()
    args.row_nbytes = table_bytes // ds.num_nodes
    disk_file = ds.path / "disk" / "node-feat.npy"
    if not disk_file.exists():
        from directload.stores import write_disk_store

        write_disk_store(ds.path / "raw" / "node-feat.npy", disk_file)
    del ds
    modes = args.modes.split(",")
    if {"packed", "shared"} & set(modes):
        pack_s = pack_disk_store(args)
        print(f"  packed the disk store ({args.pack_epochs} pre-sampled epochs) in {pack_s:.0f} s", flush=True)
    budget = int(table_bytes * args.budget_frac)
    print(f"{args.dataset}: feature table {table_bytes / 2**30:.2f} GiB; node budget {budget / 2**20:.0f} MiB "
          f"({args.budget_frac:.0%}); cgroup = budget + jobs x {args.headroom} (roomy: jobs x (budget + "
          f"{args.headroom}))", flush=True)
    base = run(args, 1, "base", budget, disk_file)  # one job without a cache: what each job needs besides one
    base_anon = base["peak_anon"] or 0
    print(f"  one job with read-ahead slots and no cached rows: {base_anon / 2**20:.0f} MiB of its own", flush=True)
    results = []
    for jobs in [int(j) for j in args.jobs.split(",")]:
        for mode in modes:
            r = run(args, jobs, mode, budget, disk_file)
            results.append(r)
            done = [j for j in r["per_job"] if j]
            print(f"  {jobs} job(s), {mode}: {len(done)}/{jobs} finished (exits {r['exits']}), peak anonymous "
                  f"{(r['peak_anon'] or 0) / 2**20:.0f} MiB, {r['wall_s']:.0f} s"
                  + (f"; {r['errors'][0].strip().splitlines()[-1]}" if r["errors"] else ""), flush=True)
    alone = next((j["epoch_s"] for r in results if r["jobs"] == 1 and r["mode"] == "arbiter"
                  for j in r["per_job"] if j), None)
    rows = []
    for r in results:
        done = [j for j in r["per_job"] if j]
        rates = [j.get("rows_per_s", 0.0) if j else 0.0 for j in r["per_job"]]
        slow = [j["epoch_s"] / alone for j in done] if alone else []
        caches = (r["peak_anon"] or 0) - r["jobs"] * base_anon  # the cached rows, beyond each job's staging
        rows.append({"jobs": r["jobs"], "mode": r["mode"], "finished": f"{len(done)}/{r['jobs']}",
                     "agg rows/s": sum(rates), "slowdown med": statistics.median(slow) if slow else float("nan"),
                     "slowdown max": max(slow) if slow else float("nan"), "jain": jain(rates),
                     "hit rate": statistics.median(j["hit_rate"] for j in done) if done else float("nan"),
                     "caches held MiB": (sum(max(j["capacity_rows"]) * args.row_nbytes + args.staging for j in done)
                                         + max([j["hot_rows"] for j in done] or [0]) * args.row_nbytes) / 2**20,
                     "cached rows MiB": caches / 2**20,
                     "rows budget MiB": (budget - r["jobs"] * args.staging) / 2**20,
                     "peak anon MiB": (r["peak_anon"] or 0) / 2**20, "limit MiB": r["limit"] / 2**20})
        r["summary"] = rows[-1]
    print("caches held MiB = the sum of each finished job's largest host cache (cached rows and read-ahead slots), "
          "as it reports it, plus the hot rows held once on the node (shared); hit rate counts those too")
    print(f"cached rows MiB = the cgroup's peak anonymous memory - jobs x {base_anon / 2**20:.0f} MiB (one job with "
          "read-ahead slots and no cached rows); rows budget = budget - jobs x staging (what the arbiter's jobs may "
          "cache between them); a job the OOM killer ended counts 0 rows/s")
    print_table(rows, ["jobs", "mode", "finished", "agg rows/s", "slowdown med", "slowdown max", "jain", "hit rate",
                       "caches held MiB", "cached rows MiB", "rows budget MiB", "peak anon MiB", "limit MiB"])
    for jobs in sorted({r["jobs"] for r in rows}):
        a = next((r for r in rows if r["jobs"] == jobs and r["mode"] == "arbiter"), None)
        sh = next((r for r in rows if r["jobs"] == jobs and r["mode"] == "shared"), None)
        for other in ("alone", "roomy"):
            o = next((r for r in rows if r["jobs"] == jobs and r["mode"] == other), None)
            if sh and o and o["agg rows/s"]:
                print(f"{jobs} job(s): shared / {other} aggregate rows/s {sh['agg rows/s'] / o['agg rows/s']:.3f}x")
            o = next((r for r in rows if r["jobs"] == jobs and r["mode"] == other), None)
            if a and o and o["agg rows/s"]:
                print(f"{jobs} job(s): arbiter / {other} aggregate rows/s {a['agg rows/s'] / o['agg rows/s']:.3f}x")
    write_json("node_share", {"system": system_facts(), "args": {k: v for k, v in vars(args).items()},
                              "table_bytes": table_bytes, "budget": budget, "base": base, "results": results,
                              "rows": rows})
    plot(rows, RESULTS / "node_share.png", args, budget)


def plot(rows, path, args, budget):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for mode, color in (("arbiter", "tab:blue"), ("packed", "tab:cyan"), ("shared", "tab:green"),
                        ("alone", "tab:red"), ("roomy", "tab:orange")):
        rs = [r for r in rows if r["mode"] == mode]
        if not rs:
            continue
        x = [r["jobs"] for r in rs]
        axes[0].plot(x, [r["agg rows/s"] for r in rs], "o-", color=color, label=mode)
        axes[1].plot(x, [r["jain"] for r in rs], "o-", color=color, label=mode)
        axes[2].plot(x, [r["caches held MiB"] for r in rs], "o-", color=color, label=f"{mode}: caches held")
    axes[1].axhline(0.9, color="grey", linestyle="--", linewidth=0.8, label="goal 0.9")
    axes[2].axhline(budget / 2**20, color="black", linestyle="--", linewidth=0.8, label="node budget")
    for ax, title, unit in ((axes[0], "aggregate feature rows per second", "rows/s"),
                            (axes[1], "Jain's fairness over jobs", "index"),
                            (axes[2], "host caches of the finished jobs (largest, summed)", "MiB")):
        ax.set_title(title)
        ax.set_xlabel("concurrent jobs")
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.dataset}: jobs sharing one node budget ({args.budget_frac:.0%} of the table) vs each sized "
                 "alone")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
