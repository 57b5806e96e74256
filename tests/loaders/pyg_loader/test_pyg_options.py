"""Every option of PyG's NeighborLoader and LinkNeighborLoader under sampler="directload": implemented (the same
batches with it as PyG's loader code makes of them), or PyG's own sampler with a warning; a user's sampler is kept,
with a warning naming what it overrides; the sampler's device is checked before any work."""

import inspect
import warnings

import pytest
import torch
import torch_geometric.transforms as T
from pyg_compare import same_batches, without_pyg_sampler
from torch_geometric.data import Data
from torch_geometric.loader import LinkLoader, LinkNeighborLoader, NodeLoader
from torch_geometric.loader import NeighborLoader as PygNeighborLoader
from torch_geometric.sampler import NeighborSampler as PygSampler

from directload.capabilities import NoDeviceError
from directload.graph import CSCGraph
from directload.loaders.pyg import NeighborLoader, NeighborSampler
from directload.loaders.pyg.sampler import unsupported_options

#: What directload's sampler does with each option of PyG's loaders (and the loader bases they pass to).
IMPLEMENTED = {
    "replace": True, "weight_attr": "w", "is_sorted": True,  # the sampler's own; is_sorted a hint it needs not
    # PyG's loader code, around any sampler:
    "input_nodes": None, "edge_label_index": None, "edge_label": None, "neg_sampling": "binary",
    "neg_sampling_ratio": 1.0, "transform": None, "transform_sampler_output": None, "filter_per_worker": True,
    "custom_cls": None, "input_id": None, "neighbor_sampler": None,
}
FALLBACK = {"input_time": torch.zeros(3), "edge_label_time": torch.zeros(3), "subgraph_type": "induced",
            "disjoint": True, "temporal_strategy": "last", "time_attr": "t", "directed": False}


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(4)
    n = 300
    edge_index = torch.randint(0, n, (2, 2000), generator=g)
    return Data(x=torch.randn(n, 9, generator=g), y=torch.randint(0, 3, (n,), generator=g), edge_index=edge_index,
                w=(torch.rand(2000, generator=g) < 0.5).float(), t=torch.arange(n), num_nodes=n)


def _run(cls, data, **kw):
    torch.manual_seed(11)
    try:
        return list(cls(data, **kw))
    except Exception as exc:  # noqa: BLE001 - compared with PyG's own failure
        return exc


@pytest.mark.parametrize("loader", [PygNeighborLoader, LinkNeighborLoader, NodeLoader, LinkLoader])
def test_every_option_of_pygs_loaders_is_implemented_or_falls_back(loader):
    # A new option in a PyG release fails here until it is sorted into one of the two.
    options = set(inspect.signature(loader.__init__).parameters) - {"self", "data", "num_neighbors", "kwargs",
                                                                    "node_sampler", "link_sampler"}
    assert options <= set(IMPLEMENTED) | set(FALLBACK), options - set(IMPLEMENTED) - set(FALLBACK)
    for name in options & set(FALLBACK):
        assert unsupported_options(**{name: FALLBACK[name]}) == [name]
    assert unsupported_options(**{name: IMPLEMENTED[name] for name in options & set(IMPLEMENTED)}) == []


@pytest.mark.parametrize("option,names", [
    (dict(subgraph_type="induced"), "subgraph_type"),
    (dict(subgraph_type="bidirectional"), "subgraph_type"),
    (dict(directed=False), "directed"),
    (dict(disjoint=True), "disjoint"),
    (dict(time_attr="t"), "time_attr"),
    (dict(time_attr="t", input_time=torch.full((300,), 10**6)), "time_attr, input_time"),
    (dict(time_attr="t", temporal_strategy="last"), "temporal_strategy, time_attr"),
], ids=lambda v: ",".join(v) if isinstance(v, dict) else "")
@pytest.mark.filterwarnings("ignore:The usage of the 'directed' argument:UserWarning")  # PyG's own deprecation
def test_an_option_it_lacks_gives_pygs_batches_or_pygs_error_with_a_warning(data, option, names):
    kw = dict(num_neighbors=[3, 2], batch_size=50, shuffle=True, **option)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyG's own, about pyg-lib
        want = _run(PygNeighborLoader, data, **kw)
    with pytest.warns(UserWarning, match=f"^directload's sampler does not implement {names}: PyG's own sampler "
                                         "runs instead$"):
        got = _run(NeighborLoader, data, sampler="directload", **kw)
    if isinstance(want, Exception):  # PyG's sampler cannot either (pyg-lib only): PyG's own error
        assert type(got) is type(want) and str(got) == str(want)
    else:
        same_batches(want, got)


def _epoch(data, **kw):
    torch.manual_seed(3)
    loader = NeighborLoader(data, [4, 3], batch_size=60, shuffle=True, sampler="directload", **kw)
    assert loader.sampling == "directload"
    return list(loader)


@pytest.mark.parametrize("transform", [T.AddSelfLoops(), T.Compose([T.ToUndirected(), T.NormalizeFeatures()])])
def test_transform_is_applied_to_directloads_batches(data, transform):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # implemented: no fallback, nothing to say
        got = _epoch(data, transform=transform)
    plain = _epoch(data)
    same_batches([transform(b) for b in plain], got)


def test_transform_sampler_output_sees_every_sampler_output(data):
    seen = []

    def count(out):
        seen.append(out.node.numel())
        return out

    batches = _epoch(data, transform_sampler_output=count)
    assert seen == [b.num_nodes for b in batches]


@pytest.mark.parametrize("kw", [dict(filter_per_worker=True), dict(filter_per_worker=False), dict(is_sorted=True)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_options_that_need_nothing_leave_the_batches_as_they_are(data, kw):
    order = data.edge_index[1].argsort(stable=True)
    data = Data(x=data.x, y=data.y, edge_index=data.edge_index[:, order], num_nodes=data.num_nodes)  # is_sorted
    same_batches(_epoch(data), _epoch(data, **kw))


def test_weight_attr_and_replace_reach_directloads_sampler(data):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = _epoch(data, weight_attr="w", replace=True)
    picked = torch.cat([b.e_id for b in batches])
    assert bool((data.w[picked] > 0).all())  # an edge of weight 0 is never picked
    with_replace = NeighborLoader(data, [2], sampler="directload", replace=True, weight_attr="w")
    assert with_replace.node_sampler.sampler.replace and with_replace.node_sampler.sampler.weighted


def _mine(data, fanouts):
    """A user's subclass of PyG's sampler whose ``sample_from_nodes`` counts its calls and asks directload's."""
    calls = []
    inner = NeighborSampler(data, fanouts)

    class Mine(PygSampler):
        def sample_from_nodes(self, inputs):
            calls.append(inputs.node.numel())
            return inner.sample_from_nodes(inputs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyG's own, about pyg-lib
        return Mine(data, fanouts), calls


@pytest.mark.parametrize("default", [False, True], ids=["sampler=directload", "default-without-pyg-sampler"])
def test_a_users_sampler_subclass_is_kept_with_a_warning_naming_the_override(data, default, monkeypatch):
    mine, calls = _mine(data, [3, 2])
    if default:
        without_pyg_sampler(monkeypatch)
    with pytest.warns(UserWarning, match=r"^neighbor_sampler=Mine \(overrides sample_from_nodes\) runs instead of "
                                         "directload's sampler$"):
        loader = NeighborLoader(data, [3, 2], batch_size=100, neighbor_sampler=mine,
                                **({} if default else {"sampler": "directload"}))
    assert loader.sampling == "user" and loader.node_sampler is mine
    batches = list(loader)
    assert calls == [100, 100, 100] and [b.batch_size for b in batches] == [100, 100, 100]


def test_a_users_sampler_with_pygs_sampler_asked_for_is_kept_silently(data):
    mine, calls = _mine(data, [3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = NeighborLoader(data, [3], batch_size=150, neighbor_sampler=mine)
    assert loader.sampling == "user" and len(list(loader)) == 2 and calls == [150, 150]


def test_pygs_own_sampler_passed_in_is_named_as_pygs(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = PygSampler(data, [3])
    with pytest.warns(UserWarning, match=r"^neighbor_sampler=NeighborSampler \(PyG's\) runs instead"):
        loader = NeighborLoader(data, [3], batch_size=150, neighbor_sampler=theirs, sampler="directload")
    assert loader.sampling == "pyg"


@pytest.mark.parametrize("device,error,match", [
    ("bogus", ValueError, r"^device='bogus' is not a device"),
    (1.5, TypeError, "^device must be a str or torch.device, got float"),
    ("mps", ValueError, r"^device='mps': a sampler runs on 'cpu' or 'cuda', not mps"),
    ("cuda", NoDeviceError, "no usable CUDA device"),
])
def test_the_samplers_device_is_checked_before_the_graph_is_built(data, device, error, match, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def built(*args, **kwargs):
        raise AssertionError("the graph was built before the device was checked")

    monkeypatch.setattr(CSCGraph, "from_edge_index", built)
    with pytest.raises(error, match=match):
        NeighborSampler(data, [2], device=device)


def test_time_given_to_directloads_sampler_in_pygs_loaders_is_a_clear_refusal(data):
    # Through PyG's own loaders, which do not ask what a sampler implements: a ValueError naming the option,
    # where a temporal link batch met PyG's bare assertion inside edge_sample.
    sampler = NeighborSampler(data, [2])
    nodes = PygNeighborLoader(data, [2], batch_size=50, time_attr="t", input_time=torch.zeros(300, dtype=torch.long),
                              neighbor_sampler=sampler)
    with pytest.raises(ValueError, match="does not sample in time; use PyG's sampler for input_time"):
        next(iter(nodes))
    links = LinkNeighborLoader(data, [2], batch_size=50, time_attr="t", neighbor_sampler=sampler,
                               edge_label_time=torch.zeros(data.edge_index.shape[1], dtype=torch.long))
    with pytest.raises(ValueError, match="does not sample in time; use PyG's sampler for edge_label_time"):
        next(iter(links))
