"""GPU benchmark machinery: one pinned table per sweep, id sets, the candidates, and a timer that keeps the
host's time, the GPU's time and a pipelined mean apart.

Every GPU sweep of benchmarks/ measures on one table (one size, one allocator, both printed) and times each
method four ways (see :func:`measure`):

- ``host``: how long the call takes to return, from an idle GPU (the CPU's cost of a call, including any
  wait on the GPU inside it);
- ``gpu``: CUDA-event time of the GPU's work alone: the stream is held busy by a spin kernel while the host
  issues the call, so host work falls outside the interval (a call that waits on the GPU inside shows as
  ``uncovered``: its interval then includes the host's work);
- ``wall``: one blocking call from an idle GPU (call, then synchronize): the latency a caller sees;
- ``pipe``: N calls back to back and one synchronize, per call: the cost when calls queue up.
"""

import gc
import itertools
import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch

__all__ = ["ALLOCATORS", "HostTable", "allocate_table", "id_sets", "variant_names", "tuner_module", "tuner_pick",
           "gather_methods", "verify", "Stat", "summarize", "CudaClock", "measure", "point_rows", "GIB", "MIB",
           "free_host_bytes", "fit_table_sizes", "fill", "gpu_facts", "rotating", "run_point", "WINDOW",
           "NOT_CANDIDATES"]

MIB, GIB = 1 << 20, 1 << 30
#: Distinct id sets each method rotates through, so no call reads rows the previous one left in the L2.
INDEX_SETS = 8
#: Rows the memory-traffic model counts as in flight together (about an H100's: 132 SMs x 64 warps).
WINDOW = 8192
ALLOCATORS = {
    "directload": "directload.empty: cudaHostAlloc, pinned and mapped, directload's host pool",
    "torch": "torch.empty(pin_memory=True): torch's caching host allocator",
}


@dataclass
class HostTable:
    """One pinned, mapped host table of ``nbytes`` for a whole sweep, viewed as rows of any size.

    ``flat`` is the pinned host memory as float32, ``mapped`` the same bytes as a CUDA tensor (read
    zero-copy over the link); ``owner`` keeps the allocation.
    """

    nbytes: int
    allocator: str
    flat: torch.Tensor
    mapped: torch.Tensor
    owner: object

    def rows(self, row_bytes):
        """``(host, mapped)``: ``[rows, row_bytes / 4]`` float32 views of the table's first whole rows."""
        if row_bytes <= 0 or row_bytes % 4:
            raise ValueError(f"row bytes must be a positive multiple of 4 (float32 rows), got {row_bytes}")
        e = row_bytes // 4
        rows = self.nbytes // row_bytes
        return self.flat[:rows * e].view(rows, e), self.mapped[:rows * e].view(rows, e)

    def describe(self):
        return f"{self.nbytes / GIB:g} GiB table, {ALLOCATORS[self.allocator]}"

    def close(self):
        """Free the memory now (directload's pool keeps freed blocks: emptied here so sizes do not pile up)."""
        self.flat = self.mapped = None
        if self.allocator == "directload":
            from directload import memory

            self.owner.close()
            gc.collect()  # the block goes back to the pool when the last view over it is gone
            memory.pool().empty_cache()
        self.owner = None


def allocate_table(nbytes, allocator="directload"):
    """A :class:`HostTable` of ``nbytes``, every page written with distinct values from the GPU."""
    from directload.kernels.interop import cuda_array

    n = nbytes // 4
    if allocator == "directload":
        import directload

        owner = directload.empty((n,), dtype=torch.float32)
        flat, mapped = owner.host, owner.cuda_view()
    elif allocator == "torch":
        owner = flat = torch.empty(n, dtype=torch.float32, pin_memory=True)
        mapped = torch.as_tensor(cuda_array(flat), device="cuda").view(torch.float32)
    else:
        raise ValueError(f"allocator must be one of {sorted(ALLOCATORS)}, got {allocator!r}")
    fill(mapped)
    return HostTable(n * 4, allocator, flat, mapped, owner)


def fill(mapped):
    """Write distinct values into every page of a mapped table from the GPU (through the mapping, at the
    link's speed), so no read is served by the kernel's zero page."""
    ints = mapped.reshape(-1).view(torch.int32)
    n, step = ints.numel(), 64 * MIB
    for s in range(0, n, step):
        ints[s:s + step].copy_(torch.arange(s, min(n, s + step), device=ints.device, dtype=torch.int64)
                               .to(torch.int32))
    torch.cuda.synchronize()


def free_host_bytes(meminfo="/proc/meminfo"):
    """The kernel's MemAvailable, in bytes."""
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{meminfo} has no MemAvailable line")


def fit_table_sizes(sizes, available, headroom=4 * GIB):
    """``(fit, skipped)``: the table sizes that leave ``headroom`` of ``available`` host memory free, and a
    line for each one that does not.  Pure.

    >>> fit, skipped = fit_table_sizes([1 << 30, 16 << 30], 12 << 30)
    >>> fit, skipped[0]
    ([1073741824], 'skipped the 16 GiB table: it needs 16 GiB of host memory, 12 GiB is available and 4 GiB stays free')
    """
    fit, skipped = [], []
    for size in sizes:
        if size + headroom <= available:
            fit.append(size)
        else:
            skipped.append(f"skipped the {size / GIB:g} GiB table: it needs {size / GIB:g} GiB of host memory, "
                           f"{available / GIB:.3g} GiB is available and {headroom / GIB:g} GiB stays free")
    return fit, skipped


def id_sets(n_rows, count, order, rng, n_sets=INDEX_SETS, device="cuda"):
    """``n_sets`` pairs ``(cpu_ids, device_ids)`` of ``count`` uniform random int64 ids below ``n_rows``,
    ``order`` ``"random"`` or ``"sorted"`` (ascending, as a caller that sorts them itself would pass)."""
    if order not in ("random", "sorted"):
        raise ValueError(f"id order must be 'random' or 'sorted', got {order!r}")
    sets = []
    for _ in range(n_sets):
        ids = torch.from_numpy(rng.integers(0, n_rows, count))
        if order == "sorted":
            ids = torch.sort(ids).values
        sets.append((ids, ids.to(device)))
    return sets


def variant_names(row_bytes, src_addr, out_addr, kernels=None):
    """Names of every candidate of ``kernels.variants.candidates`` (sorted and not), those of ``kernels``
    (base kernel names: ``index_select``, ``rowvec``, ``naive``, ``aligned``) only where given; ``[]``
    where this checkout has no variants."""
    try:
        from directload.kernels import variants
    except ImportError:
        return []
    return [v.name for v in variants.candidates(row_bytes, src_addr, out_addr)
            if kernels is None or v.kernel in kernels]


def tuner_module():
    """``directload.kernels.tuner``, or None where this checkout has none (its columns then read n/a)."""
    try:
        from directload.kernels import tuner
    except ImportError:
        return None
    return tuner


def tuner_pick(src, index, out):
    """The tuner's record for this gather's key (``TuneRecord.row()``: ``chosen``, its own ``times_ms``...),
    or None where the tuner has none or its API is not the one this script knows (the timing stands)."""
    tuner = tuner_module()
    try:
        from directload.kernels.variants import legal_width

        row_bytes = src.element_size() * math.prod(src.shape[1:])
        key = tuner.key_for(index.device, row_bytes, src.element_size(), index.numel(), src.shape[0],
                            align=legal_width(row_bytes, src.data_ptr(), out.data_ptr()))
        record = tuner.get_tuner().record(key)
    except Exception:  # noqa: BLE001 - another tuner API: the pick reads n/a
        return None
    return record.row() if record is not None else None


def _takes_variant():
    import inspect

    from directload.kernels import gather

    return "variant" in inspect.signature(gather).parameters


def gather_methods(host, mapped, out, *, kernels=None, tuner=True, torch_path=True, ideal=True):
    """``{name: fn(ids)}`` for one table view and output: every candidate variant, the tuner's choice,
    torch's own ``index_select`` over the mapped view and the ideal (a pinned copy of the same bytes).

    ``ids`` is a ``(cpu_ids, cuda_ids)`` pair of :func:`id_sets`.  Where ``kernels.gather`` takes no
    ``variant`` yet, the old kernels stand in (``cupy_aligned``, ``cupy_naive``).
    """
    from directload.kernels import gather

    methods = {}
    if ideal:
        src = host.view(-1)[:out.numel()]
        methods["ideal_copy"] = lambda i: out.view(-1).copy_(src, non_blocking=True)
    if torch_path:
        methods["torch_index_select"] = lambda i: torch.index_select(mapped, 0, i[1], out=out)
    if _takes_variant():
        for name in variant_names(host.shape[1] * 4, host.data_ptr(), out.data_ptr(), kernels):
            methods[name] = lambda i, v=name: gather(host, i[1], out=out, variant=v)
        if tuner and tuner_module() is not None:
            methods["tuner"] = lambda i: gather(host, i[1], out=out)
    else:
        for aligned in (True, False):
            methods[f"cupy_{'aligned' if aligned else 'naive'}"] = (
                lambda i, a=aligned: gather(host, i[1], out=out, backend="cupy", aligned=a))
    return methods


def verify(methods, out, host, ids, clock, now=time.perf_counter):
    """Run each method once on ``ids`` into a poisoned ``out`` (or check the tensor it returns, for methods
    that make their own output): ``(working, failures, first)``.  A method
    that raised or gathered wrong rows is left out of ``working`` and named, with why, in ``failures``;
    ``first`` holds each method's first call in seconds (compiles and the tuner's timing included)."""
    want = host[ids[0]].to(out.device)
    working, failures, first = {}, {}, {}
    for name, fn in methods.items():
        out.view(torch.int32).fill_(-1)
        clock.sync()
        t0 = now()
        try:
            got = fn(ids)  # what the method returns, else what it wrote into out
            got = got if isinstance(got, torch.Tensor) else out
            clock.sync()
            first[name] = now() - t0
        except Exception as exc:  # noqa: BLE001 - reported in the table, the other methods still run
            failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            continue
        if name != "ideal_copy" and not torch.equal(got.view(torch.int32), want.view(torch.int32)):  # bits: NaNs
            failures[name] = "gathered wrong rows"
            continue
        working[name] = fn
    return working, failures, first


@dataclass(frozen=True)
class Stat:
    """Median and quartiles of one measure's samples (the tables print half the interquartile range, in %
    of the median, as its spread)."""

    median: float
    p25: float
    p75: float
    n: int


def summarize(values):
    """:class:`Stat` of ``values`` (at least one).

    >>> summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    Stat(median=3.0, p25=2.0, p75=4.0, n=5)
    """
    values = list(values)
    if len(values) == 1:
        return Stat(values[0], values[0], values[0], 1)
    q = statistics.quantiles(values, n=4, method="inclusive")
    return Stat(statistics.median(values), q[0], q[2], len(values))


class CudaClock:
    """The current stream's events, a spin kernel to hold it busy, and synchronize."""

    def __init__(self):
        self.cycles_per_s = self._calibrate()

    def _calibrate(self):
        """Clock cycles per second of ``torch.cuda._sleep``, the spin kernel."""
        torch.cuda._sleep(1_000)
        times = []
        for _ in range(3):
            a = self.mark()
            torch.cuda._sleep(1_000_000)
            b = self.mark()
            torch.cuda.synchronize()
            times.append(self.elapsed(a, b))
        return 1_000_000 / statistics.median(times)

    def sync(self):
        torch.cuda.synchronize()

    def hold(self, seconds):
        torch.cuda._sleep(int(seconds * self.cycles_per_s))

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def elapsed(self, a, b):
        return a.elapsed_time(b) / 1e3


def measure(fns, clock, *, reps=7, pipeline=10, pipe_rounds=3, min_seconds=0.2, max_rounds=100, now=None):
    """Time each ``fns[name]()`` in interleaved rounds; ``{name: {measure: [samples in seconds]}}``.

    One round times every function once, in order, from an idle GPU (``host``, ``wall``) and behind a
    busy stream (``gpu``); rounds repeat until there are ``reps`` of them and ``min_seconds`` have passed
    (at most ``max_rounds``).  Then ``pipe_rounds`` rounds of ``pipeline`` calls back to back (``pipe``).
    Sample ``k`` of every function comes from the same round, so ratios can be taken round by round.
    ``uncovered`` counts the ``gpu`` samples whose call had not returned when the spin ended (their
    interval includes host work: the call waited on the GPU).
    """
    now = now or time.perf_counter
    cover, calls = {}, {}
    for name, fn in fns.items():  # warm-up: compile, tune, fault pages in; estimate the host's time
        fn()
        clock.sync()
        t0 = now()
        fn()
        t1 = now()
        clock.sync()
        cover[name] = min(0.1, max(1e-4, 3 * (t1 - t0) + 5e-5))
        # Enough calls to queue up where calls are short; a few where each is long enough to hide the host.
        calls[name] = max(3, min(pipeline, int(0.05 / max(now() - t0, 1e-9))))
    samples = {name: {"host": [], "wall": [], "gpu": [], "pipe": [], "uncovered": 0} for name in fns}
    start, rounds = now(), 0
    while rounds < reps or (now() - start < min_seconds and rounds < max_rounds):
        marks = {}
        for name, fn in fns.items():
            s = samples[name]
            clock.sync()
            t0 = now()
            fn()
            t1 = now()
            clock.sync()
            s["host"].append(t1 - t0)
            s["wall"].append(now() - t0)
            h0 = now()
            clock.hold(1.5 * cover[name])  # a margin over the check below, for a GPU clock above the calibration's
            a = clock.mark()
            fn()
            b = clock.mark()
            s["uncovered"] += now() - h0 >= cover[name]
            marks[name] = (a, b)
        clock.sync()
        for name, (a, b) in marks.items():
            samples[name]["gpu"].append(clock.elapsed(a, b))
        rounds += 1
    for _ in range(pipe_rounds):
        for name, fn in fns.items():
            clock.sync()
            t0 = now()
            for _ in range(calls[name]):
                fn()
            clock.sync()
            samples[name]["pipe"].append((now() - t0) / calls[name])
    return samples


def _ratio(a, b):
    return summarize([x / y for x, y in zip(a, b)])


#: What :func:`point_rows` leaves out of the candidates when it names the fastest one.
NOT_CANDIDATES = ("ideal_copy", "torch_index_select", "tuner")


def point_rows(samples, nbytes, *, base="torch_index_select", ideal="ideal_copy", **keys):
    """One result row per method of :func:`measure`'s ``samples`` for a gather of ``nbytes``: each
    measure's :class:`Stat` in microseconds (as dicts), GB/s by GPU and by pipelined time, and the
    round-by-round time ratios over ``base``, over ``ideal`` and over ``best``, the candidate of least
    median GPU time (where measured).  ``keys`` go in every row; the tuner's row also names ``best``."""
    best = min((n for n in samples if n not in NOT_CANDIDATES), default=None,
               key=lambda n: statistics.median(samples[n]["gpu"]))
    rows = []
    for name, s in samples.items():
        row = {**keys, "method": name}
        for m in ("host", "wall", "gpu", "pipe"):
            row[f"{m}_us"] = asdict(summarize(v * 1e6 for v in s[m]))
        row["gbps"] = nbytes / max(statistics.median(s["gpu"]), 1e-12) / 1e9
        row["pipe_gbps"] = nbytes / max(statistics.median(s["pipe"]), 1e-12) / 1e9
        row["uncovered"] = s["uncovered"] / max(1, len(s["gpu"]))
        for other, label in ((base, "vs_torch"), (ideal, "vs_ideal"), (best, "vs_best")):
            if other in samples:
                row[label] = asdict(_ratio(s["gpu"], samples[other]["gpu"]))
                row[f"{label}_pipe"] = asdict(_ratio(s["pipe"], samples[other]["pipe"]))
        if name == "tuner":
            row["best"] = best
        rows.append(row)
    return rows


def rotating(fn, sets, start):
    """``fn(ids)`` bound to a rotation through ``sets`` starting at ``start``."""
    it = itertools.cycle(sets[start:] + sets[:start])
    return lambda: fn(next(it))


def gpu_facts():
    """The GPU, its driver and what the host memory is made of (transparent huge pages)."""
    props = torch.cuda.get_device_properties(0)
    facts = {"gpu": props.name, "sms": props.multi_processor_count, "cuda": torch.version.cuda}
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            facts["transparent_hugepages"] = f.read().strip()
    except OSError:
        facts["transparent_hugepages"] = None
    return facts


def run_point(table, row_bytes, count, order, rng, clock, *, kernels=None, tuner=True, reps=7, pipeline=20,
              window=WINDOW, device="cuda", **keys):
    """Every method on one point (a row size, an id count, an id order) of ``table``: result rows of
    :func:`point_rows`, the methods that failed or are missing as rows with ``failed``, the tuner's pick on
    its row, and the model's sorting gain for these ids on every row.  (``device`` and ``clock`` are
    parameters so the CPU tests can run the plumbing.)"""
    from directload.kernels.pcie_model import sorting_gain

    host, mapped = table.rows(row_bytes)
    out = torch.empty((count, host.shape[1]), dtype=host.dtype, device=device)
    sets = id_sets(host.shape[0], count, order, rng, device=device)
    keys = {"row_bytes": row_bytes, "count": count, "ids": order, "table_gib": table.nbytes / GIB,
            "allocator": table.allocator, **keys}
    methods = gather_methods(host, mapped, out, kernels=kernels, tuner=tuner)
    working, failed, first = verify(methods, out, host, sets[0], clock)
    if tuner and "tuner" not in methods:
        failed["tuner"] = "n/a: this checkout has no kernels.tuner" if tuner_module() is None else \
            "n/a: kernels.gather takes no variant here"
    fns = {name: rotating(fn, sets, k) for k, (name, fn) in enumerate(working.items())}
    rows = point_rows(measure(fns, clock, reps=reps, pipeline=pipeline), count * row_bytes, **keys) if fns else []
    for r in rows:
        r["first_call_us"] = first[r["method"]] * 1e6
        if r["method"] == "tuner":
            record = tuner_pick(host, sets[0][1], out)
            r["pick"] = record["chosen"] if record else "n/a"
            r["tuner_record"] = record
    rows += [{**keys, "method": name, "failed": why} for name, why in failed.items()]
    gain = sorting_gain(sets[0][0].numpy(), row_bytes, window=window, src_addr=host.data_ptr())
    for r in rows:
        r["model_sort_gain"] = gain
    del out
    return rows
