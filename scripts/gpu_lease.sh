#!/usr/bin/env bash
# Run the GPU suite (`directload bench gpu`) on a lent CUDA machine that reaches no package registry.
#
#   scripts/gpu_lease.sh [--quick] [--skip-suite]
#
# The machine's own python3 (its torch, numpy, Numba and CuPy) runs directload, installed with --no-deps.
# What the image lacks travels in .whl/ (git-ignored): wheels of crc32c, liburing, ogb, outdated and
# littleutils, and the sources of torch-scatter and torch-sparse (PyG's sampler), which are built here,
# CPU-only, against the image's torch (or installed from wheels an earlier run left in .whl/).
# Everything it writes lands under $OUT (default: ./gpu-lease): the log, the results folder as a tarball,
# and the built wheels, so the next run can carry them instead of building again.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-lease}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lease.log") 2>&1
quick="" suite=1
for a in "$@"; do
    case $a in
        --quick) quick=--quick ;;
        --skip-suite) suite=0 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "unknown argument $a"; exit 2 ;;
    esac
done
export PYTHONUNBUFFERED=1 OUTDATED_IGNORE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=python3
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || exit 1
$PY -c "import sys, torch, numpy, numba; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, 'numpy', numpy.__version__, 'numba', numba.__version__)"
$PY -m pip show numba-cuda cupy-cuda13x 2>/dev/null | grep -E '^(Name|Version)'
nproc; free -g | head -2

stamp "install"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
$PY -m pip install -q --no-deps --no-build-isolation --use-pep517 --no-index --no-cache-dir -e . || exit 1  # bench finds benchmarks/

# PyG's sampler, CPU-only (the loaders sample on the CPU): built in the background while the tests run.
build_sampler() {
    if [ "${SKIP_SAMPLER:-0}" = 1 ]; then echo "PyG's sampler not built (SKIP_SAMPLER=1)"; return 0; fi
    if $PY -c "import torch_sparse" 2>/dev/null; then return 0; fi
    if compgen -G ".whl/torch_sparse-*.whl" >/dev/null; then return 0; fi  # carried: installed above
    mkdir -p "$OUT/wheels"
    for pkg in torch_scatter-2.1.2 torch_sparse-0.6.18; do
        if compgen -G ".whl/$pkg-*.whl" >/dev/null; then continue; fi  # carried: installed above
        FORCE_ONLY_CPU=1 MAX_JOBS=$(nproc) timeout ${SAMPLER_BUILD_SECONDS:-300} $PY -m pip wheel -q --no-deps --no-build-isolation --no-index \
            -w "$OUT/wheels" ".whl/$pkg.tar.gz" || return 1
        $PY -m pip install -q --no-deps --no-index "$OUT/wheels/$pkg"*.whl || return 1
    done
}
build_sampler > "$OUT/sampler_build.log" 2>&1 &
builder=$!

stamp "capabilities"
$PY - <<'EOF'
from directload import capabilities as c
print(c.capabilities())
print("cupy:", c._cupy() or "-", " nvrtc:", c._nvrtc() or "-", " numba cuda:", c._numba_cuda(False) or "-")
EOF

stamp "waiting for PyG's sampler build"
if wait $builder; then stamp "sampler built"; else stamp "sampler build failed (tail below)"; tail -20 "$OUT/sampler_build.log"; fi
$PY -c "import torch_geometric.typing as t; print('PyG sampler: torch_sparse', t.WITH_TORCH_SPARSE)"

if [ $suite = 1 ]; then
    stamp "directload bench gpu $quick"
    left=$(( ${LEASE_SECONDS:-570} - ($(date +%s) - t0) ))  # what the call has left, so the tarball still comes back
    timeout $left directload bench gpu $quick
    echo "suite exit $?"
fi
stamp "collect"
tar czf "$OUT/results.tgz" benchmarks/results data/*.json 2>/dev/null || tar czf "$OUT/results.tgz" benchmarks/results
[ -f benchmarks/results/gpu_report.md ] && cp benchmarks/results/gpu_report.md "$OUT/"
stamp "done"
