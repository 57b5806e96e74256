"""Hotness renumbering (Sentinel's packing): disk bytes and read amplification per epoch, before and after.

The trace is the input nodes of DGL's ``NeighborSampler`` over a generated power-law graph (``synth-ooc`` by
default: 1M rows, so a batch reads a small part of the table), shuffled seeds. Rows are profiled over
``--presample`` batches of one epoch (GNNLab's presampling) or over a whole first epoch, the file is rewritten
hot rows first (``renumber``), and a different epoch is read through a ``DiskStore`` on each file, alone and
behind a ``HostCache`` (``lookahead``, ``--cache`` of the table). Rows of several sizes come from the first
columns of the dataset's features, so the sweep shows where packing pays: rows smaller than the disk's block.

Counts are bytes, not times: ``read amplification`` is bytes read over the distinct rows' bytes.  Writes
``results/hot_packing.json`` and ``results/hot_packing.png``.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import RESULTS, print_table, system_facts, write_json

from directload.datasets import PRESETS, dataset_exists, load, synthesize
from directload.harness.parser import HelpFormatter
from directload.harness.plotting import pyplot, save_figure
from directload.stores import (
    DiskStore,
    StoreSpec,
    access_counts,
    open_store,
    read_layout,
    renumber,
    walk,
    write_disk_store,
)

sys.path.insert(0, str(Path(__file__).parent))
from cache_policies import epoch_trace  # noqa: E402


def replay(path, batches, cache_frac):
    """Disk counters of one epoch of ``batches`` on the store at ``path`` (behind a host cache of
    ``cache_frac`` of the table, without read-ahead slots, when ``cache_frac``)."""
    layout = read_layout(path)
    host = int(layout.shape[0] * cache_frac) * layout.row_nbytes
    with open_store(StoreSpec(path, tiers=bool(cache_frac), host_bytes=host, staging_bytes=0,
                              policy="lookahead")) as top:
        for b in batches[:4]:
            top.prefetch(b)
        for i, b in enumerate(batches):
            top.read(b)
            if i + 4 < len(batches):
                top.prefetch(batches[i + 4])
        return next(s for s in walk(top) if isinstance(s, DiskStore)).stats()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--root", default="data")
    p.add_argument("--dataset", default="synth-ooc")
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--row-bytes", default="64,128,256,1024", help="row sizes to try (the first columns)")
    p.add_argument("--presample", type=int, default=0, help="batches profiled (0: a whole first epoch)")
    p.add_argument("--cache", type=float, default=0.1, help="host cache in front, as a fraction of the table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--degree", action="store_true",
                   help="order rows read equally often by in-degree (default: by id)")
    p.add_argument("--workdir", default=None, help="where the files go (default: a temporary directory under "
                                                  "--root, on the same disk)")
    args = p.parse_args(argv)

    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset)
    ds = load(args.root, args.dataset)
    feat = ds.feat.check_backing() if hasattr(ds.feat, "check_backing") else ds.feat
    n = ds.num_nodes
    profile = epoch_trace(ds.graph, ds.split["train"], args.fanouts, args.batch_size, args.seed)
    if args.presample:
        profile = profile[:args.presample]
    epoch = epoch_trace(ds.graph, ds.split["train"], args.fanouts, args.batch_size, args.seed + 1)
    counts = access_counts(profile, n)
    degree = ds.graph.in_degrees().numpy()
    print(f"{args.dataset}: {n} rows; profile: {len(profile)} batches ({int((counts > 0).sum())} rows seen); "
          f"measured epoch: {len(epoch)} batches, {sum(len(b) for b in epoch)} row reads")
    rows_out = []
    work = Path(args.workdir) if args.workdir else Path(args.root)
    with tempfile.TemporaryDirectory(dir=work, prefix=".hot-packing-") as tmp:
        for rb in [int(x) for x in args.row_bytes.split(",")]:
            cols = max(1, rb // feat.element_size())
            table = torch.as_tensor(np.ascontiguousarray(np.asarray(feat[:, :cols])))
            plain = write_disk_store(table, Path(tmp) / f"plain{rb}.npy", progress=False)
            packed = renumber(plain, Path(tmp) / f"packed{rb}.npy", counts, progress=False,
                              tiebreak=degree if args.degree else None)
            for cache in (0.0, args.cache):
                r = {"row bytes": cols * feat.element_size(), "cache": f"{cache:.0%}" if cache else "none"}
                for name, path in (("before", plain), ("after", packed)):
                    s = replay(path, epoch, cache)
                    r[f"{name} MB"] = s["bytes_read"] / 1e6
                    r[f"{name} amp"] = s["read_amplification"]
                    r[f"{name} reads"] = s["reads"]
                    r["block"] = s["block"]
                r["bytes cut"] = r["before MB"] / r["after MB"] if r["after MB"] else float("nan")
                rows_out.append(r)
                print(f"  {r['row bytes']} B rows, cache {r['cache']}: {r['before MB']:.1f} -> {r['after MB']:.1f} MB "
                      f"(amplification {r['before amp']:.2f} -> {r['after amp']:.2f})", flush=True)
    print_table(rows_out, ["row bytes", "cache", "block", "before MB", "after MB", "bytes cut", "before amp",
                           "after amp", "before reads", "after reads"])
    write_json("hot_packing", {"system": system_facts(), "args": vars(args), "rows": rows_out})
    plot(rows_out, RESULTS / "hot_packing.png", args)


def plot(rows, path, args):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, cache in zip(axes, ("none", f"{args.cache:.0%}")):
        sel = [r for r in rows if r["cache"] == cache]
        x = np.arange(len(sel))
        ax.bar(x - 0.2, [r["before MB"] for r in sel], width=0.4, label="file order")
        ax.bar(x + 0.2, [r["after MB"] for r in sel], width=0.4, label="hot rows packed")
        ax.set_xticks(x, [f"{r['row bytes']} B" for r in sel])
        ax.set_xlabel("row size")
        ax.set_ylabel("MB read from disk per epoch")
        ax.set_title("disk alone" if cache == "none" else f"behind a {cache} lookahead host cache")
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.dataset}: packing hot rows together (profile: "
                 f"{args.presample or 'a whole'} {'batches' if args.presample else 'epoch'})")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
