"""The GPU epoch end to end: GraphSAGE trained with four PyG-lane loaders side by side, stage by stage.

Configurations, run interleaved for every seed on the same device:

* ``pyg``: PyG's own loader (its sampler on the CPU, a CPU gather, then a copy);
* ``pyg+dl``: PyG's loader over directload's features (unified tables, gathered onto the device);
* ``dl-cpu``: directload's loader sampling on the CPU (the twin), the batch copied;
* ``dl-gpu``: directload's loader with everything on the device (``device=``: sampled, relabelled and gathered
  there, never back on the host).

Per configuration: the steady epoch (median over seeds of each run's epochs after the first; min-max), its
ratio to ``pyg`` and ``dl-cpu``, a stage profile over ``--profile-batches`` batches (sample, gather with the
copy, train: each stage waited for, so they add up), host syncs per batch in the timed epochs (CUDA's sync
debug mode, counted), and test accuracy (mean over seeds).  The goals of the GPU path are printed met or not.

``--device cuda`` on a GPU; ``--device cpu`` runs the three host configurations; ``--device emulated`` runs
``dl-gpu`` through the device seam (sample.cu's kernels on the host: a check that the script and the device
path work, not a GPU figure).  Without a usable PyG sampler (pyg-lib or torch-sparse) ``pyg`` and ``pyg+dl``
are left out and said so.  ``--exceed-gpu`` adds a generated graph whose features exceed the GPU's free
memory, when the host's memory and disk can hold it (else it says why not).
"""

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, grouped_bars, parse_with_quick, print_table, system_facts, write_json  # noqa: E402

from directload.harness.parser import HelpFormatter  # noqa: E402

CONFIGS = ("pyg", "pyg+dl", "dl-cpu", "dl-gpu")
#: The goals of the GPU path, checked on a GPU only.
GOALS = {"vs_pyg": 0.25, "vs_dl_cpu": 0.6, "sample_gather_share": 0.15, "acc_pp": 1.0}


#: ``--quick``'s values for every option left at its default.
QUICK = {"datasets": ["synth-small"], "seeds": 1, "epochs": 2, "max_batches": 40, "profile_batches": 10,
         "eval_nodes": 2048}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cpu, or emulated (the device seam, for a CPU check)")
    p.add_argument("--datasets", nargs="+", default=["synth-small", "synth-medium"], help="generated datasets")
    p.add_argument("--root", default="data", help="where the datasets are (generated when missing)")
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is left out of the median")
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 10, 10], help="per hop, the seeds' first")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--max-batches", type=int, default=0, help="batches per epoch (0: the whole training split)")
    p.add_argument("--profile-batches", type=int, default=20)
    p.add_argument("--eval-nodes", type=int, default=4096, help="test nodes scored per run")
    p.add_argument("--exceed-gpu", action="store_true", help="add a graph whose features exceed free GPU memory")
    p.add_argument("--budget-s", type=float, default=None, help="start no new seed after this many seconds")
    p.add_argument("--quick", action="store_true", help="synth-small, 1 seed, 2 epochs of at most 40 batches")
    p.add_argument("--name", default="gpu/epoch_e2e")
    return p


def parse(argv=None):
    return parse_with_quick(build_parser(), argv, QUICK)


class Device:
    """Where the run trains and what ``dl-gpu`` samples on: a CUDA device, the CPU, or the emulated device."""

    def __init__(self, name):
        self.name = name
        if name == "emulated":
            from directload.emulated_gpu import EmulatedGpu

            self.path, self.torch = EmulatedGpu(), torch.device("cpu")
        else:
            from directload.batch_device import batch_device

            self.torch = torch.device(name)
            self.path = batch_device(self.torch)
        self.cuda = self.torch.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.torch)

    def reads(self):
        return self.path.reads.count if self.path is not None else 0


def pyg_can_sample():
    import torch_geometric.typing as t

    return bool(t.WITH_PYG_LIB or t.WITH_TORCH_SPARSE)


def dataset(root, name, exceed_gpu_bytes=None):
    from directload.datasets import load, synthesize
    from directload.datasets.synthetic import PRESETS, SynthConfig, dataset_exists

    config = None
    if exceed_gpu_bytes:
        feats = 256
        nodes = exceed_gpu_bytes // (feats * 4) + 1
        config = SynthConfig(num_nodes=int(nodes), avg_degree=5, num_feats=feats, split=(0.001, 0.001))
    elif name not in PRESETS:
        raise SystemExit(f"unknown dataset {name!r}: one of {', '.join(PRESETS)}")
    if not dataset_exists(root, name):
        synthesize(root, name, config)
    return load(root, name)


def make_loader(config, ds, ids, args, device, shuffle):
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader as PygNeighborLoader

    from directload.loaders.pyg import NeighborLoader, unified_data
    from directload.unified import host_of

    kw = dict(num_neighbors=list(args.fanouts), input_nodes=ids, batch_size=args.batch_size, shuffle=shuffle,
              filter_per_worker=False)
    if config == "pyg":  # a plain host table: PyG's slicing, then a copy
        return PygNeighborLoader(Data(x=host_of(ds.feat), y=ds.labels, edge_index=ds.edge_index,
                                      num_nodes=ds.num_nodes), **kw)
    if config == "pyg+dl":
        return PygNeighborLoader(unified_data(ds.to_pyg()), **kw)
    if config == "dl-cpu":
        return NeighborLoader(ds.to_pyg(), sampler="directload", lookahead=4, **kw)
    return NeighborLoader(ds.to_pyg(), sampler="directload", device=device.path, lookahead=4, **kw)


def model_for(ds, args, device):
    from directload.harness.train_pyg import SAGE

    return SAGE(ds.feat.shape[1], 256, ds.num_classes, len(args.fanouts), 0.5).to(device.torch)


def step(model, opt, batch, device):
    """One training step; returns the loss on the device (not read)."""
    n = batch.batch_size
    x = batch.x.to(device.torch, non_blocking=True).float()
    edge_index = batch.edge_index.to(device.torch, non_blocking=True)
    y = batch.y[:n].to(device.torch, non_blocking=True)
    out = model(x, edge_index, *_hops(batch))[:n]
    loss = F.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def _hops(batch):
    """The per-hop counts ``trim_to_layer`` reads, where the sampler gives them (torch-sparse's does not)."""
    return getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None)


class SyncCounter:
    """Host syncs on a CUDA device while it is entered: CUDA's sync debug mode, its warnings counted."""

    def __init__(self, device):
        self.device, self.count = device, 0

    def __enter__(self):
        if self.device.cuda:
            self._old = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            self._caught = warnings.catch_warnings(record=True)
            self._log = self._caught.__enter__()
            warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        if self.device.cuda:
            torch.cuda.set_sync_debug_mode(self._old)
            self._caught.__exit__(*exc)
            self.count = sum("synchroniz" in str(w.message) for w in self._log)


def train_epoch(model, opt, loader, device, max_batches):
    """``(seconds, batches, syncs, host reads)`` of one epoch, timed to the device's end."""
    reads0 = device.reads()
    device.sync()
    t0 = time.perf_counter()
    n = 0
    with SyncCounter(device) as syncs:
        for batch in loader:
            step(model, opt, batch, device)
            n += 1
            if max_batches and n >= max_batches:
                break
    device.sync()
    return time.perf_counter() - t0, n, syncs.count, device.reads() - reads0


def profile(model, opt, loader, device, batches, batch_size, total):
    """Median milliseconds per batch of each stage, each waited for: sample, gather (with the copy), train."""
    times = {"sample": [], "gather": [], "train": []}
    for i in range(min(batches, -(-total // batch_size))):
        positions = torch.arange(i * batch_size, min((i + 1) * batch_size, total))
        device.sync()
        t0 = time.perf_counter()
        out = loader.collate_fn(positions)
        device.sync()
        t1 = time.perf_counter()
        batch = loader.filter_fn(out).to(device.torch, non_blocking=True)
        device.sync()
        t2 = time.perf_counter()
        step(model, opt, batch, device)
        device.sync()
        t3 = time.perf_counter()
        for k, a, b in (("sample", t0, t1), ("gather", t1, t2), ("train", t2, t3)):
            times[k].append(1e3 * (b - a))
    return {k: statistics.median(v) for k, v in times.items()}


@torch.no_grad()
def accuracy(model, config, ds, args, device):
    ids = ds.split["test"][:args.eval_nodes]
    model.eval()
    correct, total = 0, 0
    for batch in make_loader(config, ds, ids, args, device, False):
        n = batch.batch_size
        out = model(batch.x.to(device.torch).float(), batch.edge_index.to(device.torch), *_hops(batch))[:n]
        correct = correct + (out.argmax(1) == batch.y[:n].to(device.torch)).sum()
        total += n
    model.train()
    return int(correct) / max(total, 1)


def run(config, ds, args, device, seed):
    torch.manual_seed(seed)
    model = model_for(ds, args, device)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    ids = ds.split["train"]
    loader = make_loader(config, ds, ids, args, device, True)
    epochs = [train_epoch(model, opt, loader, device, args.max_batches) for _ in range(args.epochs)]
    stages = profile(model, opt, make_loader(config, ds, ids, args, device, False), device, args.profile_batches,
                     args.batch_size, len(ids))
    return {"config": config, "seed": seed, "epochs_s": [e[0] for e in epochs], "batches": epochs[-1][1],
            "syncs_per_batch": sum(e[2] for e in epochs) / max(1, sum(e[1] for e in epochs)),
            "reads_per_batch": sum(e[3] for e in epochs) / max(1, sum(e[1] for e in epochs)),
            "stages_ms": stages, "test_acc": accuracy(model, config, ds, args, device)}


def summarize(runs, hops):
    rows = []
    for config in dict.fromkeys(r["config"] for r in runs):
        rs = [r for r in runs if r["config"] == config]
        steady = [statistics.median(r["epochs_s"][1:] or r["epochs_s"]) for r in rs]
        stages = {k: statistics.median(r["stages_ms"][k] for r in rs) for k in ("sample", "gather", "train")}
        rows.append({"config": config, "seeds": len(rs), "epoch_s": statistics.median(steady),
                     "epoch_min": min(steady), "epoch_max": max(steady), "batches": rs[0]["batches"],
                     "sample_ms": stages["sample"], "gather_ms": stages["gather"], "train_ms": stages["train"],
                     "sample_gather_share": (stages["sample"] + stages["gather"]) / max(1e-9, sum(stages.values())),
                     "syncs_per_batch": statistics.median(r["syncs_per_batch"] for r in rs),
                     "reads_per_batch": statistics.median(r["reads_per_batch"] for r in rs),
                     "test_acc_pct": 100 * statistics.mean(r["test_acc"] for r in rs)})
    by = {r["config"]: r for r in rows}
    for r in rows:
        for base, key in (("pyg", "vs_pyg"), ("dl-cpu", "vs_dl_cpu")):
            if base in by:
                r[key] = r["epoch_s"] / by[base]["epoch_s"]
        if "pyg" in by:
            r["acc_vs_pyg_pp"] = r["test_acc_pct"] - by["pyg"]["test_acc_pct"]
    return rows


def goals(rows, hops, device):
    """The GPU path's goals, met or not (on a GPU only: elsewhere nothing is claimed)."""
    gpu = next((r for r in rows if r["config"] == "dl-gpu"), None)
    if gpu is None or not device.cuda:
        return ["goals: not checked (they are GPU figures; this run had no GPU path on a CUDA device)"]
    out = []
    checks = [("epoch vs PyG's <= 0.25x", gpu.get("vs_pyg"), lambda v: v <= GOALS["vs_pyg"]),
              ("epoch vs directload's CPU sampling <= 0.6x", gpu.get("vs_dl_cpu"), lambda v: v <= GOALS["vs_dl_cpu"]),
              ("sample + gather <= 15% of the batch", gpu["sample_gather_share"],
               lambda v: v <= GOALS["sample_gather_share"]),
              (f"host syncs per batch <= {hops} (one per hop)", gpu["syncs_per_batch"], lambda v: v <= hops),
              ("test accuracy within 1 point of PyG's", gpu.get("acc_vs_pyg_pp"), lambda v: abs(v) <= GOALS["acc_pp"])]
    for what, value, ok in checks:
        out.append(f"goal {what}: " + ("not measured" if value is None else
                                        f"{value:.3f} {'met' if ok(value) else 'NOT met'}"))
    return out


def main(argv=None):
    args = parse(argv)
    device = Device(args.device)
    configs = list(args.configs)
    if not pyg_can_sample():
        print("PyG has no sampler here (neither pyg-lib nor torch-sparse loads): pyg and pyg+dl are left out")
        configs = [c for c in configs if c not in ("pyg", "pyg+dl")]
    if device.path is None and "dl-gpu" in configs:
        print(f"dl-gpu needs a device path; {args.device} has none: left out")
        configs.remove("dl-gpu")
    names = list(args.datasets)
    if args.exceed_gpu:
        names.append(exceed_gpu_name(device))
    t_start = time.monotonic()
    report = {"system": system_facts(), "args": vars(args), "datasets": {}}
    for name in [n for n in names if n]:
        free = torch.cuda.mem_get_info(device.torch)[0] if name == "synth-exceed" and device.cuda else None
        ds = dataset(args.root, name, free)
        runs = []
        for seed in range(args.seeds):
            if args.budget_s and seed and time.monotonic() - t_start > args.budget_s:
                print(f"{name}: budget spent after {seed} seed(s)")
                break
            for config in configs:
                runs.append(run(config, ds, args, device, seed))
        rows = summarize(runs, len(args.fanouts))
        print(f"\n{name}: {ds.num_nodes} nodes, {ds.feat.shape[1]} features, fanouts {args.fanouts}, batch "
              f"{args.batch_size}, on {args.device}")
        print_table(rows, ["config", "seeds", "epoch_s", "epoch_min", "epoch_max", "vs_pyg", "vs_dl_cpu", "batches",
                           "sample_ms", "gather_ms", "train_ms", "sample_gather_share", "syncs_per_batch",
                           "reads_per_batch", "test_acc_pct", "acc_vs_pyg_pp"])
        lines = goals(rows, len(args.fanouts), device)
        print("\n".join(lines))
        report["datasets"][name] = {"runs": runs, "summary": rows, "goals": lines}
        (RESULTS / args.name).parent.mkdir(parents=True, exist_ok=True)
        grouped_bars(RESULTS / f"{args.name}_{name}.png", [r["config"] for r in rows],
                     {k: [r[f"{k}_ms"] for r in rows] for k in ("sample", "gather", "train")}, "ms per batch",
                     f"GraphSAGE on {name}, {args.device}: stage times per batch")
    path = write_json(args.name, report)
    print(f"\nwrote {path}")
    return 0


def exceed_gpu_name(device):
    """``"synth-exceed"`` when the host can hold a feature table over the GPU's free memory, else None (said)."""
    import shutil

    from _gpu import free_host_bytes

    if not device.cuda:
        print("--exceed-gpu: no GPU here, nothing to exceed")
        return None
    free_gpu = torch.cuda.mem_get_info(device.torch)[0]
    host, disk = free_host_bytes(), shutil.disk_usage(".").free
    need = int(free_gpu * 1.05)
    if need > min(host, disk) * 0.8:
        print(f"--exceed-gpu: blocked here: a table over the GPU's {free_gpu / 2**30:.0f} GiB free needs "
              f"{need / 2**30:.0f} GiB, and the host has {host / 2**30:.0f} GiB free memory and "
              f"{disk / 2**30:.0f} GiB free disk")
        return None
    return "synth-exceed"


if __name__ == "__main__":
    raise SystemExit(main())
