"""Out of core: training epochs with the feature file larger than the memory the run may use.

Every configuration is one ``directload train`` process (DGL, GraphSAGE), so each gets its own memory
cgroup (``--memory-limit``, needs root) and starts cold:

* ``in memory``: directload's loader over the feature table in memory, no cgroup (the ideal; the file is
  read once first, so every row is in the page cache);
* ``DGL + memmap``: DGL's own loader over ``np.memmap`` of the ``.npy``, in the cgroup;
* ``DiskStore``: directload's loader reading the disk store alone (io_uring, O_DIRECT), in the cgroup;
* ``HostCache (lru / sieve / lookahead)``: a host cache of ``--host-frac`` of the table, with read-ahead
  slots, in front of the disk store, in the cgroup;
* ``TieredStore``: a GPU cache (a host buffer where CUDA does not run) in front of that, in the cgroup;
* ``HostCache lookahead packed`` and ``TieredStore packed``: the same over the packed copy of the disk store
  (``directload dataset pack``: rows renumbered hottest first by ``--pack-epochs`` pre-sampled epochs,
  written here before the runs), the caches filling from its hot rows in sequential reads in the background
  from the start of the first epoch (``--packed``), the epoch's own reads first.

The cgroup's limit is the host cache plus ``--headroom`` (what a disk-store run needs besides).  For each
configuration the table gives the first epoch and the median steady epoch (every epoch after the
first), their ratio, the steady epoch as a percentage of the in-memory one (G10's "% of ideal") and the
host tier's hit rates and bytes per steady epoch.  Writes ``results/out_of_core.json`` and ``.png``.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import RESULTS, pack_disk_store, print_table, system_facts, write_json

from directload.capabilities import capabilities
from directload.datasets import PRESETS, dataset_exists, load, synthesize
from directload.harness.parser import HelpFormatter
from directload.harness.plotting import pyplot, save_figure
from directload.units import parse_size


def configs(args, table_bytes, cuda):
    """(name, ``directload train`` arguments) of every configuration.  Where CUDA does not run, the "GPU"
    cache is a buffer in host memory, so the cgroup of a configuration with one holds it too (without it
    TieredStore packed was OOM-killed at the plain cap)."""
    host = int(table_bytes * args.host_frac)
    gpu = int(table_bytes * args.gpu_frac)
    staging = str(args.staging)
    cap = str(host + args.headroom_bytes)
    tiered_cap = str(host + args.headroom_bytes + (0 if cuda else gpu))
    disk_cap = str(args.headroom_bytes)
    out = [("in memory", ["--loader", "directload", "--features", "memory"]),
           ("DGL + memmap", ["--loader", "dgl", "--features", "disk", "--memory-limit", disk_cap]),
           ("DiskStore", ["--loader", "directload", "--features", "disk", "--memory-limit", disk_cap])]
    for policy in ("lru", "sieve", "lookahead"):
        out.append((f"HostCache {policy}", ["--loader", "directload", "--features", "tiered", "--host-cache",
                                            str(host), "--staging", staging, "--policy", policy,
                                            "--memory-limit", cap]))
    out.append(("TieredStore", ["--loader", "directload", "--features", "tiered", "--host-cache", str(host),
                                "--gpu-cache", str(gpu), "--staging", staging, "--policy", "lookahead",
                                "--memory-limit", tiered_cap]))
    out.append(("HostCache lookahead packed", ["--loader", "directload", "--features", "tiered", "--host-cache",
                                               str(host), "--staging", staging, "--policy", "lookahead", "--packed",
                                               "--memory-limit", cap]))
    out.append(("TieredStore packed", ["--loader", "directload", "--features", "tiered", "--host-cache", str(host),
                                       "--gpu-cache", str(gpu), "--staging", staging, "--policy", "lookahead",
                                       "--packed", "--memory-limit", tiered_cap]))
    return out


def warm_page_cache(path, chunk=64 << 20):
    """Read ``path`` once, so the in-memory run finds every row in the page cache (the cgroup runs drop
    it): otherwise "in memory" would page rows in from disk all through its epochs."""
    buf = bytearray(chunk)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def run(args, extra, out_dir):
    cmd = [sys.executable, "-m", "directload", "train", "--dataset", args.dataset, "--root", args.root,
           "--framework", "dgl", "--model", "sage", "--epochs", str(args.epochs), "--seeds", "1",
           "--fanouts", *map(str, args.fanouts), "--batch-size", str(args.batch_size), "--eval-nodes", "1000",
           "--eval-batch-size", "512", "--no-progress", "--out", str(out_dir), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}"}
    report = json.loads(next(Path(out_dir).glob("*.json")).read_text())
    epochs = report["runs"][0]["epochs"]
    steady = [e["epoch_s"] for e in epochs[1:]]
    warm = report["runs"][0].get("warm")  # starting the caches' fill (it runs on) counts in the first epoch
    row = {"first_s": epochs[0]["epoch_s"] + (warm["seconds"] if warm else 0.0), "warm": warm,
           "steady_s": statistics.median(steady), "steady_min_s": min(steady), "steady_max_s": max(steady),
           "test_acc": report["runs"][0]["test_acc"], "epochs": epochs}
    tiers = [e.get("tiers") for e in epochs[1:] if e.get("tiers")]
    if tiers:
        row["tiers"] = tiers
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--root", default="data")
    p.add_argument("--dataset", default="synth-ooc", help="a preset (made when missing) or a dataset under --root")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--host-frac", type=float, default=0.25, help="host cache, as a fraction of the table")
    p.add_argument("--gpu-frac", type=float, default=0.05, help="GPU cache, as a fraction of the table")
    p.add_argument("--staging", default="256M", help="read-ahead slots of the host tier")
    p.add_argument("--headroom", default="1.5G", help="the cgroup's memory besides the host cache")
    p.add_argument("--pack-epochs", type=int, default=3, help="pre-sampled epochs profiled for the packed file")
    p.add_argument("--only", default=None, help="comma-separated configuration names to run")
    args = p.parse_args(argv)
    args.headroom_bytes = parse_size(args.headroom)
    args.staging = parse_size(args.staging)

    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset)
    ds = load(args.root, args.dataset)
    table_bytes = int(ds.feat.numel()) * ds.feat.element_size()
    from directload.datasets import FEATURE_FILE

    feature_file = ds.path / "raw" / FEATURE_FILE
    print(f"{args.dataset}: {ds.num_nodes} rows, feature table {table_bytes / 2**30:.2f} GiB; host cache "
          f"{args.host_frac:.0%}, cgroup = host cache + {args.headroom}", flush=True)
    del ds
    results = {}
    pack_s = None
    for name, extra in configs(args, table_bytes, capabilities().cuda):
        if args.only and name not in args.only.split(","):
            continue
        if "--packed" in extra and pack_s is None:
            pack_s = pack_disk_store(args)
            print(f"  packed the disk store ({args.pack_epochs} pre-sampled epochs, rewritten hottest rows first) "
                  f"in {pack_s:.1f} s, before the runs", flush=True)
        if name == "in memory":
            warm_page_cache(feature_file)
        with tempfile.TemporaryDirectory() as out_dir:
            results[name] = run(args, extra, out_dir)
        r = results[name]
        print(f"  {name}: " + (r["error"] if "error" in r else
                                f"first {r['first_s']:.2f} s, steady {r['steady_s']:.2f} s"), flush=True)
    ideal = results.get("in memory", {}).get("steady_s")
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append({"config": name, "first s": "failed"})
            continue
        row = {"config": name, "first s": r["first_s"], "steady s": r["steady_s"],
               "steady range": f"{r['steady_min_s']:.2f}-{r['steady_max_s']:.2f}",
               "first/steady": r["first_s"] / r["steady_s"],
               "% of ideal": 100 * ideal / r["steady_s"] if ideal else float("nan"),
               "warm s": r["warm"]["seconds"] if r.get("warm") else "", "test acc %": 100 * r["test_acc"]}
        if r.get("tiers"):
            host = r["tiers"][-1].get("host", {})
            row["host hit"] = statistics.median(t["host"]["hit_rate"] for t in r["tiers"] if "host" in t)
            row["host+ahead"] = statistics.median(t["host"]["slot_rate"] for t in r["tiers"] if "host" in t)
            row["disk GB"] = statistics.median(t["disk"]["bytes_read"] for t in r["tiers"]) / 1e9
            row["fwd GB"] = host.get("forwarded_bytes", 0) / 1e9
        rows.append(row)
    print_table(rows, ["config", "first s", "warm s", "steady s", "steady range", "first/steady", "% of ideal",
                       "host hit", "host+ahead", "disk GB", "fwd GB", "test acc %"])
    mm, la = results.get("DGL + memmap", {}), results.get("HostCache lookahead", {})
    if "steady_s" in mm and "steady_s" in la:
        print(f"HostCache lookahead vs DGL + memmap in the same kind of cgroup: steady "
              f"{la['steady_s'] / mm['steady_s']:.3f}x, first epoch {la['first_s'] / mm['first_s']:.3f}x")
    for name in ("HostCache lookahead packed", "TieredStore packed"):
        pk = results.get(name, {})
        if "steady_s" in mm and "steady_s" in pk:
            print(f"{name} vs DGL + memmap: steady {pk['steady_s'] / mm['steady_s']:.3f}x, first epoch "
                  f"{pk['first_s'] / mm['first_s']:.3f}x")
    write_json("out_of_core", {"system": system_facts(), "args": {k: v for k, v in vars(args).items()},
                               "table_bytes": table_bytes, "pack_s": pack_s, "results": results, "rows": rows})
    plot(rows, RESULTS / "out_of_core.png", args)


def plot(rows, path, args):
    plt = pyplot()
    ok = [r for r in rows if isinstance(r.get("steady s"), float)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    names = [r["config"] for r in ok]
    a.bar(names, [r["% of ideal"] for r in ok], color="tab:blue")
    a.axhline(100, color="black", linewidth=0.8)
    a.axhline(100 / 1.1, color="grey", linestyle="--", linewidth=0.8, label="within 10% of in memory")
    a.set_ylabel("steady epoch, % of in-memory speed")
    a.set_title("% of ideal (in memory = 100)")
    a.legend(fontsize=8)
    x = range(len(ok))
    b.bar([i - 0.2 for i in x], [r["first s"] for r in ok], width=0.4, label="first epoch")
    b.bar([i + 0.2 for i in x], [r["steady s"] for r in ok], width=0.4, label="steady epoch (median)")
    b.set_xticks(list(x), names)
    b.set_ylabel("seconds")
    b.set_yscale("log")
    b.set_title("first and steady epochs")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=35)
        for lab in ax.get_xticklabels():
            lab.set_ha("right")
    fig.suptitle(f"{args.dataset}: host cache {args.host_frac:.0%} of the table, cgroup = cache + {args.headroom}")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
