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
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
DGL_VENV=${DIRECTLOAD_VENV:-.venv}
PYG_VENV=${DIRECTLOAD_PYG_VENV:-.venv-pyg}
DOCS_VENV=${DIRECTLOAD_DOCS_VENV:-.venv-docs}
PYG_TORCH=2.12.1  # the newest torch that PyG 2.8.1 lists
SCATTER=2.1.2
SPARSE=0.6.18
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

_stamp() {  # what a lane was set up from: setup.py and this script
    cat setup.py scripts/dev.sh | sha256sum | cut -c1-16
}

_ready() {  # $1 venv, $2 lane: whether it is set up from the current files
    [ -f "$1/.directload-setup" ] && [ "$(cat "$1/.directload-setup")" = "$2-$(_stamp)" ]
}

_venv() {  # $1 venv
    rm -rf "$1"
    "$PY" -m venv "$1"
    "$1/bin/python" -m pip install --quiet --upgrade "pip<26" >/dev/null 2>&1 || true
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

run_tests() {
    echo "== lint =="
    "$DGL_VENV/bin/ruff" check .
    echo "== layers: imports flow one way (import-linter, .importlinter) =="
    _lint_imports
    echo "== types: every public signature hinted, mypy (mypy.ini) =="
    "$DGL_VENV/bin/python" scripts/check_types.py
    echo "== docs: mkdocs build --strict =="
    _build_docs
    echo "== DGL lane (torch 2.2.1): CPU, host emulation, offline compiles, DGL =="
    DIRECTLOAD_LANE=dgl "$DGL_VENV/bin/pytest" "$@"
    echo "== PyG lane (torch $PYG_TORCH): CPU, host emulation, offline compiles, PyG =="
    DIRECTLOAD_LANE=pyg "$PYG_VENV/bin/pytest" "$@"
    echo "== Numba CUDA simulator (PyG lane) =="
    NUMBA_ENABLE_CUDASIM=1 DIRECTLOAD_LANE=pyg "$PYG_VENV/bin/pytest" tests/cudasim "$@"
}

case "${1:-}" in
    main)
        shift
        if [ "${1:-}" = "--pyg" ]; then
            shift
            setup_pyg
            "$PYG_VENV/bin/directload" train --framework pyg "$@"
        else
            setup_dgl
            "$DGL_VENV/bin/directload" train --framework dgl "$@"
        fi
        ;;
    test)
        shift
        setup_dgl
        setup_pyg_sampler
        setup_docs
        run_tests "$@"
        ;;
    *)
        echo "usage: bash scripts/dev.sh main [--pyg] [train options] | test [pytest options]" >&2
        exit 2
        ;;
esac
