#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash scripts/dev.sh main [--pyg] [train options]  set up a lane, then train on a generated dataset
#   bash scripts/dev.sh test [pytest options]         set up both lanes and the docs tools, then lint, build the
#                                                     docs (mkdocs build --strict) and run every test lane
#
# Two lanes, because DGL's last wheels load only on torch 2.2.1 and PyG 2.8 wants torch 2.9-2.12:
#   .venv      the DGL lane: torch 2.2.1, numpy 1, CUDA 12 packages   (pip install -e .[dgl,cuda12,io,dev])
#   .venv-pyg  the PyG lane: torch 2.12.1, numpy 2, CUDA 13 packages  (pip install -e .[pyg,cuda13,io,dev]);
#              nothing compiles (directload's sampler runs), and `test` adds PyG's own sampler (torch-sparse,
#              built from source) to compare with
# and the docs tools, without directload (mkdocstrings reads the code without importing it):
#   .venv-docs MkDocs, Material and mkdocstrings                      (the docs extra's requirements)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-python3.11}
DGL_VENV=${DIRECTLOAD_VENV:-.venv}
PYG_VENV=${DIRECTLOAD_PYG_VENV:-.venv-pyg}
DOCS_VENV=${DIRECTLOAD_DOCS_VENV:-.venv-docs}
PYG_TORCH=2.12.1  # the newest torch that PyG 2.8.1 lists
SCATTER=2.1.2
SPARSE=0.6.18
MAIN_SEEDS=3  # dev.sh main's runs per loader, each loader in turn within each (see main below)
# torch-scatter and torch-sparse are published as source only and must be built against the installed
# torch. pip's own wheel cache ignores the torch version (it would hand back a wheel built against another
# torch), so it is bypassed (--no-cache-dir) and the built wheels live in a wheelhouse per torch version
# (outside the checkout, so clean clones reuse them).
WHEELHOUSE=${DIRECTLOAD_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/directload/wheelhouse}
export DGLBACKEND=pytorch
# torch's OpenMP threads (libgomp) spin 10,000 rounds before they sleep while they wait, not libgomp's
# default 300,000 (about 3 ms): on a busy machine the spinning took the cores from each other (a GraphSAGE
# epoch beside two busy processes on 2 cores: a median 3.1-3.6x its quiet time with either loader, 3 runs
# in 10 at about 6x, against 1.8-2.0x; the same quiet). Left alone where either variable is set.
if [ -z "${GOMP_SPINCOUNT:-}" ] && [ -z "${OMP_WAIT_POLICY:-}" ]; then
    export GOMP_SPINCOUNT=10000
fi

_stamp() {  # what a lane was set up from: setup.py and this script's setup steps (a change elsewhere in it, to
            # how the tests run, say, sets nothing up again)
    { cat setup.py; echo "$PY $PYG_TORCH $SCATTER $SPARSE"
      declare -f _venv setup_dgl _build_sampler_wheels setup_pyg setup_pyg_sampler setup_docs
    } | sha256sum | cut -c1-16
}

_ready() {  # $1 venv, $2 lane: whether it is set up from the current files
    [ -f "$1/.directload-setup" ] && [ "$(cat "$1/.directload-setup")" = "$2-$(_stamp)" ]
}

_venv() {  # $1 venv
    rm -rf "$1"
    "$PY" -m venv "$1"
    "$1/bin/python" -m pip install --quiet --upgrade "pip<26" >/dev/null 2>&1 || true
}

_kernels_stamp() {  # $1 venv: what Numba's on-disk cache of the CPU kernels is checked against (each kernel
                   # source's size and modification time: Numba's own check), the lane's Numba and where the
                   # cache is
    { stat -c '%n %s %Y' kernels/*.py; echo "${NUMBA_CACHE_DIR:-}"
      "$1/bin/python" -c 'import numba; print(numba.__version__)'; } | sha256sum | cut -c1-16
}

compile_kernels() {  # $1 venv: directload's CPU kernels (the sampler, the row gathers) compiled into Numba's
                     # on-disk cache, once, so that no first epoch pays for it; again when a kernel source changes.
                     # The stamp lies in the cache's own directory: a cache deleted takes its stamp with it.
    local stamp mark
    stamp=$(_kernels_stamp "$1")
    mark="${NUMBA_CACHE_DIR:-kernels/__pycache__}/.directload-compiled-$(basename "$1")"
    [ "$(cat "$mark" 2>/dev/null)" = "$stamp" ] && return
    echo "== compiling directload's CPU kernels once, into Numba's cache (about a minute on 2 cores; every later"
    echo "   run loads them from there) =="
    "$1/bin/python" -m directload.kernels.warm
    mkdir -p "$(dirname "$mark")"
    echo "$stamp" > "$mark"
}

setup_dgl() {
    _ready "$DGL_VENV" dgl && return
    echo "== setting up $DGL_VENV, the DGL lane: torch 2.2.1 (about 3 minutes, 5.5 GB) =="
    _venv "$DGL_VENV"
    "$DGL_VENV/bin/python" -m pip install --quiet -e ".[dgl,cuda12,io,dev]"
    "$DGL_VENV/bin/python" -m pip check
    echo "dgl-$(_stamp)" > "$DGL_VENV/.directload-setup"
}

_build_sampler_wheels() {  # $1 venv: build (once per torch version) and print the wheelhouse
    local venv=$1 tag wh cfg
    tag=$("$venv/bin/python" -c 'import sys, torch; print("torch-" + torch.__version__.replace("+", "-") + f"-cp{sys.version_info.major}{sys.version_info.minor}")')
    wh="$WHEELHOUSE/$tag"
    mkdir -p "$wh"
    if ! compgen -G "$wh/torch_scatter-$SCATTER-*.whl" >/dev/null; then
        echo "   building torch-scatter $SCATTER against $tag (about 2 minutes)" >&2
        cfg=$(mktemp)
        printf '[build_ext]\nparallel = 2\n' > "$cfg"  # two compile jobs; this breaks torch-sparse's build
        CFLAGS=-g0 DIST_EXTRA_CONFIG="$cfg" "$venv/bin/python" -m pip wheel --quiet --no-deps --no-cache-dir \
            --no-build-isolation "torch-scatter==$SCATTER" -w "$wh" >&2
        rm -f "$cfg"
    fi
    if ! compgen -G "$wh/torch_sparse-$SPARSE-*.whl" >/dev/null; then
        echo "   building torch-sparse $SPARSE against $tag (about 6 minutes)" >&2
        CFLAGS=-g0 "$venv/bin/python" -m pip wheel --quiet --no-deps --no-cache-dir --no-build-isolation \
            "torch-sparse==$SPARSE" -w "$wh" >&2
    fi
    echo "$wh"
}

setup_pyg() {  # the PyG lane as a user installs it: directload[pyg] and nothing to compile
    _ready "$PYG_VENV" pyg && return
    echo "== setting up $PYG_VENV, the PyG lane: torch $PYG_TORCH (about 3 minutes; nothing compiles:"
    echo "   directload's sampler runs where PyG has none) =="
    _venv "$PYG_VENV"
    "$PYG_VENV/bin/python" -m pip install --quiet "torch==$PYG_TORCH" "numpy>=2" -e ".[pyg,cuda13,io,dev]"
    "$PYG_VENV/bin/python" -m pip check
    rm -f "$PYG_VENV/.directload-pyg-sampler"
    echo "pyg-$(_stamp)" > "$PYG_VENV/.directload-setup"
}

setup_pyg_sampler() {  # the test lane adds PyG's own sampler, to compare directload's batches with PyG's
    setup_pyg
    [ "$(cat "$PYG_VENV/.directload-pyg-sampler" 2>/dev/null)" = "pyg-sampler-$(_stamp)" ] && return
    echo "== adding PyG's own sampler to $PYG_VENV: torch-scatter and torch-sparse compile from source"
    echo "   (about 8 minutes the first time, kept in a wheelhouse per torch version after) =="
    "$PYG_VENV/bin/python" -m pip install --quiet wheel ninja setuptools
    local wh
    wh=$(_build_sampler_wheels "$PYG_VENV")
    "$PYG_VENV/bin/python" -m pip install --quiet --no-index --find-links "$wh" "torch-scatter==$SCATTER" \
        "torch-sparse==$SPARSE"
    "$PYG_VENV/bin/python" -m pip check
    "$PYG_VENV/bin/python" -c "import sys, torch_geometric.typing as t; \
sys.exit(0 if t.WITH_TORCH_SPARSE else 'torch_sparse does not load: PyG cannot sample')"
    echo "pyg-sampler-$(_stamp)" > "$PYG_VENV/.directload-pyg-sampler"
}

setup_docs() {
    _ready "$DOCS_VENV" docs && return
    echo "== setting up $DOCS_VENV, the docs tools: MkDocs, Material, mkdocstrings (under a minute) =="
    _venv "$DOCS_VENV"
    local reqs
    mapfile -t reqs < <("$PY" scripts/extras.py docs)
    "$DOCS_VENV/bin/python" -m pip install --quiet "${reqs[@]}"
    "$DOCS_VENV/bin/python" -m pip check
    echo "docs-$(_stamp)" > "$DOCS_VENV/.directload-setup"
}

_build_docs() {  # the site into a temporary directory, removed however the build ends; strict: any warning fails
    local site status=0
    site=$(mktemp -d)
    NO_MKDOCS_2_WARNING=1 "$DOCS_VENV/bin/mkdocs" build --strict --site-dir "$site" || status=$?
    rm -rf "$site"
    return "$status"
}

_lint_imports() {  # import-linter on a copy of the tree laid out as installed (kernels/, loaders/ inside)
    "$DGL_VENV/bin/python" scripts/lint_imports.py
}

# Each stage's time, printed when the script ends, however it ends (a failed stage is named as such).
_STAGES=()
_STAGE=""
_STAGE_T0=""

_seconds_since() {  # $1 an $EPOCHREALTIME: seconds since, to a tenth
    awk -v t0="$1" -v t1="$EPOCHREALTIME" 'BEGIN { printf "%.1f", t1 - t0 }'
}

_end_stage() {  # $1 what became of the stage now running, if one is
    if [ -n "$_STAGE" ]; then
        _STAGES+=("$(_seconds_since "$_STAGE_T0")|$_STAGE|$1")
    fi
    _STAGE=""
}

stage() {  # $1 the stage that starts now (the one before it ended well)
    _end_stage ok
    _STAGE=$1
    _STAGE_T0=$EPOCHREALTIME
}

_print_stages() {  # $1 the script's exit status
    local status=$1 row secs what how
    if [ "$status" = 0 ]; then
        _end_stage ok
    else
        _end_stage "failed (exit status $status)"
    fi
    if [ "${#_STAGES[@]}" = 0 ]; then
        return 0
    fi
    echo "== time per stage =="
    for row in "${_STAGES[@]}"; do
        IFS='|' read -r secs what how <<< "$row"
        printf '  %8s s  %-58s %s\n' "$secs" "$what" "$([ "$how" = ok ] || echo "$how")"
    done
    printf '  %8s s  %s\n' "$(_seconds_since "$_T0")" "in all"
}

_timed() {  # $1 a file, $2 a stage's name, then a command: run it, append "seconds|name|how" to the file; its status
    local into=$1 what=$2 t0 status=0
    shift 2
    t0=$EPOCHREALTIME
    "$@" || status=$?
    echo "$(_seconds_since "$t0")|$what|$([ "$status" = 0 ] && echo ok || echo "failed (exit status $status)")" \
        >> "$into"
    return "$status"
}

_pyg_lanes() {  # $1 the stage file, then pytest's options: the PyG lane, then (if it passed) the simulator
    local into=$1
    shift
    echo "== PyG lane (torch $PYG_TORCH): CPU, host emulation, offline compiles, PyG =="
    _timed "$into" "PyG lane (torch $PYG_TORCH), beside the DGL lane" \
        env DIRECTLOAD_LANE=pyg "$PYG_VENV/bin/pytest" --durations=60 "$@" || return
    echo "== Numba CUDA simulator (PyG lane) =="
    _timed "$into" "Numba CUDA simulator (PyG lane), beside the DGL lane" \
        env NUMBA_ENABLE_CUDASIM=1 DIRECTLOAD_LANE=pyg "$PYG_VENV/bin/pytest" tests/cudasim "$@"
}

_PYG_JOB=""

_stop_pyg_lanes() {  # the PyG lanes' process group, if it still runs (the script ends early: a signal, a failure)
    if [ -n "$_PYG_JOB" ]; then
        kill -TERM -- "-$_PYG_JOB" 2>/dev/null || true
        wait "$_PYG_JOB" 2>/dev/null || true
        _PYG_JOB=""
    fi
}

run_tests() {
    stage "lint (ruff)"
    echo "== lint =="
    "$DGL_VENV/bin/ruff" check .
    stage "layers (import-linter)"
    echo "== layers: imports flow one way (import-linter, .importlinter) =="
    _lint_imports
    stage "types (mypy)"
    echo "== types: every public signature hinted, mypy (mypy.ini) =="
    "$DGL_VENV/bin/python" scripts/check_types.py
    stage "docs (mkdocs build --strict)"
    echo "== docs: mkdocs build --strict =="
    _build_docs
    _end_stage ok
    # The two lanes run side by side, each in its own virtual environment: one lane leaves the cores idle much
    # of the time (processes starting, waits), so the two together take little longer than the longer one.
    # The PyG lane's output (then the simulator's) is kept and shown after the DGL lane's.
    local pyg_out pyg_times dgl_status=0 pyg_status=0
    pyg_out=$(mktemp)
    pyg_times=$(mktemp)
    set -m  # the PyG lanes in a process group of their own, which _stop_pyg_lanes ends if the script ends first
    _pyg_lanes "$pyg_times" "$@" > "$pyg_out" 2>&1 &
    _PYG_JOB=$!
    set +m
    echo "== DGL lane (torch 2.2.1): CPU, host emulation, offline compiles, DGL; the PyG lane runs beside it =="
    stage "DGL lane (torch 2.2.1), beside the PyG lane"
    DIRECTLOAD_LANE=dgl "$DGL_VENV/bin/pytest" --durations=60 "$@" || dgl_status=$?  # each lane lists its slowest 60
    _end_stage "$([ "$dgl_status" = 0 ] && echo ok || echo "failed (exit status $dgl_status)")"
    wait "$_PYG_JOB" || pyg_status=$?
    _PYG_JOB=""
    cat "$pyg_out"
    mapfile -t -O "${#_STAGES[@]}" _STAGES < "$pyg_times"
    rm -f "$pyg_out" "$pyg_times"
    [ "$dgl_status" = 0 ] || return "$dgl_status"
    return "$pyg_status"
}

_T0=$EPOCHREALTIME
# Sourced (the tests do), it only defines the above.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case "${1:-}" in
    main)
        shift
        # Three seeds, each loader in turn within each, so the report's ratio (the median per-seed ratio of
        # steady epochs) comes with its spread; a --seeds given after main wins.
        if [ "${1:-}" = "--pyg" ]; then
            shift
            setup_pyg
            compile_kernels "$PYG_VENV"
            "$PYG_VENV/bin/directload" train --framework pyg --seeds "$MAIN_SEEDS" "$@"
        else
            setup_dgl
            compile_kernels "$DGL_VENV"
            "$DGL_VENV/bin/directload" train --framework dgl --seeds "$MAIN_SEEDS" "$@"
        fi
        ;;
    test)
        shift
        trap 'status=$?; _stop_pyg_lanes; _print_stages "$status"' EXIT
        trap 'exit 130' INT  # so the table names the stage a Ctrl-C stopped (an EXIT trap alone sees status 0)
        trap 'exit 143' TERM
        stage "setup: $DGL_VENV, the DGL lane"
        setup_dgl
        stage "setup: $PYG_VENV, the PyG lane, with PyG's own sampler"
        setup_pyg_sampler
        stage "setup: $DOCS_VENV, the docs tools"
        setup_docs
        stage "setup: directload's CPU kernels into Numba's cache"
        compile_kernels "$DGL_VENV"
        compile_kernels "$PYG_VENV"
        run_tests "$@"
        ;;
    *)
        echo "usage: bash scripts/dev.sh main [--pyg] [train options] | test [pytest options]" >&2
        exit 2
        ;;
esac
