"""Drop-in check: DGL's GraphSAGE mini-batch training pattern runs with only the DataLoader import changed."""

import textwrap

import pytest
import torch

from directload.datasets import load, synthesize

# DGL's node-classification example pattern (examples/pytorch/graphsage/node_classification.py):
# NeighborSampler with prefetched features and labels, a three-layer SAGEConv model, and the
# blocks[0].srcdata / blocks[-1].dstdata training loop.  {IMPORT} is the only line that changes.
SCRIPT = textwrap.dedent('''
    import dgl.nn as dglnn
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from dgl.dataloading import NeighborSampler
    {IMPORT}

    class SAGE(nn.Module):
        def __init__(self, in_size, hid_size, out_size):
            super().__init__()
            self.layers = nn.ModuleList([dglnn.SAGEConv(in_size, hid_size, "mean"),
                                         dglnn.SAGEConv(hid_size, hid_size, "mean"),
                                         dglnn.SAGEConv(hid_size, out_size, "mean")])
            self.dropout = nn.Dropout(0.5)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    def evaluate(model, dataloader):
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for input_nodes, output_nodes, blocks in dataloader:
                y_hat = model(blocks, blocks[0].srcdata["feat"])
                correct += (y_hat.argmax(1) == blocks[-1].dstdata["label"]).sum().item()
                total += len(output_nodes)
        return correct / total

    def run(g, train_idx, val_idx, num_classes, device="cpu"):
        torch.manual_seed(0)
        sampler = NeighborSampler([10, 10, 10], prefetch_node_feats=["feat"], prefetch_labels=["label"])
        train_dataloader = DataLoader(g, train_idx, sampler, device=device, batch_size=64, shuffle=True,
                                      drop_last=False, num_workers=0, use_uva=False)
        val_dataloader = DataLoader(g, val_idx, sampler, device=device, batch_size=256, shuffle=True,
                                    drop_last=False, num_workers=0, use_uva=False)
        model = SAGE(g.ndata["feat"].shape[1], 32, num_classes).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4)
        losses = []
        for epoch in range(4):
            model.train()
            total_loss = 0
            for it, (input_nodes, output_nodes, blocks) in enumerate(train_dataloader):
                x = blocks[0].srcdata["feat"]
                y = blocks[-1].dstdata["label"]
                y_hat = model(blocks, x)
                loss = F.cross_entropy(y_hat, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total_loss += loss.item()
            losses.append(total_loss / (it + 1))
        return losses, evaluate(model, val_dataloader)
''')


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    synthesize(root, "synth-tiny", progress=False)
    return load(root, "synth-tiny")


def _run(import_line, dataset):
    namespace = {}
    exec(compile(SCRIPT.format(IMPORT=import_line), "dgl_graphsage_example", "exec"), namespace)
    g = dataset.graph
    return namespace["run"](g, dataset.split["train"], dataset.split["valid"], dataset.num_classes)


def test_dgl_example_runs_with_only_the_import_changed(dataset):
    dgl_losses, dgl_acc = _run("from dgl.dataloading import DataLoader", dataset)
    dl_losses, dl_acc = _run("from directload.loaders import DataLoader", dataset)
    print(f"DGL: loss {dgl_losses[0]:.3f}->{dgl_losses[-1]:.3f} acc {dgl_acc:.3f}; "
          f"directload: loss {dl_losses[0]:.3f}->{dl_losses[-1]:.3f} acc {dl_acc:.3f}")
    assert dl_losses[-1] < 0.8 * dl_losses[0]  # it trains
    assert dl_acc > 1 / dataset.num_classes + 0.2
    assert abs(dl_acc - dgl_acc) < 0.1
    assert isinstance(dataset.graph.ndata["feat"], torch.Tensor)  # a unified tensor in g.ndata
