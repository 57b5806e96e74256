"""Compressed rows against float32, side by side in one run (``directload bench codecs``).

Two parts, on the CPU:

* **gather**: rows per second of the decoding gather (float16, bfloat16 and int8 codes decoded into float32 inside
  the gather) against directload's float32 gather of the same rows, at 64 to 4,096 features; beside them torch's
  own path for codes (``index_select`` of the code rows, then the decode in torch).  Each round times every
  method once, in a fresh random order, each over fresh random ids, and the ratio against float32 is taken round
  by round:
  its median and quartiles are reported.
* **tiers**: the same batches read through a disk store and a host cache of equal bytes (a quarter of the float32
  table), for float32 rows and for each codec's code rows (``StoreSpec(codec=...)``): the bytes each tier moved
  (disk reads, cache fills), the cache's rows and hit rate, and the read time; and the bytes PCIe would carry for
  the same batches gathered zero-copy by a GPU (32-byte sectors, by :mod:`directload.kernels.pcie_model`).

``--device cuda`` (the GPU kit's ``codecs`` section) measures the gather on a GPU instead: CUDA ids over the
table and its codes in pinned, GPU-mapped host memory (a unified tensor), rows per second by CUDA-event time of
directload's float32 gather, each codec's fused decoding gather and its ``index_select`` + decode, in
interleaved rounds (``benchmarks/_gpu.py``'s timer).

Prints tables, writes ``results/codecs.json`` (``gpu/codecs.json`` on a GPU) and the PNG beside it.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    parse_with_quick,
    prepare_cpu_kernels,
    print_table,
    pyplot,
    save_figure,
    system_facts,
)

from directload.capabilities import capabilities  # noqa: E402
from directload.codecs import CODECS, EncodedTable, encode  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402
from directload.kernels import gather  # noqa: E402
from directload.kernels.decode import gather_encoded, prepare_decode, torch_path  # noqa: E402
from directload.kernels.pcie_model import footprint  # noqa: E402
from directload.stores import StoreSpec, open_store, write_disk_store  # noqa: E402

#: Rows a GPU gather has in flight at once, for the model of the bytes PCIe carries (a sector two rows in flight
#: share is read once).
PCIE_WINDOW = 256
QUICK = dict(dims=[16, 64], rows=4000, ids=512, rounds=3, tier_rows=4000, batches=6)


def _quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "p25": q[0], "p75": q[2], "n": len(values)}


def gather_part(args, rng):
    """Rows/s of each method per width, and each method's round-by-round ratio to the float32 gather."""
    rows = []
    for dim in tqdm(args.dims, desc="gather", disable=args.no_progress):
        n_rows = max(args.ids, min(args.rows, (args.table_mib << 20) // (4 * dim)))
        table = torch.from_numpy(rng.standard_normal((n_rows, dim)).astype(np.float32))
        encoded = {name: encode(table, name) for name in CODECS}
        out = torch.empty(args.ids, dim)
        methods = _methods(table, encoded, out)
        for fn in methods.values():  # warm-up: kernels loaded, pages touched
            fn(torch.from_numpy(rng.integers(0, n_rows, args.ids)))
        times = {m: [] for m in methods}
        names = list(methods)
        for _ in range(args.rounds):  # interleaved: one call of each method a round, in a fresh order, fresh ids
            for k in rng.permutation(len(names)):
                name, fn = names[k], methods[names[k]]
                ids = torch.from_numpy(rng.integers(0, n_rows, args.ids))
                t0 = time.perf_counter()
                fn(ids)
                times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            ratio = [f / t for f, t in zip(times["float32"], ts)]
            rows.append({"dim": dim, "method": name, "table_rows": n_rows, "mrows_s": args.ids / statistics.median(ts)
                         / 1e6, "vs_float32": _quartiles(ratio), "row_bytes": _row_bytes(name, dim)})
    return rows


def _methods(table, encoded, out):
    """``name -> fn(ids)``: the float32 gather, each codec's decoding gather and its torch path, into ``out``."""
    methods = {"float32": lambda ids: gather(table, ids, out=out)}
    for name, codes in encoded.items():
        methods[name] = lambda ids, codes=codes: gather(codes, ids, out=out)
        methods[f"{name} (torch)"] = lambda ids, codes=codes: torch_path(codes, ids, out)
    return methods


def gpu_part(args, rng):
    """The gather on a GPU: per width, CUDA-event time of each method in interleaved rounds, and the ratio of
    rows/s to the float32 gather's, round by round."""
    from _gpu import CudaClock, id_sets, measure, rotating, summarize

    from directload.unified import to_unified

    clock, rows = CudaClock(), []
    for dim in tqdm(args.dims, desc="gather on the GPU", disable=args.no_progress):
        n_rows = max(args.ids, min(args.rows, (args.table_mib << 20) // (4 * dim)))
        table = torch.from_numpy(rng.standard_normal((n_rows, dim)).astype(np.float32))
        mapped = {name: EncodedTable(to_unified(e.codes), e.codec) for name, e in
                  ((name, encode(table, name)) for name in CODECS)}
        plain = to_unified(table)
        sets = id_sets(n_rows, args.ids, "random", rng)
        fns = _gpu_methods(plain, mapped, torch.empty(args.ids, dim, device="cuda"), sets, rotating)
        samples = measure(fns, clock, reps=args.rounds)
        base = samples["float32"]["gpu"]
        for name, got in samples.items():
            rows.append({"dim": dim, "method": name, "table_rows": n_rows, "row_bytes": _row_bytes(name, dim),
                         "mrows_s": args.ids / statistics.median(got["gpu"]) / 1e6,
                         "vs_float32": asdict(summarize([b / g for b, g in zip(base, got["gpu"])]))})
    return rows


def _gpu_methods(plain, mapped, out, sets, rotating):
    """``name -> fn()``: the float32 gather and each codec's fused gather and ``index_select`` + decode, into
    ``out``, each rotating through the id ``sets`` from its own start."""
    fns = {"float32": rotating(lambda ids: gather(plain, ids, out=out), sets, 0)}
    for k, (name, codes) in enumerate(mapped.items()):
        for path, label in (("fused", name), ("torch", f"{name} (index_select+decode)")):
            fns[label] = rotating(lambda ids, codes=codes, path=path: gather_encoded(
                codes, ids, out=out, path=path).wait(), sets, 1 + 2 * k + (path == "torch"))
    return fns


def _row_bytes(method, dim):
    name = method.split(" ")[0]
    return 4 * dim if name == "float32" else CODECS[name].row_bytes(dim)


def tiers_part(args, rng, directory):
    """The same batches through a disk store and a host cache of equal bytes, float32 and each codec."""
    dim = args.tier_dim
    table = torch.from_numpy(rng.standard_normal((args.tier_rows, dim)).astype(np.float32))
    cache_bytes = args.tier_rows * dim * 4 // 4  # a quarter of the float32 table
    # skewed, as a graph's neighbours are: row k drawn with weight (k + 1) ** -skew, then the ids shuffled
    weight = np.arange(1, args.tier_rows + 1, dtype=np.float64) ** -args.skew
    order = rng.permutation(args.tier_rows)
    hot = order[rng.choice(args.tier_rows, (args.batches, args.batch_rows), p=weight / weight.sum())]
    out = []
    for name in tqdm(["float32", *CODECS], desc="tiers", disable=args.no_progress):
        codec = None if name == "float32" else name
        path = write_disk_store(table, directory / f"{name}.npy", codec=codec, progress=False)
        spec = StoreSpec(str(path), host_bytes=cache_bytes, staging_bytes=0)
        with open_store(spec) as store:
            t0 = time.perf_counter()
            for batch in hot:
                store.read(torch.from_numpy(batch))
            seconds = time.perf_counter() - t0
            stats = store.stats()
            host, disk = stats["host"], stats["disk"]
            row_bytes = _row_bytes(name, dim)
            # the same batches gathered zero-copy from mapped host memory: the 32-byte sectors the link carries,
            # by the model (kernels.pcie_model), PCIE_WINDOW rows in flight at once
            pcie = sum(footprint(batch, row_bytes, window=PCIE_WINDOW).sector_bytes for batch in hot)
            out.append({"rows": name, "row_bytes": row_bytes, "cache_rows": host["capacity_rows"],
                        "hit_rate": host["hit_rate"], "disk_bytes": disk["bytes_read"],
                        "disk_requested_bytes": disk["requested_bytes"], "cache_fill_bytes": host["fallback_bytes"],
                        "pcie_bytes": pcie, "read_s": seconds})
    base = out[0]
    for row in out:
        row["disk_bytes_vs_float32"] = base["disk_bytes"] / max(row["disk_bytes"], 1)
        row["requested_vs_float32"] = base["disk_requested_bytes"] / max(row["disk_requested_bytes"], 1)
        row["cache_rows_vs_float32"] = row["cache_rows"] / base["cache_rows"]
        row["pcie_vs_float32"] = base["pcie_bytes"] / max(row["pcie_bytes"], 1)
    return out, {"dim": dim, "rows": args.tier_rows, "cache_bytes": cache_bytes, "batches": args.batches,
                 "batch_rows": args.batch_rows, "skew": args.skew}


def _plot(gathers, tiers, path, where="CPU"):
    plt = pyplot()
    if tiers:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    else:
        fig, left = plt.subplots(figsize=(7, 4.5))
    for method in [m for m in dict.fromkeys(r["method"] for r in gathers) if m != "float32"]:
        pts = [r for r in gathers if r["method"] == method]
        x = [r["dim"] for r in pts]
        med = [r["vs_float32"]["median"] for r in pts]
        lo = [r["vs_float32"]["median"] - r["vs_float32"]["p25"] for r in pts]
        hi = [r["vs_float32"]["p75"] - r["vs_float32"]["median"] for r in pts]
        left.errorbar(x, med, yerr=[lo, hi], marker="o" if "torch" not in method else "x",
                      linestyle="-" if "torch" not in method else ":", label=method, capsize=3)
    left.axhline(1.0, color="black", linewidth=1)
    left.set_xscale("log", base=2)
    left.set_xlabel("features per row")
    left.set_ylabel("rows/s vs the float32 gather (median, quartiles)")
    left.set_title(f"{where} gather, decoded into float32")
    left.legend(fontsize=8)
    if not tiers:
        save_figure(fig, path)
        return
    names = [t["rows"] for t in tiers]
    x = np.arange(len(names))
    right.bar(x - 0.2, [t["disk_bytes_vs_float32"] for t in tiers], 0.4, label="disk bytes: float32 / this")
    right.bar(x + 0.2, [t["cache_rows_vs_float32"] for t in tiers], 0.4, label="cache rows: this / float32")
    right.set_xticks(x, names)
    right.set_ylabel("x float32")
    right.set_title("tiers at equal cache bytes")
    right.legend(fontsize=8)
    save_figure(fig, path)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256, 1024, 4096], help="features per row")
    p.add_argument("--rows", type=int, default=400_000, help="table rows (fewer for wide rows: --table-mib)")
    p.add_argument("--table-mib", type=int, default=512, help="largest float32 table, in MiB")
    p.add_argument("--ids", type=int, default=8192, help="ids per gather")
    p.add_argument("--rounds", type=int, default=41, help="interleaved rounds per width")
    p.add_argument("--tier-rows", type=int, default=200_000, help="rows of the tiers' table")
    p.add_argument("--tier-dim", type=int, default=100, help="features per row of the tiers' table")
    p.add_argument("--batches", type=int, default=200, help="batches read through the tiers")
    p.add_argument("--batch-rows", type=int, default=4096, help="ids per batch through the tiers")
    p.add_argument("--skew", type=float, default=0.7, help="row k of the tiers' table is read with weight "
                                                           "(k + 1) ** -skew")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the gather part on a GPU, over the table and its codes in mapped host memory")
    p.add_argument("--results", default=str(RESULTS), help="directory for the JSON and PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK} unless given")
    return p


def main(argv=None):
    p = build_parser()
    args = parse_with_quick(p, argv, QUICK)
    if min(args.dims) < 1 or args.ids < 1 or args.rounds < 1 or args.tier_rows < 1 or args.batches < 1:
        p.error("--dims, --ids, --rounds, --tier-rows and --batches must be at least 1")
    if args.device == "cuda" and not capabilities().cuda:
        raise SystemExit("codecs: --device cuda needs a CUDA device, and this machine has none")
    rng = np.random.default_rng(args.seed)
    out = Path(args.results)
    if args.device == "cuda":
        gathers, tiers, setup, name, where = gpu_part(args, rng), [], None, "gpu/codecs", "GPU"
    else:
        prepare_cpu_kernels()
        prepare_decode(background=False)
        gathers, name, where = gather_part(args, rng), "codecs", "CPU"
        with tempfile.TemporaryDirectory(prefix="directload-codecs-") as tmp:
            tiers, setup = tiers_part(args, rng, Path(tmp))
    print(f"\n{where} gather into float32: million rows/s, and the ratio to the float32 gather (median, quartiles)")
    print_table([{**r, "vs float32": f"{r['vs_float32']['median']:.2f} ({r['vs_float32']['p25']:.2f}-"
                  f"{r['vs_float32']['p75']:.2f})"} for r in gathers], ["dim", "method", "row_bytes", "mrows_s",
                                                                         "vs float32"])
    if tiers:
        print(f"\ntiers: {setup['rows']} rows of {setup['dim']} features, a host cache of {setup['cache_bytes']} bytes "
              f"(a quarter of the float32 table), {setup['batches']} batches of {setup['batch_rows']} ids (row k read "
              f"with weight (k + 1) ** -{setup['skew']})")
        print_table(tiers, ["rows", "row_bytes", "cache_rows", "hit_rate", "disk_requested_bytes",
                            "requested_vs_float32", "disk_bytes", "disk_bytes_vs_float32", "cache_rows_vs_float32",
                            "pcie_bytes", "pcie_vs_float32", "read_s"])
        print("(disk_bytes are whole blocks read with O_DIRECT; disk_requested_bytes the rows' own bytes; pcie_bytes "
              f"the 32-byte sectors a zero-copy GPU gather of the batches would carry, by the model, {PCIE_WINDOW} "
              "rows in flight)")
    json_path, png_path = out / f"{name}.json", out / f"{name}.png"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"system": system_facts(), "args": vars(args), "gather": gathers, "tiers": tiers,
                                     "tiers_setup": setup}, indent=2))
    _plot(gathers, tiers, png_path, where)
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
