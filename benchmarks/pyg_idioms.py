"""PyG's own idioms with one import changed: PyG's loader against directload's, side by side and interleaved.

Each idiom is a piece of one of PyG's examples, run as the example runs it, once with
``torch_geometric.loader.NeighborLoader`` and once with ``directload.loaders.pyg.NeighborLoader`` (the
one import the examples change), over the same graph and the same seed:

* ``train``: ``examples/reddit.py``'s ``train()``, an epoch of GraphSAGE over a ``Data`` (fanouts 25, 10,
  batch 1024, shuffled), in the main process;
* ``train, workers``: the same with reddit's loader options, sampling worker processes (persistent);
* ``layer-wise inference``: reddit's ``model.inference(data.x, subgraph_loader)``, every node's
  representation layer by layer, with a full-neighbour loader that carries no features;
* ``remote backend``: an epoch over ``(FeatureStore, GraphStore)`` (PyG's remote-backend interface):
  PyG's in-memory ``LocalFeatureStore``/``LocalGraphStore`` against directload's ``stores_from(data)``;
* each ``..., loader only``: the same epoch with no model, only the loader's batches: what directload
  changes, without the training's own run-to-run noise on top;
* ``unified table in model code``: reddit's inference gathers (``x_all[batch.n_id]``) and a few torch ops
  over the feature table, a plain tensor against the README's ``directload.to_unified(data.x)``;
* ``whole script, fresh process``: reddit.py end to end in a new process (imports, loaders with its six
  persistent workers, two epochs of training and layer-wise inference): what a user times, first-use
  costs included (directload's kernels load once a process's gathers have taken seconds).

Rounds alternate the two sides (PyG, directload, PyG, ...), so a drift of the machine hits both alike; the
first round of each is a warm-up, left out.  The table gives each side's median seconds with its range and
the median of the per-round ratios (directload / PyG: below 1 is faster).  Writes
``results/pyg_idioms.json`` and ``results/pyg_idioms.png``.
"""

import argparse
import copy
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import RESULTS, print_table, pyplot, save_figure, system_facts, write_json

from directload.datasets import PRESETS, dataset_exists, load, synthesize
from directload.harness.parser import HelpFormatter

IDIOMS = ("train", "train, loader only", "train, workers", "train, workers, loader only", "layer-wise inference",
          "remote backend", "remote backend, loader only", "unified table in model code",
          "whole script, fresh process")


def _sage(in_channels, hidden, out_channels):
    from torch_geometric.nn import SAGEConv

    class SAGE(torch.nn.Module):  # examples/reddit.py's model
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([SAGEConv(in_channels, hidden), SAGEConv(hidden, out_channels)])

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = F.dropout(x.relu_(), p=0.5, training=self.training)
            return x

        @torch.no_grad()
        def inference(self, x_all, subgraph_loader):
            for i, conv in enumerate(self.convs):
                xs = []
                for batch in subgraph_loader:
                    x = conv(x_all[batch.n_id], batch.edge_index)
                    if i < len(self.convs) - 1:
                        x = x.relu_()
                    xs.append(x[:batch.batch_size])
                x_all = torch.cat(xs, dim=0)
            return x_all

    return SAGE()


def _train_epoch(model, loader):
    """reddit.py's ``train()``: loss, accuracy and a step per batch, over the whole epoch (a loader that
    samples ahead would be charged for batches it never hands out if the epoch were cut short)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for batch in loader:
        opt.zero_grad()
        y = batch.y[:batch.batch_size]
        y_hat = model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(y_hat, y)
        loss.backward()
        opt.step()
        int((y_hat.argmax(dim=-1) == y).sum())


def _loader_epoch(loader):
    """One whole epoch of ``loader``'s batches, nothing done with them."""
    for _ in loader:
        pass


def _loaders():
    from torch_geometric.loader import NeighborLoader as PygLoader

    from directload.loaders.pyg import NeighborLoader as DirectLoader

    return {"pyg": PygLoader, "directload": DirectLoader}


def idioms(data, args):
    """``{idiom: {"pyg": fn, "directload": fn}}``: each fn runs the idiom once."""
    import directload
    from directload.loaders.pyg import stores_from

    loaders = _loaders()
    n, classes = data.num_nodes, int(data.y.max()) + 1
    model = _sage(data.num_features, args.hidden, classes)
    kw = dict(batch_size=args.batch_size, num_neighbors=args.fanouts)
    out = {name: {} for name in IDIOMS}
    for side, Loader in loaders.items():
        train = Loader(data, input_nodes=data.train_mask, shuffle=True, **kw)
        out["train"][side] = lambda train=train: _train_epoch(model, train)
        out["train, loader only"][side] = lambda train=train: _loader_epoch(train)
        workers = Loader(data, input_nodes=data.train_mask, shuffle=True, num_workers=args.workers,
                         persistent_workers=True, **kw)
        out["train, workers"][side] = lambda workers=workers: _train_epoch(model, workers)
        out["train, workers, loader only"][side] = lambda workers=workers: _loader_epoch(workers)
        sub = Loader(copy.copy(data), input_nodes=None, num_neighbors=[-1], shuffle=False, batch_size=args.batch_size,
                     num_workers=args.workers, persistent_workers=args.workers > 0)
        del sub.data.x, sub.data.y  # reddit.py: no features in this loader
        sub.data.num_nodes = n
        sub.data.n_id = torch.arange(n)
        out["layer-wise inference"][side] = lambda sub=sub: (model.eval(), model.inference(data.x, sub))
    for side, stores in (("pyg", _pyg_stores(data)), ("directload", stores_from(data))):
        remote = loaders[side](stores, input_nodes=torch.nonzero(data.train_mask).view(-1), shuffle=True, **kw)
        out["remote backend"][side] = lambda remote=remote: _train_epoch(model, remote)
        out["remote backend, loader only"][side] = lambda remote=remote: _loader_epoch(remote)
    for side in loaders:
        out["whole script, fresh process"][side] = lambda side=side: _fresh_script(side, args)
    unified = directload.to_unified(data.x, pin="auto")
    ids = torch.randint(0, n, (args.batches * args.batch_size * 10,)).split(args.batch_size * 10)  # ~sampled nodes
    for side, table in (("pyg", data.x), ("directload", unified)):
        out["unified table in model code"][side] = lambda table=table: _model_code(table, ids)
    return out


def _pyg_stores(data):
    """PyG's own in-memory remote backend over ``data``."""
    from torch_geometric.distributed import LocalFeatureStore, LocalGraphStore

    n = data.num_nodes
    fs = LocalFeatureStore.from_data(torch.arange(n), x=data.x, y=data.y)
    gs = LocalGraphStore.from_data(torch.arange(data.num_edges), data.edge_index, num_nodes=n)
    return fs, gs


def _fresh_script(side, args):
    """reddit.py end to end in a new process, with ``side``'s loader."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--script", side, "--root", args.root, "--dataset",
           args.dataset, "--batches", str(args.batches), "--batch-size", str(args.batch_size), "--hidden",
           str(args.hidden), "--workers", str(args.workers), "--fanouts", *map(str, args.fanouts)]
    subprocess.run(cmd, check=True, capture_output=True)


def _script(side, args):
    """The whole-script idiom's body, run in its own process (``--script``)."""
    data = _user_data(args)
    Loader = _loaders()[side]
    kw = dict(batch_size=args.batch_size, num_workers=args.workers, persistent_workers=args.workers > 0)
    train_loader = Loader(data, input_nodes=data.train_mask, num_neighbors=args.fanouts, shuffle=True, **kw)
    subgraph_loader = Loader(copy.copy(data), input_nodes=None, num_neighbors=[-1], shuffle=False, **kw)
    del subgraph_loader.data.x, subgraph_loader.data.y
    subgraph_loader.data.num_nodes = data.num_nodes
    subgraph_loader.data.n_id = torch.arange(data.num_nodes)
    model = _sage(data.num_features, args.hidden, int(data.y.max()) + 1)
    for _ in range(2):
        _train_epoch(model, train_loader)
        model.eval()
        model.inference(data.x, subgraph_loader)
    return 0


def _user_data(args):
    """The dataset as a user's PyG ``Data`` holds it (plain tensors), training seeds limited to
    ``batches`` batches."""
    from torch_geometric.data import Data

    ds = load(args.root, args.dataset)
    train_mask = torch.zeros(ds.num_nodes, dtype=torch.bool)
    train_mask[ds.split["train"][:args.batches * args.batch_size]] = True
    return Data(x=ds.feat.check_backing().clone(), y=ds.labels.clone(), edge_index=ds.edge_index.clone(),
                train_mask=train_mask, num_nodes=ds.num_nodes)


def _model_code(table, ids):
    """What model code does with a feature table: gathers by id, a reduction, an elementwise op."""
    total = 0.0
    for idx in ids:
        x = table[idx]
        total += float(x.sum())
    total += float(table.mean()) + float((table * 0.5).max())
    return total


def _measure(fns, rounds):
    """Interleaved rounds: ``{side: [seconds per round]}``; round 0 is a warm-up, left out."""
    times = {side: [] for side in fns}
    for r in range(rounds + 1):
        for side, fn in fns.items():
            torch.manual_seed(r)
            t0 = time.perf_counter()
            fn()
            if r:
                times[side].append(time.perf_counter() - t0)
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--root", default="data", help="directory that holds the datasets")
    p.add_argument("--dataset", default="synth-small", help="an OGB-layout dataset, or a preset made when missing")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per idiom (plus one warm-up)")
    p.add_argument("--batches", type=int, default=16,
                   help="training batches per epoch: the epoch's seeds are the first batches x batch-size training "
                        "nodes (whole epochs: the graph's other nodes are still sampled as neighbours)")
    p.add_argument("--batch-size", type=int, default=1024, help="seed nodes per batch (reddit.py's)")
    p.add_argument("--fanouts", type=int, nargs="+", default=[25, 10], help="reddit.py's neighbours per layer")
    p.add_argument("--hidden", type=int, default=256, help="reddit.py's hidden units")
    p.add_argument("--workers", type=int, default=6,
                   help="reddit.py's sampling workers (persistent), in 'train, workers' and 'layer-wise inference'")
    p.add_argument("--only", nargs="+", choices=IDIOMS, default=list(IDIOMS), metavar="IDIOM",
                   help=f"idioms to run, of: {', '.join(IDIOMS)}")
    p.add_argument("--name", default="pyg_idioms", help="file stem of the JSON and PNG in benchmarks/results")
    p.add_argument("--script", choices=["pyg", "directload"],
                   help="run the whole-script idiom once with this side's loader and exit (the benchmark starts "
                        "it in fresh processes)")
    args = p.parse_args(argv)
    if args.script:
        return _script(args.script, args)
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        print("PyG is not installed here: this benchmark runs in the PyG lane", file=sys.stderr)
        return 1
    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset)
    ds = load(args.root, args.dataset)
    data = _user_data(args)
    fns = idioms(data, args)
    rows, results = [], {}
    for name in args.only:
        times = _measure(fns[name], args.rounds)
        ratios = [d / p for p, d in zip(times["pyg"], times["directload"])]
        res = {side: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "runs_s": t}
               for side, t in times.items()}
        res["ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        results[name] = res
        rows.append({"idiom": name, "PyG s": res["pyg"]["median_s"],
                     "PyG range": f"{res['pyg']['min_s']:.3f}-{res['pyg']['max_s']:.3f}",
                     "directload s": res["directload"]["median_s"],
                     "directload range": f"{res['directload']['min_s']:.3f}-{res['directload']['max_s']:.3f}",
                     "directload / PyG": f"{res['ratio']['median']:.2f} ({res['ratio']['min']:.2f}-"
                                         f"{res['ratio']['max']:.2f})"})
        print(f"{name}: PyG {res['pyg']['median_s']:.3f} s, directload {res['directload']['median_s']:.3f} s, "
              f"ratio {res['ratio']['median']:.2f}", flush=True)
    print()
    print_table(rows, ["idiom", "PyG s", "PyG range", "directload s", "directload range", "directload / PyG"])
    path = write_json(args.name, {"benchmark": "pyg_idioms", "args": vars(args), "system": system_facts(),
                                  "dataset": {"name": args.dataset, "nodes": ds.num_nodes, "edges": ds.num_edges,
                                              "feats": int(ds.feat.shape[1])},
                                  "results": results})
    _plot(results, RESULTS / f"{args.name}.png")
    print(f"\nwrote {path} and {path.with_suffix('.png')}")
    return 0


def _plot(results, path):
    """Left: each idiom's per-round ratio, directload / PyG (median, whiskers at the range, 1 = parity);
    right: the seconds of each side, on a log scale (the idioms span three orders of magnitude)."""
    plt = pyplot()
    names = list(results)
    y = list(range(len(names)))[::-1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.45 * len(names) + 2), sharey=True)
    med = [results[n]["ratio"]["median"] for n in names]
    lo = [m - results[n]["ratio"]["min"] for m, n in zip(med, names)]
    hi = [results[n]["ratio"]["max"] - m for m, n in zip(med, names)]
    left.errorbar(med, y, xerr=[lo, hi], fmt="o", capsize=3, color="tab:orange")
    left.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set_yticks(y, names)
    left.set_xlabel("directload / PyG, per round (median, range); < 1: faster")
    for k, side in enumerate(("pyg", "directload")):
        right.barh([v + 0.2 - 0.4 * k for v in y], [results[n][side]["median_s"] for n in names], 0.4,
                   label={"pyg": "PyG's NeighborLoader", "directload": "directload's"}[side])
    right.set_xscale("log")
    right.set_xlabel("seconds (median)")
    right.legend(fontsize=8)
    fig.suptitle("PyG's idioms, one import changed")
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
