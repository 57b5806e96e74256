"""End-to-end GraphSAGE / GAT mini-batch training with DGL's loader or directload's, timed stage by stage."""

import os
import time
import warnings
from dataclasses import asdict, dataclass, field

os.environ.setdefault("DGLBACKEND", "pytorch")

import dgl  # noqa: E402
import dgl.nn as dglnn  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from tqdm import tqdm  # noqa: E402

__all__ = ["TrainConfig", "EpochStats", "RunResult", "SAGE", "GAT", "build_model", "train", "TimedTable",
           "resolve_depth", "DEFAULT_FANOUTS"]

#: Neighbours sampled per layer, outermost first (DGL's ogbn-products examples).
DEFAULT_FANOUTS = (15, 10, 5)


def resolve_depth(layers=None, fanouts=None):
    """``(layers, fanouts)`` from what was given: one fanout per layer.  Pure.

    With neither, DGL's 3 layers of 15/10/5; with one, the other follows (extra
    layers repeat the last default fanout); with both, they must agree, since a
    model deeper than its blocks silently drops layers.

    Examples
    --------
    >>> resolve_depth(), resolve_depth(2), resolve_depth(fanouts=[10, 10]), resolve_depth(4)
    ((3, (15, 10, 5)), (2, (15, 10)), (2, (10, 10)), (4, (15, 10, 5, 5)))
    """
    if fanouts is not None:
        fanouts = tuple(int(f) for f in fanouts)
        if not fanouts:
            raise ValueError("fanouts needs one entry per layer, got none")
        if any(f < 1 and f != -1 for f in fanouts):
            raise ValueError(f"each fanout must be >= 1 (or -1 for all neighbours), got {list(fanouts)}")
        if layers is not None and layers != len(fanouts):
            raise ValueError(f"{layers} layers but {len(fanouts)} fanouts ({' '.join(map(str, fanouts))}): "
                             "give one fanout per layer")
        return len(fanouts), fanouts
    if layers is None:
        return len(DEFAULT_FANOUTS), DEFAULT_FANOUTS
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    return layers, (DEFAULT_FANOUTS + (DEFAULT_FANOUTS[-1],) * layers)[:layers]


@dataclass
class TrainConfig:
    """One training run.

    The defaults follow DGL's ogbn-products examples (the paper's models):
    GraphSAGE with mean aggregation, 3 layers, fanouts 15/10/5; GAT with 4
    heads.  Hidden sizes are smaller than DGL's so CPU runs stay short.
    """

    model: str = "sage"
    loader: str = "directload"
    hidden: int = 128
    layers: int = 3
    fanouts: tuple = (15, 10, 5)
    heads: int = 4
    dropout: float = 0.5
    lr: float = 3e-3
    batch_size: int = 1024
    eval_batch_size: int = 4096
    epochs: int = 2
    seed: int = 0
    device: str = "cpu"
    num_workers: int = 0
    lookahead: int = 4

    def __post_init__(self):
        if self.model not in ("sage", "gat"):
            raise ValueError(f"model must be 'sage' or 'gat', got {self.model!r}")
        if self.loader not in ("dgl", "directload"):
            raise ValueError(f"loader must be 'dgl' or 'directload', got {self.loader!r}")
        self.layers, self.fanouts = resolve_depth(self.layers, self.fanouts)
        for name in ("hidden", "heads", "batch_size", "eval_batch_size", "epochs", "lookahead"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.model == "gat" and self.hidden < self.heads:
            raise ValueError(f"GAT splits hidden={self.hidden} over {self.heads} heads: hidden must be >= heads")


@dataclass
class EpochStats:
    """Seconds spent in one epoch.

    ``sample_s`` and ``gather_s`` are measured where the work runs: on the
    training thread for DGL's loader, in directload's pipeline for its own
    (overlapping ``train_s`` only where that runs on background threads).  ``wait_s`` is the time the training
    loop waited for a batch; ``epoch_s = wait_s + train_s`` up to loop overhead.
    """

    epoch: int
    epoch_s: float
    sample_s: float
    gather_s: float
    train_s: float
    wait_s: float
    batches: int
    loss: float
    valid_acc: float = float("nan")


@dataclass
class RunResult:
    config: dict
    epochs: list = field(default_factory=list)
    test_acc: float = float("nan")
    valid_acc: float = float("nan")


class SAGE(nn.Module):
    """GraphSAGE (mean aggregator) over DGL blocks."""

    def __init__(self, in_feats, hidden, n_classes, layers, dropout):
        super().__init__()
        dims = [in_feats] + [hidden] * (layers - 1) + [n_classes]
        self.layers = nn.ModuleList(dglnn.SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


class GAT(nn.Module):
    """GAT over DGL blocks: multi-head hidden layers (concatenated), one head averaged at the output."""

    def __init__(self, in_feats, hidden, n_classes, layers, heads, dropout):
        super().__init__()
        self.layers = nn.ModuleList()
        dim = in_feats
        for _ in range(layers - 1):
            self.layers.append(dglnn.GATConv(dim, hidden, heads, feat_drop=dropout, allow_zero_in_degree=True))
            dim = hidden * heads
        self.layers.append(dglnn.GATConv(dim, n_classes, 1, allow_zero_in_degree=True))

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            h = h.flatten(1) if i != len(self.layers) - 1 else h.mean(1)
            if i != len(self.layers) - 1:
                h = F.elu(h)
        return h


def build_model(cfg, in_feats, n_classes):
    if cfg.model == "sage":
        return SAGE(in_feats, cfg.hidden, n_classes, cfg.layers, cfg.dropout)
    if cfg.model == "gat":
        return GAT(in_feats, cfg.hidden // cfg.heads, n_classes, cfg.layers, cfg.heads, cfg.dropout)
    raise ValueError(f"model must be 'sage' or 'gat', got {cfg.model!r}")


class TimedTable(torch.Tensor):
    """A plain feature table that times the row gathers DGL's loader makes on it.

    DGL's prefetcher slices ``g.ndata[name]`` with ``index_select``; wrapping the
    table measures that feature-gather time exactly, inside DGL's own loader.
    """

    seconds = 0.0
    _TIMED = {torch.Tensor.index_select, torch.index_select, torch.Tensor.__getitem__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func in cls._TIMED:
            TimedTable.seconds += time.perf_counter() - t0
        return out


def _epoch(loader):
    """``iter(loader)``, without DGL's advice to enable CPU affinity, which its loader repeats every
    epoch of a CPU run: the comparison runs both loaders without it, on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")
        return iter(loader)


def _seed(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    dgl.seed(seed)


def _loader(cfg, graph, ids, fanouts, batch_size, shuffle, feat):
    sampler = dgl.dataloading.NeighborSampler(list(fanouts), prefetch_node_feats=["feat"], prefetch_labels=["label"])
    kw = dict(device=cfg.device, batch_size=batch_size, shuffle=shuffle, drop_last=False, num_workers=cfg.num_workers)
    if cfg.loader == "dgl":
        plain = feat.host if getattr(feat, "is_unified", False) else feat
        graph.ndata["feat"] = plain.as_subclass(TimedTable)
        return dgl.dataloading.DataLoader(graph, ids, sampler, **kw)
    from directload.loaders import DataLoader

    graph.ndata["feat"] = feat
    return DataLoader(graph, ids, sampler, lookahead=cfg.lookahead, **kw)


@torch.no_grad()
def evaluate(model, cfg, graph, ids, feat):
    """Accuracy on ``ids`` with the run's loader and fanouts."""
    model.eval()
    correct = total = 0
    for _, output_nodes, blocks in _epoch(_loader(cfg, graph, ids, cfg.fanouts, cfg.eval_batch_size, False, feat)):
        pred = model(blocks, blocks[0].srcdata["feat"].float()).argmax(1)
        correct += (pred == blocks[-1].dstdata["label"]).sum().item()
        total += len(output_nodes)
    model.train()
    return correct / max(total, 1)


def train(dataset, cfg, *, progress=True, evaluate_each_epoch=False):
    """Train ``cfg.model`` on ``dataset`` with ``cfg.loader``; returns a :class:`RunResult`.

    The graph's ``ndata["feat"]`` is set to the table the chosen loader reads
    (a plain host tensor for DGL's, the unified tensor for directload's).
    """
    _seed(cfg.seed)
    device = torch.device(cfg.device)
    graph, feat = dataset.graph, dataset.feat
    model = build_model(cfg, feat.shape[1], dataset.num_classes).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    result = RunResult(config=asdict(cfg))
    train_ids = dataset.split["train"]
    for epoch in range(cfg.epochs):
        loader = _loader(cfg, graph, train_ids, cfg.fanouts, cfg.batch_size, True, feat)
        TimedTable.seconds = 0.0
        train_s = wait_s = 0.0
        losses = []
        t_epoch = time.perf_counter()
        it = _epoch(loader)
        bar = tqdm(total=len(loader), desc=f"{cfg.model}/{cfg.loader} epoch {epoch}", unit="batch",
                   disable=not progress, leave=False)
        while True:
            t0 = time.perf_counter()
            try:
                _, _, blocks = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            x = blocks[0].srcdata["feat"].float()
            y = blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            t2 = time.perf_counter()
            wait_s += t1 - t0
            train_s += t2 - t1
            bar.update()
        bar.close()
        epoch_s = time.perf_counter() - t_epoch
        if cfg.loader == "dgl":
            gather_s = TimedTable.seconds
            sample_s = wait_s - gather_s  # the rest of next() is sampling (and batch assembly)
        else:
            gather_s, sample_s = it.stats["gather_s"], it.stats["sample_s"]
        stats = EpochStats(epoch, epoch_s, sample_s, gather_s, train_s, wait_s, len(losses), float(np.mean(losses)))
        if evaluate_each_epoch:
            stats.valid_acc = evaluate(model, cfg, graph, dataset.split["valid"], feat)
        result.epochs.append(stats)
    result.valid_acc = evaluate(model, cfg, graph, dataset.split["valid"], feat)
    result.test_acc = evaluate(model, cfg, graph, dataset.split["test"], feat)
    return result
