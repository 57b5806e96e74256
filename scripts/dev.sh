#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash scripts/dev.sh main   set up .venv, then run the main job on a generated default
#   bash scripts/dev.sh test   set up .venv, then run the test lanes
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=${DIRECTLOAD_VENV:-.venv}
export DGLBACKEND=pytorch

setup() {
    local stamp="$VENV/.directload-setup"
    local want
    want=$(sha256sum setup.py | cut -c1-16)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    echo "== setting up $VENV (about 3 minutes, 5.5 GB) =="
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade "pip<26" >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install --quiet -e ".[dev,io]"
    "$VENV/bin/python" -m pip check
    echo "$want" > "$stamp"
}

run_tests() {
    echo "== lint =="
    "$VENV/bin/ruff" check .
    echo "== tests (CPU, host emulation, offline compiles) =="
    "$VENV/bin/pytest" "$@"
    echo "== tests (Numba CUDA simulator lane) =="
    NUMBA_ENABLE_CUDASIM=1 "$VENV/bin/pytest" tests/cudasim "$@"
}

case "${1:-}" in
    main)
        shift
        setup
        "$VENV/bin/directload" train "$@"
        ;;
    test)
        shift
        setup
        run_tests "$@"
        ;;
    *)
        echo "usage: bash scripts/dev.sh main|test [args]" >&2
        exit 2
        ;;
esac
