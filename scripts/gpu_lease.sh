#!/usr/bin/env bash
# Run the GPU suite (`directload bench gpu`) on a lent CUDA machine that reaches no package registry.
#
#   scripts/gpu_lease.sh [--quick] [--sections KEY,KEY...] [--keep-report] [--skip-suite]
#
# Sections, most decisive first (benchmarks/gpu_suite.py --plan prints their budgets and the total): e2e, sort,
# tablesize, kernels, tuner, sample, codecs, hotpath.  e2e (the GPU epoch end to end) heads the suite; here it runs
# once PyG's sampler is built, which its PyG configurations need, so the sections that need none go first.
# --quick: every section's smaller sweep (9 minutes in all, setup included); the full suite takes about 20, so
# on a call limited to 10 minutes split it: --sections sort,tablesize,kernels,tuner, then
# --sections codecs,e2e,sample,hotpath --keep-report (which adds to the first call's report).
# The machine's own python3 (its torch, numpy, Numba and CuPy) runs directload, installed with --no-deps.
# What the image lacks travels in .whl/ (git-ignored): wheels of crc32c, liburing, ogb, outdated and
# littleutils, and the sources of torch-scatter and torch-sparse (PyG's sampler), built here, CPU-only,
# against the image's torch, in the background while the sections that need no sampler run.
# LEASE_SECONDS (default 570) is what this call may take; the suite gets what is left of it, less the
# time to collect.  Everything lands under $OUT (default: ./gpu-lease): the log, the report, the results
# folder as a tarball, and the built wheels, so the next run can carry them instead of building again.
set -u -o pipefail
cd "$(dirname "$0")/.."
quick="" suite=1 keep="" sections="e2e,sort,tablesize,kernels,tuner,sample,codecs,hotpath"
while [ $# -gt 0 ]; do
    case $1 in
        --quick) quick=--quick ;;
        --skip-suite) suite=0 ;;
        --keep-report) keep=--keep-report ;;
        --sections) shift; sections=${1:?--sections needs a comma-separated list} ;;
        -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "unknown argument $1"; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-$PWD/gpu-lease}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lease.log") 2>&1
export PYTHONUNBUFFERED=1 OUTDATED_IGNORE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=python3
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( ${LEASE_SECONDS:-570} - ($(date +%s) - t0) - 25 )); }  # 25 s kept to collect

# The sections in the suite's order: those before the sampler is needed, and those after.
early="" late=""
for s in sort tablesize kernels tuner codecs e2e sample hotpath; do
    case ",$sections," in *",$s,"*)
        case $s in e2e|sample|hotpath) late="$late $s" ;; *) early="$early $s" ;; esac ;;
    esac
done

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem \
    --format=csv || exit 1
$PY -c "import sys, torch, numpy, numba; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, 'numpy', numpy.__version__, 'numba', numba.__version__)"
$PY -m pip show numba-cuda cupy-cuda13x 2>/dev/null | grep -E '^(Name|Version)'
nproc; free -g | head -2; cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null

stamp "install"
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
else
    echo "no wheels in .whl/: what the image lacks (crc32c, liburing, ogb, PyG's sampler) stays missing"
fi
$PY -m pip install -q --no-deps --no-build-isolation --use-pep517 --no-index --no-cache-dir -e . || exit 1  # bench finds benchmarks/

# PyG's sampler, CPU-only (the loaders sample on the CPU): built in the background while the early sections run.
build_sampler() {
    if [ "${SKIP_SAMPLER:-0}" = 1 ]; then echo "PyG's sampler not built (SKIP_SAMPLER=1)"; return 0; fi
    if $PY -c "import torch_sparse" 2>/dev/null; then return 0; fi
    mkdir -p "$OUT/wheels"
    for pkg in torch_scatter-2.1.2 torch_sparse-0.6.18; do
        if compgen -G ".whl/$pkg-*.whl" >/dev/null; then continue; fi  # carried: installed above
        # On the upper half of the cores, so the benchmarks running meanwhile keep the rest.
        FORCE_ONLY_CPU=1 MAX_JOBS=$half timeout ${SAMPLER_BUILD_SECONDS:-300} $pin $PY -m pip wheel -q --no-deps \
            --no-build-isolation --no-index -w "$OUT/wheels" ".whl/$pkg.tar.gz" || return 1
        $PY -m pip install -q --no-deps --no-index "$OUT/wheels/$pkg"*.whl || return 1
    done
}
builder="" half=$(( $(nproc) > 1 ? $(nproc) / 2 : 1 )) pin=""
command -v taskset >/dev/null && [ "$(nproc)" -gt 1 ] && pin="taskset -c $half-$(( $(nproc) - 1 ))"
if [ -n "$late" ]; then
    build_sampler > "$OUT/sampler_build.log" 2>&1 &
    builder=$!
fi

stamp "capabilities"
$PY - <<'EOF'
from directload import capabilities as c
print(c.capabilities())
print("cupy:", c._cupy() or "-", " nvrtc:", c._nvrtc() or "-", " numba cuda:", c._numba_cuda(False) or "-")
EOF

suite_exit=0
if [ $suite = 1 ] && [ -n "$early" ]; then
    stamp "directload bench gpu $quick --sections$early"
    directload bench gpu $quick $keep --sections $early --budget-s "$(left)" || suite_exit=$?
    keep=--keep-report  # the late sections add to this report
fi
if [ -n "$builder" ]; then
    stamp "waiting for PyG's sampler build"
    if wait "$builder"; then stamp "sampler built"; else stamp "sampler build failed (tail below)"; tail -20 "$OUT/sampler_build.log"; fi
    $PY -c "import torch_geometric.typing as t; print('PyG sampler: torch_sparse', t.WITH_TORCH_SPARSE)"
fi
if [ $suite = 1 ] && [ -n "$late" ]; then
    stamp "directload bench gpu $quick --sections$late"
    directload bench gpu $quick $keep --sections $late --budget-s "$(left)" || suite_exit=$?
fi
[ $suite = 1 ] && echo "suite exit $suite_exit"

stamp "collect"
tar czf "$OUT/results.tgz" benchmarks/results data/*.json 2>/dev/null || tar czf "$OUT/results.tgz" benchmarks/results
[ -f benchmarks/results/gpu_report.md ] && cp benchmarks/results/gpu_report.md "$OUT/"
stamp "done"
exit $suite_exit
