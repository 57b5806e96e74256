"""The GPU gather's tuner on the CPU: a fake GPU whose timer advances a fake clock by each candidate's time."""

import dataclasses
import json
import os
import threading
import time

import pytest
import torch

from directload.kernels import tune_keys, tuner
from directload.kernels.tune_keys import TuneKey, id_bucket, key_for, sources_hash, table_bucket
from directload.kernels.tune_store import ChoiceFile, TunerCacheWarning, TuneRecord
from directload.kernels.tuner import Tuner, time_candidates, tuning_enabled
from directload.kernels.variants import Variant, candidates, default_variant

ENV = ("NVIDIA H100 PCIe", "550.54.15", "2.11.0+cu128", "12.8", "0123456789abcdef")
KEY = TuneKey.of(ENV, row_bytes=400, elem_bytes=4, n_ids=4096, n_rows=1 << 20, align=16)
CANDIDATES = candidates(400, 0x1000, 0x2000)


class FakeGPU:
    """``run(variant)`` "launches" a variant; ``timer(fn)`` calls ``fn`` and advances :meth:`clock` by the
    variant's milliseconds (a number, or a list taken one per call); a variant in ``fail`` raises."""

    def __init__(self, ms, fail=(), default_ms=1.0):
        self.ms, self.fail, self.default_ms = dict(ms), set(fail), default_ms
        self.now_ms, self.runs, self._current = 0.0, [], None  # whole milliseconds add up exactly
        self._lock = threading.Lock()

    def clock(self):
        return self.now_ms / 1e3

    def run(self, variant):
        with self._lock:
            self.runs.append(variant.name)
        if variant.name in self.fail:
            raise RuntimeError(f"{variant.name}: too many resources requested for launch")
        self._current = variant.name

    def timer(self, fn):
        self._current = None
        fn()
        value = self.ms.get(self._current, self.default_ms)
        ms = value.pop(0) if isinstance(value, list) else value
        self.now_ms += ms
        return ms

    def tuner(self, **kw):
        return Tuner(**{"timer": self.timer, "clock": self.clock, "store": None, "enabled": True, **kw})


def _ms(**times):
    """Times by variant name; ``_sort`` in a keyword stands for ``+sort``."""
    return {name.replace("_sort", "+sort"): ms for name, ms in times.items()}


# -- selection -------------------------------------------------------------------------------------------------

def test_the_fastest_candidate_is_chosen_and_remembered():
    gpu = FakeGPU(_ms(index_select=0.50, rowvec16x16=0.30, rowvec16x16_sort=0.20, naive=0.90), default_ms=0.6)
    t = gpu.tuner()
    assert t.lookup(KEY) is None
    assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("rowvec", 16, 16, True)
    record = t.record(KEY)
    assert record.chosen == "rowvec16x16+sort" and record.complete and not record.failed and not record.note
    assert dict(record.times_ms)["index_select"] == 0.5 and record.speedup == pytest.approx(2.5)
    assert {name for name, _ in record.times_ms} == {v.name for v in CANDIDATES}
    runs = len(gpu.runs)
    assert t.lookup(KEY) == Variant("rowvec", 16, 16, True)
    assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("rowvec", 16, 16, True) and len(gpu.runs) == runs


def test_index_select_wins_ties_and_is_timed_first_even_when_listed_last_or_missing():
    gpu = FakeGPU({}, default_ms=0.4)  # every candidate as fast as torch's path: torch's path stays
    rec = time_candidates(KEY, list(reversed(CANDIDATES)), gpu.run, timer=gpu.timer, clock=gpu.clock)
    assert rec.chosen == "index_select" and rec.times_ms[0][0] == "index_select" and gpu.runs[0] == "index_select"
    gpu = FakeGPU({"naive": 0.1})
    rec = time_candidates(KEY, [Variant("naive")], gpu.run, timer=gpu.timer, clock=gpu.clock)
    assert [name for name, _ in rec.times_ms] == ["index_select", "naive"] and rec.chosen == "naive"


def test_each_candidate_is_warmed_once_then_timed_and_its_median_kept():
    gpu = FakeGPU({"index_select": [100.0, 5.0, 1.0, 9.0, 2.0, 3.0]})  # the warm-up's 100 ms is not counted
    rec = time_candidates(KEY, [Variant("index_select")], gpu.run, timer=gpu.timer, clock=gpu.clock, budget_s=10.0,
                          repeats=5)
    assert rec.times_ms == (("index_select", 3.0),) and gpu.runs == ["index_select"] * 6


def test_the_budget_bounds_the_timing_and_index_select_is_always_timed():
    gpu = FakeGPU({}, default_ms=10.0)  # every call 10 ms; 100 ms of budget
    rec = time_candidates(KEY, CANDIDATES, gpu.run, timer=gpu.timer, clock=gpu.clock, budget_s=0.1, repeats=5)
    # index_select: warm-up and 5 timed calls (60 ms); the next: warm-up and 3 (to 100 ms); then no more
    assert [name for name, _ in rec.times_ms] == ["index_select", CANDIDATES[1].name]
    assert gpu.clock() == pytest.approx(0.1) and gpu.runs.count(CANDIDATES[1].name) == 4
    assert list(rec.untimed) == [v.name for v in CANDIDATES[2:]] and not rec.complete
    assert rec.budget_ms == pytest.approx(100.0)
    gpu = FakeGPU({}, default_ms=500.0)  # one call over the whole budget: index_select alone, once timed
    rec = time_candidates(KEY, CANDIDATES, gpu.run, timer=gpu.timer, clock=gpu.clock, budget_s=0.3)
    assert rec.times_ms == (("index_select", 500.0),) and rec.chosen == "index_select"
    assert gpu.clock() <= 0.3 + 2 * 0.5  # overrun by at most two calls of the slowest candidate
    rec = time_candidates(KEY, CANDIDATES, gpu.run, timer=gpu.timer, clock=gpu.clock, budget_s=0.0)
    assert [name for name, _ in rec.times_ms] == ["index_select"]


def test_a_budget_cut_choice_is_kept_in_memory_only(tmp_path):
    gpu = FakeGPU({}, default_ms=200.0)
    store = ChoiceFile(tmp_path / "choices.json")
    t = gpu.tuner(store=store)
    assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("index_select") and not t.record(KEY).complete
    assert t.lookup(KEY) == Variant("index_select") and not store.path.exists()


def test_no_candidates_is_an_error():
    with pytest.raises(ValueError, match="at least one candidate"):
        time_candidates(KEY, [], FakeGPU({}).run, timer=FakeGPU({}).timer)


# -- failures --------------------------------------------------------------------------------------------------

def test_a_failing_candidate_is_skipped_remembered_and_never_retried(tmp_path):
    gpu = FakeGPU(_ms(index_select=0.5, rowvec16x16=0.1, naive=0.3), fail={"rowvec16x16"})
    t = gpu.tuner(store=ChoiceFile(tmp_path / "choices.json"))
    assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("naive")
    failed = dict(t.record(KEY).failed)
    assert list(failed) == ["rowvec16x16"] and failed["rowvec16x16"].startswith("RuntimeError: rowvec16x16: too many")
    assert gpu.runs.count("rowvec16x16") == 1
    again = FakeGPU({}).tuner(store=ChoiceFile(tmp_path / "choices.json"))  # another process, the same file
    assert again.choose(KEY, CANDIDATES, again.timer) == Variant("naive")
    assert dict(again.record(KEY).failed) == failed


def test_a_timer_that_measures_nonsense_fails_the_candidate():
    gpu = FakeGPU({"index_select": 0.5, "naive": float("nan")})
    rec = time_candidates(KEY, [Variant("index_select"), Variant("naive")], gpu.run, timer=gpu.timer, clock=gpu.clock)
    assert rec.chosen == "index_select" and dict(rec.failed)["naive"].startswith("ValueError: the timer measured nan")


def test_every_candidate_failing_falls_back_to_index_select_and_says_so(tmp_path):
    gpu = FakeGPU({}, fail={v.name for v in CANDIDATES})
    store = ChoiceFile(tmp_path / "choices.json")
    t = gpu.tuner(store=store)
    assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("index_select")
    record = t.record(KEY)
    assert record.times_ms == () and len(record.failed) == len(CANDIDATES) and "every candidate failed" in record.note
    assert not store.path.exists()  # perhaps a passing condition: the next process times again
    assert t.lookup(KEY) == Variant("index_select") and len(gpu.runs) == len(CANDIDATES)


def test_a_choice_that_fails_later_gives_way_to_the_next_fastest(tmp_path):
    gpu = FakeGPU(_ms(index_select=0.5, rowvec16x16=0.1, naive=0.3), default_ms=0.7)
    t = gpu.tuner(store=ChoiceFile(tmp_path / "choices.json"))
    assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("rowvec", 16, 16)
    assert t.report_failure(KEY, Variant("rowvec", 16, 16), RuntimeError("illegal\naddress")) == Variant("naive")
    assert dict(t.record(KEY).failed) == {"rowvec16x16": "RuntimeError: illegal address"}
    assert Tuner(store=ChoiceFile(tmp_path / "choices.json"), enabled=True).lookup(KEY) == Variant("naive")
    fresh = FakeGPU({}).tuner()
    assert fresh.report_failure(KEY, Variant("naive"), OSError("x")) == Variant("index_select")
    assert "naive failed" in fresh.record(KEY).note


# -- keys ------------------------------------------------------------------------------------------------------

def test_buckets_at_their_edges():
    assert [id_bucket(n) for n in (0, 1, 2, 3, 4, 1023, 1024, 1025, (1 << 20) - 1, 1 << 20)] == \
        [0, 1, 2, 2, 4, 512, 1024, 1024, 1 << 19, 1 << 20]
    assert [table_bucket(n) for n in (0, 1, 3, 4, 15, 16, (1 << 28) - 1, 1 << 28, (1 << 30) - 1, 1 << 30,
                                      (1 << 34) + 1)] == \
        [0, 1, 1, 4, 4, 16, 1 << 26, 1 << 28, 1 << 28, 1 << 30, 1 << 34]


def test_key_fields_and_json_round_trip():
    key = TuneKey.of(ENV, row_bytes=2052, elem_bytes=2, n_ids=131_071, n_rows=(1 << 32) // 2052, align=4)
    assert (key.gpu, key.driver, key.torch, key.cuda, key.sources) == ENV
    assert (key.row_bytes, key.elem_bytes, key.align, key.ids, key.table) == (2052, 2, 4, 65536, 1 << 30)
    assert TuneKey.from_json(json.loads(json.dumps(key.to_json()))) == key
    assert TuneKey.of(ENV, 400, 4, 4096, 1 << 20) == TuneKey.of(ENV, 400, 4, 8191, (1 << 30) // 400 - 1)
    assert TuneKey.of(ENV, 400, 4, 4096, 1 << 20) != TuneKey.of(ENV, 400, 4, 8192, 1 << 20)
    for bad in ({**key.to_json(), "row_bytes": True}, {**key.to_json(), "ids": -1}, {**key.to_json(), "gpu": 3},
                {k: v for k, v in key.to_json().items() if k != "align"}, {**key.to_json(), "extra": 1}, [1]):
        with pytest.raises(ValueError, match="tuner key"):
            TuneKey.from_json(bad)


def test_key_for_names_the_device_driver_torch_cuda_and_sources(monkeypatch):
    monkeypatch.setattr(tune_keys, "_environments", {})
    monkeypatch.setattr(tune_keys, "_driver_version", lambda: "550.54.15")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"Fake GPU {index}")
    key = key_for("cuda:1", 400, 4, 3000, 1000)
    assert (key.gpu, key.driver, key.torch, key.cuda, key.sources) == \
        ("Fake GPU 1", "550.54.15", torch.__version__, torch.version.cuda or "", sources_hash())
    assert key_for(1, 400, 4, 3000, 1000) == key and key.ids == 2048 and key.align == 16
    assert key_for(torch.device("cuda", 0), 400, 4, 3000, 1000).gpu == "Fake GPU 0"
    with pytest.raises(ValueError, match="CUDA gathers, not gathers on cpu"):
        key_for("cpu", 400, 4, 3000, 1000)


def test_the_driver_version_is_read_from_either_kind_of_kernel_module():
    assert tune_keys.nvidia_module_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.3.0") == "550.54.15"
    assert tune_keys.nvidia_module_version(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build") == "570.86.15"
    assert tune_keys.nvidia_module_version("garbage") == ""


def test_the_sources_hash_follows_the_kernel_source(tmp_path, monkeypatch):
    (tmp_path / "gather.cu").write_text("__global__ void k() {}\n")
    (tmp_path / "cuda_shim.h").write_text("// host emulation only\n")
    monkeypatch.setattr(tune_keys, "CUDA_DIR", tmp_path)
    before = sources_hash.__wrapped__()
    (tmp_path / "cuda_shim.h").write_text("// changed, but never on a GPU\n")
    assert sources_hash.__wrapped__() == before
    (tmp_path / "gather.cu").write_text("__global__ void k() { }\n")
    assert sources_hash.__wrapped__() != before and len(before) == 16


@pytest.mark.parametrize("field", ["gpu", "driver", "torch", "cuda", "sources"], ids=lambda f: f"new-{f}")
def test_a_new_driver_torch_runtime_or_source_is_timed_afresh(tmp_path, field):
    store = ChoiceFile(tmp_path / "choices.json")
    first = FakeGPU({"naive": 0.1})
    first.tuner(store=store).choose(KEY, CANDIDATES, first.run)
    gpu = FakeGPU({"aligned": 0.1})
    t = gpu.tuner(store=store)
    assert t.lookup(KEY) == Variant("naive")
    changed = dataclasses.replace(KEY, **{field: "something else"})
    assert t.lookup(changed) is None
    assert t.choose(changed, CANDIDATES, gpu.run) == Variant("aligned") and gpu.runs
    assert {r["chosen"] for r in t.table()} == {"naive", "aligned"}  # the old choice stays for the old versions


# -- the cache file --------------------------------------------------------------------------------------------

def test_choices_round_trip_through_the_file(tmp_path):
    store = ChoiceFile(tmp_path / "tuner" / "choices.json")
    gpu = FakeGPU(_ms(index_select=0.5, naive_sort=0.25), fail={"aligned"})
    first = gpu.tuner(store=store)
    first.choose(KEY, CANDIDATES, gpu.run)
    other_key = dataclasses.replace(KEY, row_bytes=256)
    first.choose(other_key, candidates(256, 0, 0), gpu.run)
    data = json.loads(store.path.read_text())
    assert data["format"] == 1 and len(data["records"]) == 2
    assert list(store.path.parent.iterdir()) == [store.path]  # no partial left behind
    untouched = FakeGPU({})  # a new process: reads, never times
    second = untouched.tuner(store=store)
    assert second.lookup(KEY) == Variant("naive", sorted=True) and second.record(KEY) == first.record(KEY)
    assert second.choose(other_key, [], untouched.run) == first.lookup(other_key) and not untouched.runs


def test_two_tuners_on_one_file_keep_each_others_choices(tmp_path):
    path = tmp_path / "choices.json"
    a, b = FakeGPU({"naive": 0.1}), FakeGPU({"aligned": 0.1})
    a.tuner(store=ChoiceFile(path)).choose(KEY, CANDIDATES, a.run)
    other = dataclasses.replace(KEY, elem_bytes=2)
    b.tuner(store=ChoiceFile(path)).choose(other, CANDIDATES, b.run)
    assert {r.key: r.chosen for r in ChoiceFile(path).load()} == {KEY: "naive", other: "aligned"}


@pytest.mark.parametrize("content", [b"\x00garbage{", b"\xff\xfe not utf-8", b'{"format": 1, "records": [',
                                     b'{"format": 99, "records": []}', b"[]", b'{"format": 1, "records": {}}'],
                         ids=["garbage", "not-utf8", "torn", "other-format", "a-list", "records-not-a-list"])
def test_a_torn_or_garbage_file_is_ignored_with_a_warning_and_replaced(tmp_path, content):
    store = ChoiceFile(tmp_path / "choices.json")
    store.path.write_bytes(content)
    gpu = FakeGPU({"naive": 0.1})
    t = gpu.tuner(store=store)
    with pytest.warns(TunerCacheWarning, match="is ignored"):
        assert t.lookup(KEY) is None
    with pytest.warns(TunerCacheWarning):  # the save reads it once more before replacing it
        assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("naive")
    assert [r.chosen for r in ChoiceFile(store.path).load()] == ["naive"]


def test_a_garbled_record_is_skipped_and_the_others_kept(tmp_path):
    good = TuneRecord(KEY, "naive", (("index_select", 0.5), ("naive", 0.1)), (), (), "", 300.0)
    bad = [{**good.to_json(), "chosen": "no-such-kernel"}, {**good.to_json(), "times_ms": {"naive": "NaN"}},
           {**good.to_json(), "key": {"gpu": "x"}}, {"chosen": "naive"}, 7]
    path = tmp_path / "choices.json"
    path.write_text(json.dumps({"format": 1, "records": [*bad, good.to_json()]}))
    with pytest.warns(TunerCacheWarning, match="5 garbled record"):
        assert ChoiceFile(path).load() == [good]


def test_a_file_that_cannot_be_written_leaves_the_choice_in_memory(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    gpu = FakeGPU({"naive": 0.1})
    t = gpu.tuner(store=ChoiceFile(tmp_path / "a-file" / "choices.json"))  # its folder is a file
    with pytest.warns(TunerCacheWarning) as caught:
        assert t.choose(KEY, CANDIDATES, gpu.run) == Variant("naive")
    assert "cannot be read (NotADirectoryError" in str(caught[0].message)
    assert "cannot be written (" in str(caught[-1].message) and "choices stay in memory" in str(caught[-1].message)
    assert t.lookup(KEY) == Variant("naive")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    store = ChoiceFile(tmp_path / "choices.json")
    store.path.write_text("{}")
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.warns(TunerCacheWarning) as caught:
        assert not store.save([t.record(KEY)])
    first, last = (str(w.message) for w in caught)
    assert "is not a tuner cache of format 1" in first and "cannot be written (OSError: [Errno 28] No space" in last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "choices.json"]  # no partial left
    assert store.path.read_text() == "{}"  # the old file whole


def test_clear_removes_our_file_and_its_partials_only(tmp_path):
    folder = tmp_path / "tuner"
    gpu = FakeGPU({"naive": 0.1})
    t = gpu.tuner(store=ChoiceFile(folder / "choices.json"))
    t.choose(KEY, CANDIDATES, gpu.run)
    (folder / "choices.json.abc123.partial").write_text("torn")
    (folder / "notes.txt").write_text("someone else's")
    assert t.clear() is True and t.lookup(KEY) is None
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    assert t.clear() is False


def test_the_default_file_lives_under_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DIRECTLOAD_CACHE", str(tmp_path))
    assert ChoiceFile().path == tmp_path / "tuner" / "choices.json" == Tuner(enabled=True).store.path
    assert tuner.tuner_state() == {"tuner_enabled": tuning_enabled(), "tuner_cache": str(ChoiceFile().path),
                                   "tuner_choices": 0}


# -- opting out --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, on", [("0", False), ("off", False), (" FALSE ", False), ("no", False),
                                      ("1", True), ("", True), ("yes", True)])
def test_the_environment_variable(value, on):
    assert tuning_enabled({"DIRECTLOAD_TUNE": value}) is on


def test_tuning_off_times_nothing_and_takes_the_default(tmp_path, monkeypatch):
    store = ChoiceFile(tmp_path / "choices.json")
    first = FakeGPU({"naive": 0.1})
    first.tuner(store=store).choose(KEY, CANDIDATES, first.run)
    monkeypatch.setenv("DIRECTLOAD_TUNE", "0")
    monkeypatch.setenv("DIRECTLOAD_CACHE", str(tmp_path / "cache"))
    gpu = FakeGPU({"naive": 0.1})
    t = Tuner(timer=gpu.timer, clock=gpu.clock, store=store)
    assert not t.enabled and t.lookup(KEY) is None  # the file's choice is not used either
    want = default_variant(KEY.row_bytes, 0x1000, 0x2000)
    assert t.choose(KEY, CANDIDATES, gpu.run) == want == t.lookup(KEY) and not gpu.runs
    assert t.record(KEY) is None and [r["chosen"] for r in t.table()] == ["naive"]
    assert tuner.tuner_state()["tuner_enabled"] is False


# -- threads and fork --------------------------------------------------------------------------------------------

def test_threads_time_each_key_once_and_agree():
    keys = [dataclasses.replace(KEY, ids=1 << k) for k in range(4)]
    gpu = FakeGPU({"naive": 0.1})
    slow_timer = lambda fn: (time.sleep(0.0005), gpu.timer(fn))[1]  # noqa: E731
    t = gpu.tuner(timer=slow_timer)
    got, start = [], threading.Barrier(8)

    def work(i):
        start.wait()
        for key in keys[i % 2:] + keys[:i % 2]:
            got.append((key, t.lookup(key) or t.choose(key, CANDIDATES, gpu.run)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(got) == 8 * len(keys) and {v for _, v in got} == {Variant("naive")}
    assert gpu.runs.count("naive") == len(keys) * (1 + tuner.REPEATS)  # each key timed once


def test_a_child_forked_while_a_thread_times_is_not_stuck():
    gpu = FakeGPU({"naive": 0.1})
    t = gpu.tuner()
    with t._timing, t._lock:  # as if another thread were timing at fork()
        pid = os.fork()
        if pid == 0:
            ok = t.choose(KEY, CANDIDATES, gpu.run) == Variant("naive") and tuner.get_tuner() is tuner.get_tuner()
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited on a lock held at fork()")
    assert os.waitstatus_to_exitcode(status) == 0


# -- reporting ---------------------------------------------------------------------------------------------------

def test_the_table_names_every_key_field_the_choice_each_time_and_each_failure():
    gpu = FakeGPU(_ms(index_select=0.5, naive=0.2), fail={"aligned+sort"})
    t = gpu.tuner()
    t.choose(KEY, CANDIDATES, gpu.run)
    small = dataclasses.replace(KEY, row_bytes=64)
    t.choose(small, candidates(64, 0, 0), gpu.run)
    rows = t.table()
    assert [r["row_bytes"] for r in rows] == [64, 400]  # sorted by key
    row = rows[1]
    assert {f.name for f in dataclasses.fields(TuneKey)} <= set(row)
    assert row["chosen"] == "naive" and row["speedup"] == pytest.approx(2.5) and row["untimed"] == []
    assert set(row["times_ms"]) == {v.name for v in CANDIDATES} - {"aligned+sort"}
    assert list(row["failed"]) == ["aligned+sort"]
    json.dumps(rows)  # plain data, for --json
