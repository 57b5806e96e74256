"""DistDGL training with directload's features: the server and the trainer of one machine.

Run as ``python -m directload.harness.train_dist SETTINGS MACHINE ROLE`` by :mod:`directload.harness.dist`
(one host) or by hand on real machines.  The trainer is DGL's own distributed GraphSAGE loop
(``examples/distributed/graphsage``: ``DistGraph``, ``node_split``, ``DistNodeDataLoader``, DDP over gloo),
with the one change directload is for: each batch's input features come from
:func:`directload.loaders.dgl.distributed.dist_features`, started one batch ahead.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from directload.stores import FeatureStore
from directload.unified import host_of

from .train_dgl import SAGE, dgl

if TYPE_CHECKING:
    from directload.loaders.dgl.distributed import DecodedDistFeatures, DistFeatures
    from directload.stores import StoreSpec

__all__ = ["settings", "server_main", "trainer_main"]


def settings(path: os.PathLike[str] | str) -> dict[str, Any]:
    """The run's settings (a JSON file written by the launcher)."""
    return json.loads(Path(path).read_text())


def _dgl_env(s, machine, role):
    env = {"DGL_IP_CONFIG": s["ip_config"], "DGL_NUM_SERVER": "1", "DGL_NUM_CLIENT": str(s["machines"]),
           "DGL_CONF_PATH": s["config"], "DGL_GRAPH_FORMAT": "csc", "DGL_NUM_SAMPLER": "0"}
    if role == "server":
        env.update(DGL_ROLE="server", DGL_SERVER_ID=str(machine))
    else:
        env.update(DGL_ROLE="client", DGL_DIST_MODE="distributed", DGL_GROUP_ID="0")
    os.environ.update(env)


def server_main(s: dict[str, Any], machine: int) -> None:
    """Serve partition ``machine`` until the trainers leave (``dgl.distributed.initialize`` returns then)."""
    from directload.loaders.dgl.distributed import read_partitions, serve_features

    _dgl_env(s, machine, "server")
    if read_partitions(s["config"])["features"] == "disk":
        serve_features(s["config"], machine)
    dgl.distributed.initialize(s["ip_config"])


def _verify(s, ids, rows, blocks, orig):
    """Rows and the last block's edges against the original dataset, by original id."""
    feat, edges = orig
    want = feat[torch.from_numpy(s["_orig_nids"][ids.numpy()])]
    if s.get("_codec") is not None:  # rows of codes: the dataset's rows as their codes decode
        from directload.codecs import codec

        want = codec(s["_codec"]).decode(codec(s["_codec"]).encode(want))
    if not torch.equal(rows, want):
        raise AssertionError("a fetched feature row differs from the dataset's")
    block = blocks[-1]
    src, dst = block.edges()
    u = s["_orig_nids"][block.srcdata[dgl.NID][src].numpy()]
    v = s["_orig_nids"][block.dstdata[dgl.NID][dst].numpy()]
    if not np.isin(u * s["_num_nodes"] + v, edges).all():
        raise AssertionError("a sampled edge is not in the dataset's graph")


def trainer_main(s: dict[str, Any], machine: int) -> None:
    """Train, evaluate, and write ``trainer{machine}.json`` in the run directory."""
    from directload.loaders.dgl.distributed import dist_features, read_partitions, register_service

    _dgl_env(s, machine, "client")
    meta = read_partitions(s["config"])
    if meta["features"] == "disk":
        register_service()
    dgl.distributed.initialize(s["ip_config"])
    torch.distributed.init_process_group("gloo", init_method=f"tcp://{s['master']}:{s['gloo_port']}",
                                         rank=machine, world_size=s["machines"],
                                         timeout=datetime.timedelta(seconds=s["timeout"]))
    if meta["codec"] is not None:  # a training run is long: load the kernel that decodes the rows now
        from directload.kernels.decode import prepare_decode

        prepare_decode((meta["codec"],), background=False)
    torch.manual_seed(s["seed"])
    dgl.seed(s["seed"])
    g = dgl.distributed.DistGraph(meta["graph"], part_config=s["config"])
    pb = g.get_partition_book()
    train_ids = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    test_ids = dgl.distributed.node_split(g.ndata["test_mask"], pb, force_even=True)
    from directload.stores import StoreSpec

    # this machine's rows through the stack the launcher's spec describes, over its partition's rows
    local = StoreSpec.from_dict(s["store"]) if s.get("store") else None
    store: DistFeatures | DecodedDistFeatures | _DGLFetch = dist_features(g, s["config"], local=local)
    if s.get("fetch") == "dgl":  # the baseline: DGL's own fetch, g.ndata[...][input_nodes], no look-ahead
        if meta["features"] != "memory" or meta["codec"] is not None:
            raise ValueError("DGL's own fetch needs plain features in DGL's partitions (partition with "
                             "features=memory and no codec)")
        store = _DGLFetch(g.ndata["feat"], store)
    orig: tuple[torch.Tensor, np.ndarray] | None = None
    if s.get("verify"):
        from directload.datasets import load

        ds = load(s["root"], s["dataset"])
        s["_orig_nids"], s["_num_nodes"] = np.load(Path(s["config"]).parent / "orig_nids.npy"), ds.num_nodes
        s["_codec"] = meta["codec"]
        orig = (host_of(ds.feat),
                np.unique(ds.edge_index[0].numpy() * ds.num_nodes + ds.edge_index[1].numpy()))
    num_feats, num_classes = _sizes(meta, g)
    model = torch.nn.parallel.DistributedDataParallel(
        SAGE(num_feats, s["hidden"], num_classes, len(s["fanouts"]), 0.5))
    opt = torch.optim.Adam(model.parameters(), lr=s["lr"])
    sampler = dgl.dataloading.NeighborSampler(s["fanouts"])
    epochs = []
    for _ in range(s["epochs"]):
        loader = dgl.dataloading.DistNodeDataLoader(g, train_ids, sampler, batch_size=s["batch_size"], shuffle=True)
        epochs.append(_epoch(s, model, opt, loader, store, g, orig))
    acc = _evaluate(s, model, g, test_ids, store, sampler)
    tiers = store.stats()
    stats, remote = tiers["partitioned"], tiers.tiers[-1]
    result = {"machine": machine, "part": int(pb.partid), "train_nodes": len(train_ids), "test_acc": acc,
              "epochs": epochs, "local_rows": stats["local_rows"], "remote_rows": stats["remote_rows"],
              "remote_bytes": stats["remote_bytes"], "codec": meta["codec"],
              "remote_s": remote.get("seconds", 0.0), "remote_reads": remote.get("reads", 0),
              "threads": torch.get_num_threads(), "local": _stack_of(store),
              "features": meta["features"], "verified": bool(orig)}
    (Path(s["run_dir"]) / f"trainer{machine}.json").write_text(json.dumps(result))
    store.close()
    torch.distributed.destroy_process_group()
    dgl.distributed.exit_client()


def _stack_of(store):
    """The stores this machine reads its own rows through, top first, by type."""
    from directload.stores import PartitionedStore, walk

    split = next(s for s in walk(store if isinstance(store, FeatureStore) else store.counted)
                 if isinstance(s, PartitionedStore))
    return [type(s).__name__ for s in walk(split.local)]


def _sizes(meta, g):
    """Feature width and classes: from directload's record, or, for partitions DGL wrote alone, from the graph
    (every label is read once, as DGL's own example does)."""
    if meta["num_feats"] is not None:
        return meta["num_feats"], meta["num_classes"]
    labels = g.ndata["label"][torch.arange(g.num_nodes())]
    return int(g.ndata["feat"].shape[1]), int(labels.max()) + 1


class _DGLFetch:
    """DGL's fetch behind the read calls of the loop (for the side-by-side measure), counted as a store is."""

    def __init__(self, tensor, counted):
        self._tensor, self.counted = tensor, counted

    def read_async(self, ids):
        from directload.stores import ReadFuture

        return ReadFuture(result=self._tensor[ids])

    def read(self, ids):
        return self._tensor[ids]

    def stats(self):
        return self.counted.stats()

    def close(self):
        self.counted.close()


def _epoch(s, model, opt, loader, store, g, orig):
    from directload.loaders.dgl.distributed import dist_epoch

    model.train()
    batches, t0, loss = 0, time.perf_counter(), None
    labels = g.ndata["label"]
    epoch, adapter = dist_epoch(loader, store, lookahead=s.get("lookahead", 4))
    with model.join():  # trainers may have one batch more or less: DDP's uneven-input protocol
        for ids, seeds, blocks, x in epoch:
            if orig is not None:
                _verify(s, ids, x, blocks, orig)
            loss = F.cross_entropy(model(blocks, x.float()), labels[seeds])
            opt.zero_grad()
            loss.backward()
            opt.step()
            batches += 1
    fetch = adapter.fetch_ms
    return {"seconds": time.perf_counter() - t0, "batches": batches,
            "fetch_ms_median": statistics.median(fetch) if fetch else 0.0, "fetch_ms": fetch,
            "loss": float(loss) if loss is not None else None}


def _evaluate(s, model, g, ids, store, sampler):
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64)
    loader = dgl.dataloading.DistNodeDataLoader(g, ids, sampler, batch_size=s["batch_size"])
    with torch.no_grad():
        for input_nodes, seeds, blocks in loader:
            pred = model.module(blocks, store.read(input_nodes).float()).argmax(1)
            correct += torch.tensor([float((pred == g.ndata["label"][seeds]).sum()), len(seeds)], dtype=torch.float64)
    torch.distributed.all_reduce(correct)
    return float(correct[0] / max(correct[1], 1))


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    s, machine, role = settings(argv[0]), int(argv[1]), argv[2]
    try:
        (server_main if role == "server" else trainer_main)(s, machine)
    except Exception as exc:  # one line for the launcher, the traceback in the log above it
        import traceback

        traceback.print_exc()
        print(f"directload: error: {role} of machine {machine}: {type(exc).__name__}: {exc}", flush=True)
        sys.stderr.flush()
        os._exit(1)  # DGL's exit handlers wait for the other machines, which may never come
    return 0


if __name__ == "__main__":
    sys.exit(main())


def run(config: os.PathLike[str] | str, *, root: os.PathLike[str] | str, dataset: str, epochs: int = 1,
        fanouts: Sequence[int] = (10, 5), batch_size: int = 512, hidden: int = 64, lr: float = 3e-3, seed: int = 0,
        store: StoreSpec | None = None, verify: bool = False, fetch: str = "directload",
        timeout: float = 600.0) -> list[dict[str, Any]]:
    """Train on the partitions at ``config`` with one machine per partition on this host
    (:func:`directload.harness.dist.launch_machines`); the trainers' results, in machine order.  Every machine
    is handed the generation ``config`` names when the run starts, so none reads another.  ``store`` is the
    stack each machine reads its own rows through (a :class:`~directload.stores.StoreSpec` without a source:
    :func:`~directload.loaders.dgl.distributed.dist_features` gives it the machine's partition; None: those
    rows alone).  ``PartitionMismatchError`` before any work for a set that is not one partitioning, and the
    spec's own refusals."""
    from directload.loaders.dgl.distributed import read_partitions

    from .dist import SUBNET, MachineFailed, launch_machines, read_results, run_dir, write_ip_config

    spec = store.check().to_dict() if store is not None else None  # refused before any work; handed on as data
    meta = read_partitions(config)  # checked, before any work; its config is out's generation, resolved
    n = meta["parts"]
    where = run_dir()
    s = {"config": str(meta["config"]), "machines": n, "ip_config": str(write_ip_config(n, 30050, where)),
         "master": f"{SUBNET}.1", "gloo_port": 29500, "timeout": timeout, "seed": seed, "epochs": epochs,
         "fanouts": list(fanouts), "batch_size": batch_size, "hidden": hidden, "lr": lr, "store": spec,
         "verify": verify, "fetch": fetch, "root": str(Path(root).resolve()), "dataset": dataset, "run_dir": str(where)}
    (where / "settings.json").write_text(json.dumps(s))
    try:
        launch_machines(n, [sys.executable, "-m", "directload.harness.train_dist", str(where / "settings.json"),
                            "{machine}"], workdir=where, timeout=timeout)
    except MachineFailed as exc:  # the logs stay for the person who reads the error
        raise MachineFailed(f"{exc} (the machines' logs are in {where})") from None
    except BaseException:  # stopped (a signal) or never started: nothing to read
        shutil.rmtree(where, ignore_errors=True)
        raise
    results = read_results(where, n)
    shutil.rmtree(where, ignore_errors=True)
    return results
