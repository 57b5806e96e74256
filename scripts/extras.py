"""An extra's requirements, read from ``setup.py`` without running it or installing the package.

``scripts/dev.sh`` installs the ``docs`` extra into ``.venv-docs`` without directload and its torch
(mkdocstrings reads the code without importing it), so the list keeps its one home in ``setup.py``.

    python scripts/extras.py docs    # the docs extra's requirements, one a line
"""

import ast
import sys
from pathlib import Path

SETUP_PY = Path(__file__).resolve().parent.parent / "setup.py"


def setup_keyword(name, setup_py=SETUP_PY):
    """The AST node of keyword ``name`` of the ``setup(...)`` call in ``setup_py``."""
    tree = ast.parse(Path(setup_py).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            for kw in node.keywords:
                if kw.arg == name:
                    return kw.value
    raise ValueError(f"{setup_py}: setup() has no {name}= keyword")


def extra(name, setup_py=SETUP_PY):
    """The requirements of extra ``name`` (a literal list in ``extras_require``)."""
    table = setup_keyword("extras_require", setup_py)
    for key, value in zip(table.keys, table.values):
        if isinstance(key, ast.Constant) and key.value == name:
            return ast.literal_eval(value)
    raise ValueError(f"{setup_py}: extras_require has no {name!r} extra")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/extras.py EXTRA")
    print("\n".join(extra(sys.argv[1])))
