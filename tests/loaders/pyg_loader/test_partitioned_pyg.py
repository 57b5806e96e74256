"""Features partitioned across ranks in the PyG lane: each rank of a real gloo job keeps half of ``x`` and reads
the rest from its peer (``PartitionedStore`` over a ``RowExchange``), behind directload's PyG ``FeatureStore``
and ``NeighborLoader`` over its split of the seeds (PyG's examples/multi_gpu idiom); every batch's ``x`` is
the full table's rows, and the batches are those one process with the whole table gets."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import HAS_PYG

# (conftest leaves this folder out where PyG does not load; named on the command line it is skipped here)
pytestmark = pytest.mark.skipif(not HAS_PYG, reason="needs torch_geometric and its sampler (the PyG lane)")

_RANK = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torch_geometric.data import Data
    from directload.loaders.pyg import NeighborLoader, stores_from
    from directload.stores import PartitionedStore, TensorStore
    from directload.stores.exchange import RowExchange
    from directload.stores.partitioned import partition_bounds

    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(3)  # the same graph and table on every rank
    n = 600
    x = torch.randn(n, 16)
    data = Data(x=x, y=torch.randint(0, 5, (n,)), edge_index=torch.randint(0, n, (2, 5000)),
                train_mask=torch.rand(n) < 0.6, num_nodes=n)
    train_idx = data.train_mask.nonzero(as_tuple=False).view(-1)
    train_idx = train_idx.split(train_idx.size(0) // world)[rank]  # as examples/multi_gpu does
    bounds = partition_bounds(n, world)
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    local = TensorStore(x[lo:hi].clone())
    exchange = RowExchange(local, bounds, timeout=30)
    fs, gs = stores_from(data)
    whole_fs, whole_gs = stores_from(data)
    fs.put_tensor(PartitionedStore(local, exchange, bounds, part=rank), group_name=None, attr_name="x", index=None)
    kw = dict(input_nodes=train_idx, num_neighbors=[5, 3], batch_size=32, shuffle=True)
    report = {"batches": [], "x_right": True, "same": True, "split": train_idx.tolist()}
    for overlap in (False, True):
        torch.manual_seed(11)
        ours = [(b.n_id, b.x, b.y, b.edge_index) for b in NeighborLoader((fs, gs), overlap=overlap, **kw)]
        torch.manual_seed(11)
        whole = [(b.n_id, b.x, b.y, b.edge_index) for b in NeighborLoader((whole_fs, whole_gs), **kw)]
        report["batches"].append(len(ours))
        report["x_right"] &= all(torch.equal(b[1], x[b[0]]) for b in ours)
        report["same"] &= len(ours) == len(whole) and all(
            all(torch.equal(p, q) for p, q in zip(a, b)) for a, b in zip(ours, whole))
    report["exchange"] = dict(exchange.stats()["exchange"])
    report["partitioned"] = dict(fs.table(None, "x").stats()["partitioned"])
    exchange.close()
    print(json.dumps(report), flush=True)
    dist.destroy_process_group()
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_rank_reads_its_split_with_partitioned_features_as_one_process_would():
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), "2", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
             for r in range(2)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    a, b = outs
    assert a["batches"] == b["batches"] and min(a["batches"]) > 1  # the ranks step together
    assert all(o["x_right"] and o["same"] for o in outs)
    assert not set(a["split"]) & set(b["split"])
    for o in outs:
        assert o["exchange"]["rounds"] == sum(o["batches"])  # one round per batch read, no more
        assert o["exchange"]["rows_received"] > 0 and o["partitioned"]["local_rows"] > 0
    assert a["exchange"]["rows_sent"] == b["exchange"]["rows_received"]
