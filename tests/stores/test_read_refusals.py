"""Reads that should be refused are refused before any write, by every kind of store: 0-d ids, an ``out``
that is unified, read-only, requires grad, is an inference tensor, or aliases the store's own rows; byte
budgets take only integers and size strings."""

import numpy as np
import pytest
import torch

import directload
from directload.stores import DeviceCache, DiskStore, HostCache, TensorStore, TieredStore, write_disk_store

TABLE = torch.arange(200.0).view(50, 4)


@pytest.fixture(params=["tensor", "unified", "disk", "host-cache", "device-cache", "tiered"])
def store(request, tmp_path):
    kind = request.param
    if kind == "tensor":
        s = TensorStore(TABLE.clone())
    elif kind == "unified":
        s = TensorStore(directload.to_unified(TABLE.clone(), pin="auto"))
    elif kind == "disk":
        s = DiskStore(write_disk_store(TABLE, tmp_path / "f.npy", progress=False))
    elif kind == "host-cache":
        s = HostCache(TensorStore(TABLE.clone()), 20 * 16, "lru", staging_bytes=10 * 16)
    elif kind == "device-cache":
        s = DeviceCache(TensorStore(TABLE.clone()), 20 * 16, "lru")
    else:
        s = TieredStore(write_disk_store(TABLE, tmp_path / "t.npy", progress=False), gpu_bytes=160, host_bytes=320)
    yield s
    s.close()


@pytest.mark.parametrize("ids", [np.array(3), torch.tensor(3), np.array(3, np.uint32),
                                 torch.tensor(3, dtype=torch.int32)])
def test_0_d_ids_are_refused_by_every_store(store, ids):
    with pytest.raises(ValueError, match="0-d .* pass \\[i\\]"):
        store.read(ids)
    with pytest.raises(ValueError, match="0-d"):
        store.prefetch(ids)
    with pytest.raises(TypeError, match="ids must be"):
        store.read(np.int64(3))  # a numpy scalar, like an int, is no batch of ids
    assert torch.equal(store.read([3]), TABLE[[3]])  # one row, as a batch of one


def poisoned():
    return torch.full((2, 4), -7.0)


def test_an_out_that_is_a_unified_tensor_is_refused_and_left_unwritten(store):
    for out in (directload.to_unified(poisoned(), pin="auto", read_only=True),
                directload.to_unified(poisoned(), pin="auto")):
        with pytest.raises(TypeError, match="unified tensor"):
            store.read([1, 2], out=out)
        assert torch.equal(out.host, poisoned())


def test_a_read_only_table_mapped_from_a_file_is_never_written_through_out(store, tmp_path):
    path = tmp_path / "ro.npy"
    np.save(path, poisoned().numpy())
    table = directload.from_file(path, pin="auto")  # mode "r": read-only
    with pytest.raises(TypeError, match="unified"):
        store.read([1, 2], out=table)
    assert torch.equal(torch.from_numpy(np.load(path)), poisoned())


@pytest.mark.parametrize("how", ["leaf", "non-leaf"])
def test_an_out_that_requires_grad_is_refused_and_left_unwritten(store, how):
    leaf = poisoned().requires_grad_()
    out = leaf if how == "leaf" else leaf * 1
    before = out._version
    with pytest.raises(ValueError, match="requires grad"):
        store.read([1, 2], out=out)
    assert torch.equal(out.detach(), poisoned()) and out._version == before


def test_an_inference_tensor_out_is_refused_outside_inference_mode(store):
    with torch.inference_mode():
        out = poisoned()
    with pytest.raises(ValueError, match="in place"):
        store.read([1, 2], out=out)
    assert torch.equal(out, poisoned())
    with torch.inference_mode():  # inside, torch itself writes inference tensors in place: so does a read
        assert torch.equal(store.read([1, 2], out=out), TABLE[[1, 2]])


def test_an_out_written_by_a_read_tells_autograd_it_changed(store):
    w = torch.ones(4, requires_grad=True)
    out = poisoned()
    y = (out * w).sum()  # autograd saved out's current values for w's gradient
    store.read([1, 2], out=out)
    assert torch.equal(out, TABLE[[1, 2]])
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_an_out_aliasing_the_stores_own_table_is_refused():
    table = TABLE.clone()
    for store in (TensorStore(table), HostCache(TensorStore(table), 160, "lru"),
                  TieredStore(TensorStore(table), host_bytes=160), TensorStore(directload.to_unified(table))):
        for out in (table[10:12], table.view(-1)[40:48].view(2, 4)):
            with pytest.raises(ValueError, match="shares memory"):
                store.read([1, 2], out=out)
        assert torch.equal(table, TABLE)
        store.close()


def test_an_out_aliasing_a_caches_slots_is_refused():
    cache = HostCache(TensorStore(TABLE.clone()), 20 * 16, "lru")
    slots = cache.held_memory()[0]  # the slots come first
    with pytest.raises(ValueError, match="shares memory"):
        cache.read([1, 2], out=slots[:2])


@pytest.mark.parametrize("bad", ["", " ", False, True, None, -1, 1.5, "abc", "1X", [1], "-5M"])
def test_budgets_take_integers_and_size_strings_only(tmp_path, bad):
    path = write_disk_store(TABLE, tmp_path / "f.npy", progress=False)
    for kwargs in ({"host_bytes": bad}, {"gpu_bytes": bad}, {"host_bytes": 320, "staging_bytes": bad}):
        if bad is None and "staging_bytes" in kwargs:
            continue  # None is the tiered store's default staging (a quarter of the host cache)
        with pytest.raises(ValueError, match="bytes"):
            TieredStore(path, **kwargs)
    with pytest.raises(ValueError, match="capacity_bytes"):
        HostCache(TensorStore(TABLE), bad)
    with pytest.raises(ValueError, match="staging_bytes"):
        HostCache(TensorStore(TABLE), 160, staging_bytes=bad)


def test_size_strings_are_budgets(tmp_path):
    path = write_disk_store(TABLE, tmp_path / "f.npy", progress=False)
    with TieredStore(path, host_bytes="0.5K", gpu_bytes="256", staging_bytes="0") as store:
        host = store.stats()["host"]
        assert host["capacity_rows"] == 512 // 16 and host["staging_rows"] == 0
        assert store.stats()["device"]["capacity_rows"] == 256 // 16
        assert torch.equal(store.read([7, 49]), TABLE[[7, 49]])


_NO_DATA = {"meta": lambda: torch.tensor([1, 2]).to("meta"), "sparse": lambda: torch.tensor([1, 2]).to_sparse()}


@pytest.mark.parametrize("kind", list(_NO_DATA))
def test_ids_without_readable_values_are_refused_typed_by_every_store_and_hint(store, kind):
    ids = _NO_DATA[kind]()
    error, match = (ValueError, "meta device") if kind == "meta" else (TypeError, "dense tensor")
    with pytest.raises(error, match=match):
        store.read(ids)
    with pytest.raises(error, match=match):
        store.read_async(ids)
    with pytest.raises(error, match=match):
        store.prefetch(ids)
    with pytest.raises(error, match=match):
        store.stage(ids, lambda n: np.empty(n, np.uint8))
    if "warm" in store.capabilities:
        with pytest.raises(error, match=match):
            store.warm(ids)
    assert torch.equal(store.read([1, 2]), TABLE[[1, 2]])  # nothing broke


def test_hot_ids_without_readable_values_are_refused_typed():
    from directload.stores import HotRowsStore

    with pytest.raises(ValueError, match="meta device"):
        HotRowsStore(TensorStore(TABLE.clone()), _NO_DATA["meta"](), TABLE[:2].clone())
    with pytest.raises(TypeError, match="dense tensor"):
        HotRowsStore(TensorStore(TABLE.clone()), _NO_DATA["sparse"](), TABLE[:2].clone())


def _open_fds():
    """This process's descriptors: (all, io_uring rings)."""
    import os

    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return len(links), sum("io_uring" in link for link in links)


@pytest.mark.parametrize("bad", [dict(host_room_bytes="lots"), dict(host_room_bytes=-5), dict(host_room_bytes=16),
                                 dict(policy="nope"), dict(policy=3), dict(gpu_bytes=64, device="cuda:7"),
                                 dict(staging_bytes=-1)])
def test_a_refused_tiered_store_leaves_no_disk_store_open(tmp_path, bad):
    # the refusals are kept, as a caller collecting errors would: their tracebacks must hold nothing open
    import threading

    path = write_disk_store(TABLE, tmp_path / "t.npy", progress=False)
    before, disk_threads = _open_fds(), sum(t.name.startswith("directload-disk") for t in threading.enumerate())
    kept = []
    for _ in range(20):
        with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
            TieredStore(path, host_bytes=64, **bad)
        assert "not supported between" not in str(info.value)  # a typed message of ours, not a comparison's
        kept.append(info)
    after = _open_fds()
    assert after[0] - before[0] <= 2 and after[1] <= before[1], (before, after)
    assert sum(t.name.startswith("directload-disk") for t in threading.enumerate()) <= disk_threads
