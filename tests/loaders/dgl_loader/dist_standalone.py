"""DGL's own partitions read through directload, for tests/loaders/dgl_loader/test_dist_features.py.

``python dist_standalone.py WORKDIR``: partitions a graph with ``dgl.distributed.partition_graph`` alone (no
directload record), opens it as DGL's distributed examples do in standalone mode (one partition, no
servers: ``initialize``, ``DistGraph``), builds :func:`dist_features` over it and prints one JSON line: for each
kind of ids, whether ``x[ids]`` equals ``g.ndata["feat"][ids]`` (DGL's ``DistTensor``) and the original rows,
what ``shape``, ``dtype`` and ``len`` say beside DistTensor's, and the error each bad kind of ids raises.
"""

import contextlib
import io
import json
import os
import sys

import dgl
import numpy as np
import torch

from directload.loaders.dgl.distributed import DistFeatures, dist_features

GOOD = {"tensor int64": torch.tensor([5, 0, 299, 5]), "tensor int32": torch.tensor([7, 1], dtype=torch.int32),
        "list": [3, 2, 1], "tuple": (9, 8), "range": range(4, 10, 2), "numpy int64": np.array([11, 0]),
        "numpy int32": np.array([12, 13], dtype=np.int32), "slice": slice(290, 300), "int": 42, "empty": []}
BAD = {"floats": torch.tensor([1.5]), "booleans": torch.tensor([True, False]),
       "2-D": torch.zeros(2, 2, dtype=torch.int64), "a string": "12", "past the end": torch.tensor([300]),
       "negative": [-1]}


def main(work):
    g = dgl.rand_graph(300, 1500)
    g.ndata["feat"] = torch.arange(300 * 4, dtype=torch.float32).view(300, 4)
    with contextlib.redirect_stdout(io.StringIO()):
        orig, _ = dgl.distributed.partition_graph(g, "plain", 1, work, part_method="random", return_mapping=True)
    with open(os.path.join(work, "ip_config.txt"), "w") as f:
        f.write("127.0.0.1 30000\n")
    dgl.distributed.initialize(os.path.join(work, "ip_config.txt"))  # standalone: DGL_DIST_MODE unset
    dg = dgl.distributed.DistGraph("plain", part_config=os.path.join(work, "plain.json"))
    x = dist_features(dg, os.path.join(work, "plain.json"))
    theirs = dg.ndata["feat"]
    report = {"type": type(x).__name__, "is_dist_features": isinstance(x, DistFeatures),
              "shape": [list(x.shape), list(theirs.shape)], "dtype": [str(x.dtype), str(theirs.dtype)],
              "len": [len(x), len(theirs)], "good": {}, "bad": {}}
    for name, ids in GOOD.items():
        got = x[ids]
        want = theirs[ids]
        rows = g.ndata["feat"][orig[dgl.distributed.utils.totensor(ids).long()]]  # by original id
        report["good"][name] = bool(torch.equal(got, want) and torch.equal(got, rows))
    for name, ids in BAD.items():
        try:
            x[ids]
            report["bad"][name] = "no error"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            report["bad"][name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
