"""DDP in the DGL lane: with ``use_ddp=True`` each rank of a real gloo job gets DGL's own split of the seeds
and the very batches DGL's loader gives that rank (each epoch reshuffled), its features read from one table shared
by the node."""

import json
import os
import subprocess
import sys
import textwrap

_RANK = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import dgl, numpy as np, torch, torch.distributed as dist
    from dgl.utils import set_num_threads
    from directload import shared_table
    from directload.loaders.dgl import DataLoader

    rank, world, init, shm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    set_num_threads(1)  # DGL's draws repeat only with one sampling thread
    torch.manual_seed(1); dgl.seed(1); np.random.seed(1)
    g = dgl.rand_graph(400, 3000)
    feat = torch.arange(400 * 4, dtype=torch.float32).view(400, 4)
    g.ndata["feat"] = feat
    shared = shared_table("ddp-feat", lambda: feat, ranks=world, directory=shm)  # one copy for the node
    seeds = torch.arange(0, 250)
    got = {}
    for name in ("dgl", "directload"):
        torch.manual_seed(7); dgl.seed(7); np.random.seed(7)
        sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
        kwargs = dict(batch_size=16, shuffle=True, use_ddp=True, ddp_seed=3)
        loader = (dgl.dataloading.DataLoader(g, seeds, sampler, **kwargs) if name == "dgl" else
                  DataLoader(g, seeds, sampler, features={"feat": shared}, **kwargs))
        epochs = []
        for epoch in range(2):
            epochs.append([[inp.tolist(), out.tolist(), [b.edges()[0].tolist() for b in blocks],
                            blocks[0].srcdata["feat"].tolist()] for inp, out, blocks in loader])
        got[name] = epochs
    mine = sorted(s for batch in got["directload"][0] for s in batch[1])
    feats_right = all(torch.equal(torch.tensor(b[3]), feat[torch.tensor(b[0])]) for e in got["directload"] for b in e)
    print(json.dumps({"same": got["dgl"] == got["directload"], "seeds": mine, "feats": feats_right,
                      "epochs_differ": got["directload"][0] != got["directload"][1]}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_each_rank_gets_dgls_split_and_dgls_batches(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    init = f"file://{tmp_path / 'rendezvous'}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), "2", init, str(shm)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["same"] and o["feats"] and o["epochs_differ"] for o in outs)
    a, b = outs[0]["seeds"], outs[1]["seeds"]
    assert len(a) == len(b) == 125 and not set(a) & set(b) and set(a) | set(b) == set(range(250))
    assert os.listdir(shm) == []  # both ranks mapped the one table: its name is gone
