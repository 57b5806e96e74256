"""MkDocs hook: give the API reference the sources laid out as installed, so it finds every package.

``setup.py`` installs ``kernels/`` as ``directload.kernels`` and ``loaders/`` as ``directload.loaders``.
mkdocstrings reads the code by static analysis (griffe) and imports nothing, so it needs a directory in
which ``directload/kernels`` exists.  This hook makes that copy in a temporary directory per build, with
the same function the import linter uses (``scripts/lint_imports.py``), and puts it first on the Python
handler's search paths.
"""

import shutil
import sys
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lint_imports import installed_layout  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
_PREFIX = "directload-docs-src-"
_trees = []


@event_priority(100)  # before mkdocstrings sets up its handlers
def on_config(config):
    tree = tempfile.mkdtemp(prefix=_PREFIX)
    _trees.append(tree)
    installed_layout(ROOT, tree)
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [tree, *[p for p in python.get("paths", []) if _PREFIX not in p]]
    return config


def on_shutdown():
    while _trees:
        shutil.rmtree(_trees.pop(), ignore_errors=True)
