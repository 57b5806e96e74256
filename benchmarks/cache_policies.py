"""Cache policies on real sampler traces: hit rate and slow-tier bytes per epoch, against Belady's optimum.

The trace is what training reads: the input nodes of every mini-batch of
DGL's ``NeighborSampler`` over a generated power-law graph (``synth-small`` by
default; made when missing), shuffled training seeds, two epochs.  The first
warms the caches and the second is measured: steady-state figures, as a cache
that lives across epochs sees them.  Every policy of
``directload.stores.policies`` replays it at cache sizes of 5, 10, 20 and 40%
of the table, ``lookahead`` seeing the next L batches as the loader's
look-ahead shows them, and ``belady`` everything ahead (the optimum for a
cache filled on demand).
A row missed is a row read from the slower tier: slow-tier bytes are misses x
row bytes, except for the DeepUM-style baseline (``deepum``, 4 KiB and 2 MiB
pages with correlation prefetch), which counts the whole pages it fetches; its
hit rate counts rows found in pages fetched whole for a neighbour, so compare it
by bytes.  The static caches get their scores from the graph (``degree``) and
from K pre-sampled batches of another epoch (``presample``).

Writes ``results/cache_policies.json`` and ``results/cache_policies.png``.
"""

import argparse
import time

import numpy as np
import torch
from _common import RESULTS, print_table, system_facts, write_json

from directload.datasets import PRESETS, dataset_exists, load, synthesize
from directload.harness.parser import HelpFormatter
from directload.harness.plotting import pyplot, save_figure
from directload.stores.policies import POLICIES, Correlation, LookAhead, belady, degree, presample, simulate


def epoch_trace(graph, seeds, fanouts, batch_size, seed):
    """Input-node ids of each mini-batch of one epoch of DGL's NeighborSampler (shuffled seeds)."""
    import dgl

    dgl.seed(seed)
    torch.manual_seed(seed)
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    loader = dgl.dataloading.DataLoader(graph, seeds, sampler, batch_size=batch_size, shuffle=True)
    return [input_nodes.numpy().astype(np.int64) for input_nodes, _, _ in loader]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--root", default="data", help="directory that holds the datasets")
    p.add_argument("--dataset", default="synth-small", help="an OGB-layout dataset, or a preset made when missing")
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5])
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--sizes", default="5,10,20,40", help="cache sizes, %% of the table's rows")
    p.add_argument("--lookahead", type=int, default=8, help="batches the look-ahead policy sees ahead")
    p.add_argument("--presample", type=int, default=8, help="batches of another epoch for the presample scores")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset)
    ds = load(args.root, args.dataset)
    graph = ds.graph
    rows = ds.num_nodes
    row_bytes = int(ds.feat.shape[1]) * ds.feat.element_size()
    warm = epoch_trace(graph, ds.split["train"], args.fanouts, args.batch_size, args.seed)
    trace = epoch_trace(graph, ds.split["train"], args.fanouts, args.batch_size, args.seed + 1)
    other = epoch_trace(graph, ds.split["train"], args.fanouts, args.batch_size, args.seed + 2)[:args.presample]
    in_deg = graph.in_degrees().numpy()
    reads = sum(len(b) for b in trace)
    print(f"{args.dataset}: {rows} rows of {row_bytes} B; one epoch = {len(trace)} batches, {reads} row reads "
          f"({len(np.unique(np.concatenate(trace)))} distinct); the second of two epochs is measured")

    results = []
    for pct in [float(s) for s in args.sizes.split(",")]:
        cap = int(rows * pct / 100)
        policies = [(name, make(cap), 0) for name, make in POLICIES.items()]
        policies += [("deepum 4K", Correlation(cap, row_bytes, 4096), 0),
                     ("deepum 2M", Correlation(cap, row_bytes, 2 << 20), 0),
                     ("degree", degree(cap, in_deg), 0), ("presample", presample(cap, other, rows), 0),
                     (f"lookahead (L={args.lookahead})", LookAhead(cap), args.lookahead),
                     ("belady (OPT)", belady(cap), None)]
        row = {"cache %": pct}
        for name, policy, la in policies:
            t0 = time.perf_counter()
            r = simulate(policy, warm + trace, lookahead=la, measure_from=len(warm))
            row[name] = r["hit_rate"]
            row[f"{name} slow GB"] = r.get("fetched_bytes", r["misses"] * row_bytes) / 1e9
            row[f"{name} s"] = time.perf_counter() - t0
        names = [n for n, _, _ in policies]
        opt = row["belady (OPT)"]
        la_name = f"lookahead (L={args.lookahead})"
        row["lookahead / OPT"] = row[la_name] / opt if opt else 0.0
        row["LRU bytes / lookahead bytes"] = (row["lru slow GB"] / row[f"{la_name} slow GB"]
                                             if row[f"{la_name} slow GB"] else float("inf"))
        results.append(row)

    print("\nhit rate per policy (row reads served by the cache, steady epoch)")
    print_table(results, ["cache %", *names, "lookahead / OPT"])
    print("(deepum: rows found in pages fetched whole, with their neighbours; compare it by bytes, below)")
    print("\nslow-tier GB per epoch (misses x row bytes)")
    print_table([{"cache %": r["cache %"], **{n: r[f"{n} slow GB"] for n in names},
                  "LRU / lookahead": r["LRU bytes / lookahead bytes"]} for r in results],
                ["cache %", *names, "LRU / lookahead"])
    write_json("cache_policies", {"system": system_facts(), "args": vars(args), "rows": rows,
                                  "row_bytes": row_bytes, "batches": len(trace), "row_reads": reads,
                                  "results": results})
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    sizes = [r["cache %"] for r in results]
    for i, n in enumerate(names):
        style = dict(marker="o", label=n, color=plt.cm.tab10(i % 10),
                     linestyle="--" if n.startswith("belady") else ":" if n.startswith("deepum") else "-")
        if not n.startswith("deepum"):  # a page policy's hit rate is not comparable (see above)
            ax.plot(sizes, [r[n] for r in results], **style)
        bx.plot(sizes, [r[f"{n} slow GB"] for r in results], **style)
    ax.set_xlabel("cache size, % of the table's rows")
    ax.set_ylabel("hit rate (steady epoch)")
    ax.set_title(f"hit rate, NeighborSampler{tuple(args.fanouts)} on {args.dataset}")
    bx.set_xlabel("cache size, % of the table's rows")
    bx.set_ylabel("slow-tier GB per epoch")
    bx.set_yscale("log")
    bx.set_title("bytes read from the slower tier")
    ax.legend(fontsize=7)
    bx.legend(fontsize=7)
    save_figure(fig, RESULTS / "cache_policies.png")
    print(f"wrote {RESULTS / 'cache_policies.json'} and {RESULTS / 'cache_policies.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
