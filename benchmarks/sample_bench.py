"""Sampling-only epoch time: directload's neighbour sampler against PyG's and DGL's, interleaved in rounds.

One epoch of the dataset's training seeds (shuffled, in batches), sampled by
every sampler this environment has, at each thread count (torch's, Numba's and
DGL's).  Round ``r`` gives every sampler the same seed batches, in an order
rotated by ``r``, so a slow drift of a shared machine hits all of them alike.

- PyG lane: ``torch.ops.torch_sparse.neighbor_sample`` as PyG calls it (CSC
  from ``to_csc``) against ``directload.sampler.NeighborSampler(layout="pyg")``;
  and the loader epochs (no training) of PyG's ``NeighborLoader``,
  directload's ``NeighborLoader(sampler="directload")`` and PyG's loader with
  ``neighbor_sampler=directload.loaders.pyg.NeighborSampler``.
- DGL lane: DGL's ``NeighborSampler.sample_blocks`` (fused where DGL fuses:
  above one thread), ``dgl.sampling.sample_neighbors`` plus ``dgl.to_block``
  per hop, and directload's ``BlockSampler`` (or, where that does not import,
  its sampler in layout "dgl" plus ``dgl.create_block``).

Both lanes sample 5, 10 then 15 neighbours from the seeds outwards (PyG's
``[5, 10, 15]``, DGL's ``[15, 10, 5]``).  ``--device cuda`` times directload's
GPU sampler over the graph in unified memory against PyG's sampler and DGL's
UVA ``DataLoader``.  Prints a table, writes JSON and a PNG to
benchmarks/results/.
"""

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numba
import torch
from tqdm import tqdm

os.environ.setdefault("OUTDATED_IGNORE", "1")  # ogb, imported by the datasets, would ask the network for news
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, parse_with_quick, pyplot, save_figure, system_facts, table_text, write_json  # noqa: E402

from directload.capabilities import capabilities  # noqa: E402
from directload.datasets import PRESETS, dataset_exists, load, synthesize  # noqa: E402
from directload.graph import CSCGraph  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402
from directload.sampler import NeighborSampler  # noqa: E402
from directload.unified import host_of  # noqa: E402

QUICK = dict(dataset="synth-tiny", rounds=2, batch_size=256)
WARMUP_BATCHES = 2
#: Neighbours per hop, the seeds' hop first (PyG's order); DGL lists the input layer's first.
PYG_FANOUTS = [5, 10, 15]
DGL_FANOUTS = PYG_FANOUTS[::-1]


@dataclass
class Method:
    """One sampler: ``epoch(rnd)`` samples every batch of a :class:`Round` and returns the edges sampled;
    ``prepare(rnd)``, untimed, readies it for that round; ``note`` is a remark, or ``note(threads)``."""

    name: str
    lane: str
    group: str
    epoch: Callable
    prepare: Callable = lambda rnd: None
    note: object = ""


@dataclass
class Round:
    """One round's seed batches: ``positions`` index the training ids, ``seeds`` are those ids."""

    positions: list = field(default_factory=list)
    seeds: list = field(default_factory=list)


def make_round(train, batch_size, seed, limit=None):
    """The seed batches of one shuffled epoch of ``train``, the same for ``seed`` on every call.

    >>> r = make_round(torch.arange(10, 20), 4, seed=0)
    >>> [len(b) for b in r.seeds], sorted(torch.cat(r.seeds).tolist()) == list(range(10, 20))
    ([4, 4, 2], True)
    """
    perm = torch.randperm(train.numel(), generator=torch.Generator().manual_seed(seed))
    positions = list(perm.split(batch_size))[:limit]
    return Round(positions, [train[p] for p in positions])


def set_threads(n):
    """``n`` threads for torch, Numba and (where it imports) DGL's OpenMP pool."""
    torch.set_num_threads(n)
    numba.set_num_threads(n)
    if "dgl" in sys.modules:
        sys.modules["dgl"].utils.set_num_threads(n)


def span(values, digits):
    """``median (min-max)``.

    >>> span([0.5, 0.25, 1.0], 2)
    '0.50 (0.25-1.00)'
    """
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _sampled_edges(sampler, cuda=False):
    """``epoch(rnd)`` of a directload ``NeighborSampler``: every batch sampled, the edges counted."""
    def epoch(rnd):
        edges = sum(sum(sampler.sample(s).num_sampled_edges) for s in rnd.seeds)
        if cuda:
            torch.cuda.synchronize()
        return edges
    return epoch


class _BatchSampler:
    """A ``DataLoader`` ``batch_sampler`` yielding the round's batches (positions into the loader's
    ``input_nodes``), so the loaders sample the seed batches the samplers do."""

    def __init__(self):
        self.batches = []

    def set(self, rnd):
        self.batches = [p.tolist() for p in rnd.positions]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def _loader(make):
    """A loader method's ``(epoch, prepare)`` for ``make(batch_sampler)``, a PyG-style ``NeighborLoader``."""
    batches = _BatchSampler()
    loader = make(batches)
    return (lambda rnd: sum(b.edge_index.size(1) for b in loader)), batches.set


def _build(methods, skipped, name, lane, group, build):
    """``methods += [Method(name, lane, group, *build())]``, or a line in ``skipped`` where a framework or one
    of its parts does not import."""
    try:
        methods.append(Method(name, lane, group, *build()))
    except ImportError as exc:
        skipped.append({"sampler": name, "lane": lane, "reason": f"{type(exc).__name__}: {exc}"})


def pyg_methods(ds, args):
    """The PyG lane's methods and skips: PyG's sampler op and directload's, then (on the CPU) the loaders."""
    cuda = args.device == "cuda"
    names = ["PyG torch_sparse", "directload cuda" if cuda else "directload pyg layout"]
    if not cuda:
        names += ["PyG NeighborLoader", "directload NeighborLoader", "PyG loader + directload sampler"]
    try:
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader as PygLoader
    except ImportError as exc:
        return [], [{"sampler": n, "lane": "pyg", "reason": f"PyG does not import ({exc})"} for n in names]
    plain = Data(x=host_of(ds.feat), y=ds.labels, edge_index=ds.edge_index, num_nodes=ds.num_nodes)
    methods, skipped = [], []

    def torch_sparse():
        import torch_sparse  # noqa: F401  (registers torch.ops.torch_sparse)
        from torch_geometric.sampler.utils import to_csc

        colptr, row, _ = to_csc(plain, device="cpu")  # as PyG's NeighborSampler does
        op = torch.ops.torch_sparse.neighbor_sample
        return (lambda rnd: sum(op(colptr, row, s.to(colptr.dtype), PYG_FANOUTS, False, True)[1].numel()
                                for s in rnd.seeds)),

    def ours():
        graph = CSCGraph.from_edge_index(ds.edge_index, ds.num_nodes)
        if cuda:
            return _sampled_edges(NeighborSampler(graph.to_unified(), PYG_FANOUTS, device="cuda"), cuda=True),
        return _sampled_edges(NeighborSampler(graph, PYG_FANOUTS, layout="pyg")),

    def loader(which):
        def build():
            kw = dict(num_neighbors=PYG_FANOUTS, input_nodes=ds.split["train"])
            if which == "pyg":
                return _loader(lambda bs: PygLoader(plain, batch_sampler=bs, **kw))
            from directload.loaders.pyg import NeighborLoader
            from directload.loaders.pyg import NeighborSampler as PygSampler
            if which == "directload":
                return _loader(lambda bs: NeighborLoader(ds.to_pyg(), batch_sampler=bs, sampler="directload", **kw))
            return _loader(lambda bs: PygLoader(plain, batch_sampler=bs, neighbor_sampler=PygSampler(
                plain, PYG_FANOUTS), **kw))
        return build

    builds = [torch_sparse, ours, loader("pyg"), loader("directload"), loader("mixed")]
    for name, build in zip(names, builds):
        _build(methods, skipped, name, "pyg", "sampler" if build in (torch_sparse, ours) else "loader", build)
    return methods, skipped


def _blocks(dgl, batch, idtype):
    """DGL blocks, the input layer's first, of a batch sampled with ``layout="dgl"``: hop ``h``'s destination
    nodes are every node reached before it, its sources those plus the hop's new ones."""
    blocks, nn = [], batch.num_sampled_nodes
    for h, (row, col, eid) in enumerate(batch.hops):
        n_dst, n_src = sum(nn[:h + 1]), sum(nn[:h + 2])
        block = dgl.create_block((row.to(idtype), col.to(idtype)), num_src_nodes=n_src, num_dst_nodes=n_dst,
                                 idtype=idtype, device=row.device)
        block.srcdata[dgl.NID] = batch.nodes[:n_src].to(idtype)
        block.dstdata[dgl.NID] = batch.nodes[:n_dst].to(idtype)
        block.edata[dgl.EID] = eid.to(idtype)
        blocks.insert(0, block)
    return blocks


def _edges(blocks):
    return sum(b.num_edges() for b in blocks)


def dgl_methods(ds, args):
    """The DGL lane's methods and skips: DGL's ``NeighborSampler`` (its UVA ``DataLoader`` with ``--device
    cuda``), DGL's per-hop ``sample_neighbors`` and ``to_block`` (CPU), and directload's sampler."""
    cuda = args.device == "cuda"
    names = (["DGL UVA DataLoader", "directload cuda + create_block"] if cuda else
             ["DGL NeighborSampler", "DGL sample_neighbors+to_block", "directload BlockSampler"])
    try:
        import dgl
    except ImportError as exc:
        return [], [{"sampler": n, "lane": "dgl", "reason": f"DGL does not import ({exc})"} for n in names]
    g = dgl.graph((ds.edge_index[0], ds.edge_index[1]), num_nodes=ds.num_nodes)
    g.create_formats_()
    theirs = dgl.dataloading.NeighborSampler(DGL_FANOUTS)
    graph = CSCGraph.from_edge_index(ds.edge_index, ds.num_nodes)  # edge ids: positions, as g's
    methods = []
    if cuda:
        holder = {}

        def prepare(rnd):
            holder["loader"] = dgl.dataloading.DataLoader(
                g, torch.cat(rnd.seeds).to("cuda"), theirs, device="cuda", use_uva=True,
                batch_size=args.batch_size, shuffle=False)

        def uva(rnd):
            edges = sum(_edges(blocks) for _, _, blocks in holder["loader"])
            torch.cuda.synchronize()
            return edges

        ours = NeighborSampler(graph.to_unified(), PYG_FANOUTS, layout="dgl", device="cuda")

        def ours_epoch(rnd):
            edges = sum(_edges(_blocks(dgl, ours.sample(s), g.idtype)) for s in rnd.seeds)
            torch.cuda.synchronize()
            return edges

        methods += [Method(names[0], "dgl", "sampler", uva, prepare), Method(names[1], "dgl", "sampler", ours_epoch)]
        return methods, []

    def manual(seeds):
        edges = 0
        for fanout in reversed(DGL_FANOUTS):
            block = dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, fanout), seeds)
            seeds, edges = block.srcdata[dgl.NID], edges + block.num_edges()
        return edges

    methods += [
        Method(names[0], "dgl", "sampler", lambda rnd: sum(_edges(theirs.sample_blocks(g, s)[2]) for s in rnd.seeds),
               note=lambda t: "fused" if theirs.fused and t > 1 else "not fused (DGL fuses above 1 thread)"),
        Method(names[1], "dgl", "sampler", lambda rnd: sum(manual(s) for s in rnd.seeds))]
    try:
        from directload.loaders.dgl.sampler import NeighborSampler as BlockSampler

        block_sampler = BlockSampler(DGL_FANOUTS)
        why = block_sampler.unsupported(g)
    except ImportError as exc:
        block_sampler, why = None, f"directload.loaders.dgl.sampler does not import ({exc})"
    if why is None:
        methods.append(Method(names[2], "dgl", "sampler",
                               lambda rnd: sum(_edges(block_sampler.sample_blocks(g, s)[2]) for s in rnd.seeds)))
    else:
        print(f"directload BlockSampler: {why}; timing directload's sampler in layout 'dgl' plus dgl.create_block")
        ours = NeighborSampler(graph, PYG_FANOUTS, layout="dgl")
        methods.append(Method("directload dgl layout + create_block", "dgl", "sampler",
                              lambda rnd: sum(_edges(_blocks(dgl, ours.sample(s), g.idtype)) for s in rnd.seeds),
                              note=why))
    return methods, []


def summarize(samples, methods, threads):
    """Rows of one thread count: per method its epoch seconds, the per-round ratio to its group's reference
    (the framework's own, listed first in the group), edges per batch and microseconds per sampled edge.

    ``samples[name]`` is a list of ``(seconds, edges, batches)``, one per round.

    >>> from types import SimpleNamespace as M
    >>> ms = [M(name="a", lane="x", group="g", note=""), M(name="b", lane="x", group="g", note="")]
    >>> rows = summarize({"a": [(2.0, 100, 2), (4.0, 100, 2)], "b": [(1.0, 100, 2), (1.0, 100, 2)]}, ms, 1)
    >>> rows[1]["reference"], rows[1]["vs_reference"], rows[1]["edges_per_batch"]
    ('a', {'median': 0.375, 'min': 0.25, 'max': 0.5}, 50.0)
    """
    rows, refs = [], {}
    for m in methods:
        if m.name not in samples:
            continue
        ref = refs.setdefault((m.lane, m.group), m.name)
        secs = [s for s, _, _ in samples[m.name]]
        row = {"lane": m.lane, "group": m.group, "threads": threads, "sampler": m.name, "reference": ref,
               "note": m.note(threads) if callable(m.note) else m.note, "epoch_s": secs,
               "median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs),
               "edges_per_batch": statistics.fmean(e / b for _, e, b in samples[m.name]),
               "us_per_edge": statistics.median(1e6 * s / e for s, e, _ in samples[m.name] if e),
               "batches": samples[m.name][0][2]}
        if ref != m.name:
            ratios = [s / r for s, (r, _, _) in zip(secs, samples[ref])]
            row["vs_reference"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        rows.append(row)
    return rows


def table(rows):
    """The printed table: median epoch seconds (min-max), the time over the reference's (min-max), edges per
    batch and microseconds per sampled edge."""
    body = [{"lane": r["lane"], "threads": r["threads"], "sampler": r["sampler"],
             "epoch s (min-max)": span(r["epoch_s"], 3),
             "vs ref (min-max)": ("ref" if "vs_reference" not in r else
                                  "{median:.2f} ({min:.2f}-{max:.2f})".format(**r["vs_reference"])),
             "edges/batch": f"{r['edges_per_batch']:.0f}", "us/edge": f"{r['us_per_edge']:.3f}", "note": r["note"]}
            for r in rows]
    return table_text(body, list(body[0]) if body else [])


def time_rounds(methods, args, train):
    """``{name: [(seconds, edges, batches) per round]}`` at the current thread count; a method that fails
    is dropped with a printed reason."""
    live = []
    warm = make_round(train, args.batch_size, args.seed, limit=WARMUP_BATCHES)
    for m in methods:
        try:
            m.prepare(warm)
            m.epoch(warm)  # compile, build the CSC, fault pages in
            live.append(m)
        except Exception as exc:  # a framework's own error: report it and time the others
            print(f"skipped {m.name}: failed in warm-up ({type(exc).__name__}: {exc})")
    samples = {m.name: [] for m in live}
    for r in tqdm(range(args.rounds), desc="rounds", unit="round", leave=False):
        rnd = make_round(train, args.batch_size, args.seed * 1_000_003 + r)
        k = r % max(1, len(live))
        for m in live[k:] + live[:k]:
            m.prepare(rnd)
            gc.collect()
            t0 = time.perf_counter()
            edges = m.epoch(rnd)
            samples[m.name].append((time.perf_counter() - t0, int(edges), len(rnd.seeds)))
    return samples


def _plot(rows, path, args):
    panels = list(dict.fromkeys((r["lane"], r["group"]) for r in rows))
    if not panels:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.8), squeeze=False)
    for ax, (lane, group) in zip(axes[0], panels):
        sub = [r for r in rows if (r["lane"], r["group"]) == (lane, group)]
        names = list(dict.fromkeys(r["sampler"] for r in sub))
        threads = list(dict.fromkeys(r["threads"] for r in sub))
        width = 0.8 / len(threads)
        for i, t in enumerate(threads):
            by = {r["sampler"]: r for r in sub if r["threads"] == t}
            xs = [j + i * width for j, n in enumerate(names) if n in by]
            med = [by[n]["median_s"] for n in names if n in by]
            err = [[by[n]["median_s"] - by[n]["min_s"] for n in names if n in by],
                   [by[n]["max_s"] - by[n]["median_s"] for n in names if n in by]]
            ax.bar(xs, med, width, yerr=err, capsize=3, label=f"{t} thread{'s' * (t > 1)}")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("seconds per epoch (median, min-max)")
        ax.set_title(f"{lane}: {group}s")
        ax.legend(fontsize=8)
    fig.suptitle(f"sampling epoch, {args.dataset}, batch {args.batch_size}, {args.rounds} rounds, {args.device}")
    fig.tight_layout()
    save_figure(fig, path)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--dataset", default="synth-small", help="dataset under --root (a synthetic preset is made "
                   "when missing)")
    p.add_argument("--root", default="data", help="directory that holds the datasets")
    p.add_argument("--rounds", type=int, default=5, help="timed epochs per sampler and thread count, interleaved")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to time")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the rounds' shuffles")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: directload's GPU sampler over the graph in unified memory")
    p.add_argument("--results", default=str(RESULTS), help="directory for the JSON and PNG")
    p.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK} unless given")
    return p


def main(argv=None):
    p = build_parser()
    args = parse_with_quick(p, argv, QUICK)
    if args.device == "cuda" and not capabilities().cuda:
        raise SystemExit("sample_bench: --device cuda needs a CUDA device, and this machine has none")
    if args.rounds < 1 or args.batch_size < 1:
        p.error("--rounds and --batch-size must be at least 1")
    if min(args.threads) < 1 or max(args.threads) > numba.config.NUMBA_NUM_THREADS:
        p.error(f"--threads must be between 1 and Numba's {numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS)")
    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset, progress=False)
    ds = load(args.root, args.dataset)
    train = ds.split["train"]
    methods, skipped = [], []
    for lane in (pyg_methods, dgl_methods):
        got, why = lane(ds, args)
        methods += got
        skipped += why
    for s in skipped:
        print(f"skipped {s['sampler']}: {s['reason']}")
    print(f"{args.dataset}: {ds.num_nodes} nodes, {ds.num_edges} edges, {train.numel()} training seeds in batches "
          f"of {args.batch_size}; {args.rounds} rounds, device {args.device}")
    rows = []
    for t in args.threads:
        set_threads(t)
        rows += summarize(time_rounds(methods, args, train), methods, t)
    print(table(rows))
    print("vs ref: epoch time over the first sampler of its lane and group (the framework's), round by round")
    lanes = "-".join(dict.fromkeys(m.lane for m in methods)) or "none"
    name = f"sample_{args.dataset}_{lanes}" + ("_cuda" if args.device == "cuda" else "")
    out = Path(args.results)
    # write_json puts a name under benchmarks/results/; an absolute one is kept where it says
    path = write_json(str(out.resolve() / name), {
        "system": system_facts(), "args": vars(args), "dataset": {"name": args.dataset, "num_nodes": ds.num_nodes,
                                                                  "num_edges": ds.num_edges,
                                                                  "train_seeds": train.numel()},
        "rows": rows, "skipped": skipped})
    _plot(rows, out / f"{name}.png", args)
    print(f"wrote {path} and {out / (name + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
