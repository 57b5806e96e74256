"""DDP in the PyG lane, in the idiom of PyG's examples/multi_gpu (distributed_sampling.py): each rank of a real
gloo job splits the training nodes with ``train_idx.split(len // world_size)[rank]`` and builds its
NeighborLoader over them; ours gives that rank PyG's very batches, its features read from one table shared by
the node."""

import json
import os
import subprocess
import sys
import textwrap

_RANK = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader as PygNeighborLoader
    from directload import shared_table
    from directload.loaders.pyg import NeighborLoader

    rank, world, init, shm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.manual_seed(3)
    n = 600
    x = torch.randn(n, 16)
    data = Data(x=x, y=torch.randint(0, 5, (n,)), edge_index=torch.randint(0, n, (2, 5000)),
                train_mask=torch.rand(n) < 0.6, num_nodes=n)
    train_idx = data.train_mask.nonzero(as_tuple=False).view(-1)
    train_idx = train_idx.split(train_idx.size(0) // world)[rank]  # as examples/multi_gpu does
    ours = data.clone()
    ours.x = shared_table("pyg-ddp-x", lambda: x, ranks=world, directory=shm)  # one copy for the node
    kw = dict(input_nodes=train_idx, num_neighbors=[5, 3], batch_size=32, shuffle=True, drop_last=True)
    got = {}
    for name, loader in (("pyg", PygNeighborLoader(data, **kw)), ("directload", NeighborLoader(ours, **kw))):
        torch.manual_seed(11)
        got[name] = [[b.n_id.tolist(), b.edge_index.tolist(), b.x.tolist(), b.y.tolist(), b.batch_size]
                     for b in loader]
    seeds = sorted(s for b in got["directload"] for s in b[0][:b[4]])
    print(json.dumps({"same": got["pyg"] == got["directload"], "seeds": seeds, "n": len(got["directload"]),
                      "split": train_idx.tolist()}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_each_rank_trains_on_its_split_with_pygs_batches(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), "2", init, str(shm)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["same"] and o["n"] > 1 for o in outs)
    a, b = outs[0], outs[1]
    assert not set(a["split"]) & set(b["split"])  # disjoint halves of the training nodes
    assert set(a["seeds"]) <= set(a["split"]) and set(b["seeds"]) <= set(b["split"])
    assert os.listdir(shm) == []
