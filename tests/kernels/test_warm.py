"""``python -m directload.kernels.warm`` compiles the CPU kernels into Numba's on-disk cache, so a later process
samples as training does (DGL's int64 graphs, PyG's int32 ones) without compiling anything: no first epoch pays
for a compile."""

import json
import subprocess
import sys

import pytest

from directload.kernels.warm import compile_cpu_kernels

# A fresh process: directload's sampler on a graph as each framework's loader builds it, then every Numba
# dispatcher of directload's kernels that ran, with how many of its signatures came from the cache and how
# many were compiled.
_LATER_PROCESS = """
import json, sys
import torch
from numba.core.registry import CPUDispatcher
from directload.graph import CSCGraph
from directload.sampler import NeighborSampler

edges = torch.randint(0, 50, (2, 400), generator=torch.Generator().manual_seed(0))
pyg = CSCGraph.from_edge_index(edges, 50)  # PyG's loader: int32 where the counts fit
dgl = CSCGraph(pyg.indptr.long(), pyg.indices.long(), eids=pyg.eids.long())  # DGL's adj_tensors: int64
for graph, layout in ((pyg, "pyg"), (dgl, "dgl")):
    for replace in (False, True):
        NeighborSampler(graph, [5, -1], layout=layout, replace=replace).sample(torch.arange(10))
ran = {}
for name, module in list(sys.modules.items()):
    if name.startswith("directload.kernels"):
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and value.signatures:
                ran[f"{name}.{attr}"] = [sum(value.stats.cache_hits.values()), sum(value.stats.cache_misses.values())]
print(json.dumps(ran))
"""


def test_an_unknown_part_is_refused_before_anything_compiles():
    with pytest.raises(ValueError,
                       match=r"unknown kernel parts \['sampler2'\]: choose from \['sampler', 'gathers', 'decodes'\]"):
        compile_cpu_kernels(["sampler", "sampler2"])


def test_a_later_process_samples_as_training_does_without_compiling():
    took = compile_cpu_kernels(["sampler"])  # from the cache where dev.sh's setup compiled it; else compiled now
    assert list(took) == ["sampler"] and took["sampler"] >= 0
    proc = subprocess.run([sys.executable, "-c", _LATER_PROCESS], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = json.loads(proc.stdout.splitlines()[-1])
    assert {"relabel", "place_seeds", "check_csc"} <= {name.rsplit(".", 1)[1] for name in ran}, ran  # it sampled
    compiled = {name: counts for name, counts in ran.items() if counts[1]}
    assert compiled == {}, f"compiled in a later process, not loaded from the cache: {compiled}"
    assert all(hits >= 1 for hits, _ in ran.values())
