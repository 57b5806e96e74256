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
  from the start of the first epoch (``--packed``), the epoch's own reads first;
* per codec of ``--codecs`` (``int8`` by default; :mod:`directload.codecs`), the rows carried as its code rows
  (``--codec``, the dataset's store of codes written here before the runs): ``in memory int8`` (the codes
  mapped in memory, decoded inside the gather), ``DiskStore int8``, ``HostCache lookahead int8`` (the float32
  host cache's bytes, so it holds more rows) and ``... int8 equal rows`` (the float32 cache's rows, so fewer
  bytes).

The cgroup's limit is what the configuration's feature store holds at most, as the store itself says
before it is opened (:meth:`~directload.stores.StoreSpec.held_estimate`: the caches with their read-ahead
slots, a GPU tier's host buffer where CUDA does not run, the buffers reads stage rows in, the caches'
bookkeeping; a disk store's staging; nothing for DGL's loader), plus ``--headroom``, the same for every
configuration: what the run needs besides (the interpreter, the frameworks, the graph, the batches).  For
each configuration the table gives the first epoch and the median steady epoch (every epoch after the
first), their ratio, the steady epoch as a percentage of the in-memory one (G10's "% of ideal"), the host
tier's hit rates and bytes per steady epoch, and the cgroup's cap and the most memory it held.  Writes
``results/out_of_core.json`` and ``.png``.
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
from directload.codecs import CODECS, codec
from directload.datasets import PRESETS, dataset_exists, load, synthesize
from directload.harness.commands.runs import check_args, feature_files
from directload.harness.memcap import PEAK_LINE
from directload.harness.parser import HelpFormatter, build_parser
from directload.harness.plotting import pyplot, save_figure
from directload.harness.train_inputs import run_memory, table_shape
from directload.units import parse_size


def configs(args, table_bytes, shape):
    """(name, ``directload train`` arguments but the cap) of every configuration; ``shape`` is the table's
    ``(rows, features)``."""
    host = int(table_bytes * args.host_frac)
    gpu = int(table_bytes * args.gpu_frac)
    staging = str(args.staging)
    tiered = ["--loader", "directload", "--features", "tiered", "--host-cache", str(host), "--staging", staging]
    out = [("in memory", ["--loader", "directload", "--features", "memory"]),
           ("DGL + memmap", ["--loader", "dgl", "--features", "disk"]),
           ("DiskStore", ["--loader", "directload", "--features", "disk"])]
    for policy in ("lru", "sieve", "lookahead"):
        out.append((f"HostCache {policy}", [*tiered, "--policy", policy]))
    out.append(("TieredStore", [*tiered, "--gpu-cache", str(gpu), "--policy", "lookahead"]))
    out.append(("HostCache lookahead packed", [*tiered, "--policy", "lookahead", "--packed"]))
    out.append(("TieredStore packed", [*tiered, "--gpu-cache", str(gpu), "--policy", "lookahead", "--packed"]))
    for name in args.codecs:
        c, rows = codec(name), shape[0]
        code_bytes = c.code_shape(rows, shape[1])[1] * c.code_dtype.itemsize * rows
        same_rows = str(int(host * code_bytes / table_bytes))
        coded = ["--codec", name]
        out += [(f"in memory {name}", ["--loader", "directload", "--features", "memory", *coded]),
                (f"DiskStore {name}", ["--loader", "directload", "--features", "disk", *coded]),
                (f"HostCache lookahead {name}", [*tiered, "--policy", "lookahead", *coded]),
                (f"HostCache lookahead {name} equal rows", ["--loader", "directload", "--features", "tiered",
                                                            "--host-cache", same_rows, "--staging", staging,
                                                            "--policy", "lookahead", *coded])]
    return out


def train_argv(args, extra):
    """``directload train``'s arguments of a configuration (``extra``): the same run for every one."""
    return ["train", "--dataset", args.dataset, "--root", args.root, "--framework", "dgl", "--model", "sage",
            "--epochs", str(args.epochs), "--seeds", "1", "--fanouts", *map(str, args.fanouts), "--batch-size",
            str(args.batch_size), "--eval-nodes", "1000", "--eval-batch-size", "512", "--no-progress", *extra]


def stack_bytes(args, extra, cuda):
    """What the configuration's feature store holds at most (its spec's ``held_estimate``, as ``directload
    train`` counts it against ``--memory-limit``): 0 for DGL's own loader, which reads no store."""
    parsed = build_parser().parse_args(train_argv(args, extra))
    options = check_args(parsed, [parsed.model], [parsed.loader])
    shape = table_shape(args.root, args.dataset)
    return sum(run_memory(options, shape, loaders=(parsed.loader,), cuda=cuda)["stack"].values())


def warm_page_cache(path, chunk=64 << 20):
    """Read ``path`` once, so the in-memory run finds every row in the page cache (the cgroup runs drop
    it): otherwise "in memory" would page rows in from disk all through its epochs."""
    buf = bytearray(chunk)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def run(args, extra, out_dir, cap=None):
    cmd = [sys.executable, "-m", "directload", *train_argv(args, extra), "--out", str(out_dir),
           *(["--memory-limit", str(cap)] if cap else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    peak = next((int(line.split()[3]) for line in proc.stdout.splitlines() if line.startswith(PEAK_LINE)), None)
    if proc.returncode:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}", "cap": cap, "peak": peak}
    report = json.loads(next(Path(out_dir).glob("*.json")).read_text())
    epochs = report["runs"][0]["epochs"]
    steady = [e["epoch_s"] for e in epochs[1:]]
    warm = report["runs"][0].get("warm")  # starting the caches' fill (it runs on) counts in the first epoch
    row = {"cap": cap, "peak": peak, "first_s": epochs[0]["epoch_s"] + (warm["seconds"] if warm else 0.0), "warm": warm,
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
    p.add_argument("--headroom", default="1.5G",
                   help="the cgroup's memory besides what the configuration's feature store holds")
    p.add_argument("--pack-epochs", type=int, default=3, help="pre-sampled epochs profiled for the packed file")
    p.add_argument("--only", default=None, help="comma-separated configuration names to run")
    p.add_argument("--codecs", nargs="*", choices=list(CODECS), default=["int8"],
                   help="codecs whose runs of code rows go beside float32's")
    args = p.parse_args(argv)
    args.headroom_bytes = parse_size(args.headroom)
    args.staging = parse_size(args.staging)

    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset)
    ds = load(args.root, args.dataset)
    table_bytes = int(ds.feat.numel()) * ds.feat.element_size()
    shape = tuple(ds.feat.shape)
    from directload.datasets import FEATURE_FILE

    feature_file = ds.path / "raw" / FEATURE_FILE
    print(f"{args.dataset}: {ds.num_nodes} rows, feature table {table_bytes / 2**30:.2f} GiB; host cache "
          f"{args.host_frac:.0%}, cgroup = what the feature store holds + {args.headroom}", flush=True)
    del ds
    results = {}
    pack_s = None
    cuda = capabilities().cuda
    for name, extra in configs(args, table_bytes, shape):
        if args.only and name not in args.only.split(","):
            continue
        chosen = extra[extra.index("--codec") + 1] if "--codec" in extra else None
        if chosen is not None:  # the store of codes, written before the runs (not inside a capped one)
            codes = feature_files(args.root, args.dataset, "disk", codec=chosen, progress=False)[-1]
        if "--packed" in extra and pack_s is None:
            pack_s = pack_disk_store(args)
            print(f"  packed the disk store ({args.pack_epochs} pre-sampled epochs, rewritten hottest rows first) "
                  f"in {pack_s:.1f} s, before the runs", flush=True)
        memory = name.startswith("in memory")
        if memory:
            warm_page_cache(feature_file if chosen is None else codes)
        cap = None if memory else stack_bytes(args, extra, cuda) + args.headroom_bytes
        with tempfile.TemporaryDirectory() as out_dir:
            results[name] = run(args, extra, out_dir, cap)
        r = results[name]
        print(f"  {name}: " + (r["error"] if "error" in r else
                                f"first {r['first_s']:.2f} s, steady {r['steady_s']:.2f} s") + _memory(r), flush=True)
    ideal = results.get("in memory", {}).get("steady_s")
    rows = []
    for name, r in results.items():
        memory = {"cap GiB": r["cap"] / 2**30 if r.get("cap") else "",
                  "peak GiB": r["peak"] / 2**30 if r.get("peak") else ""}
        if "error" in r:
            rows.append({"config": name, "first s": "failed", **memory})
            continue
        row = {"config": name, "first s": r["first_s"], "steady s": r["steady_s"],
               "steady range": f"{r['steady_min_s']:.2f}-{r['steady_max_s']:.2f}",
               "first/steady": r["first_s"] / r["steady_s"],
               "% of ideal": 100 * ideal / r["steady_s"] if ideal else float("nan"),
               "warm s": r["warm"]["seconds"] if r.get("warm") else "", "test acc %": 100 * r["test_acc"], **memory}
        if r.get("tiers"):
            host = r["tiers"][-1].get("host", {})
            row["host hit"] = statistics.median(t["host"]["hit_rate"] for t in r["tiers"] if "host" in t)
            row["host+ahead"] = statistics.median(t["host"]["slot_rate"] for t in r["tiers"] if "host" in t)
            row["disk GB"] = statistics.median(t["disk"]["bytes_read"] for t in r["tiers"]) / 1e9
            row["fwd GB"] = host.get("forwarded_bytes", 0) / 1e9
        rows.append(row)
    print_table(rows, ["config", "first s", "warm s", "steady s", "steady range", "first/steady", "% of ideal",
                       "host hit", "host+ahead", "disk GB", "fwd GB", "cap GiB", "peak GiB", "test acc %"])
    mm, la = results.get("DGL + memmap", {}), results.get("HostCache lookahead", {})
    if "steady_s" in mm and "steady_s" in la:
        print(f"HostCache lookahead vs DGL + memmap in the same kind of cgroup: steady "
              f"{la['steady_s'] / mm['steady_s']:.3f}x, first epoch {la['first_s'] / mm['first_s']:.3f}x")
    for name in ("HostCache lookahead packed", "TieredStore packed"):
        pk = results.get(name, {})
        if "steady_s" in mm and "steady_s" in pk:
            print(f"{name} vs DGL + memmap: steady {pk['steady_s'] / mm['steady_s']:.3f}x, first epoch "
                  f"{pk['first_s'] / mm['first_s']:.3f}x")
    base = results.get("in memory", {})
    for name in args.codecs:  # the goals: >= 95% of the float32 epoch in memory, first epoch <= 1.2x its
        for label in (f"HostCache lookahead {name}", f"HostCache lookahead {name} equal rows"):
            r = results.get(label, {})
            if "steady_s" in r and "steady_s" in base:
                print(f"{label}: steady epoch at {100 * base['steady_s'] / r['steady_s']:.1f}% of float32 in memory "
                      f"(goal >= 95%), first epoch {r['first_s'] / base['first_s']:.2f}x in memory's (goal <= 1.2x)")
    write_json("out_of_core", {"system": system_facts(), "args": {k: v for k, v in vars(args).items()},
                               "table_bytes": table_bytes, "pack_s": pack_s, "results": results, "rows": rows})
    plot(rows, RESULTS / "out_of_core.png", args)


def _memory(r):
    """``, peak P of the C GiB cap`` where the run had a cap."""
    if not r.get("cap"):
        return ""
    peak = f"peak {r['peak'] / 2**30:.2f}" if r.get("peak") else "peak unknown"
    return f"; {peak} of the {r['cap'] / 2**30:.2f} GiB cap"


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
    fig.suptitle(f"{args.dataset}: host cache {args.host_frac:.0%} of the table, cgroup = the store's memory + "
                 f"{args.headroom}")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
