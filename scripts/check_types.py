"""Check the public type hints: every public signature has them, and mypy (``mypy.ini``) finds them sound.

A public signature is a function or method whose name has no leading underscore (``__init__`` included), in
a module or class of the package whose name has none, outside the test machinery: each of its parameters
(but ``self`` and ``cls``) and its return (but ``__init__``'s) must carry a hint.  mypy then checks the
package laid out as installed (kernels/ and loaders/ inside directload/, as scripts/lint_imports.py does).
Exit status 0 when both pass.  ``--missing`` lists the signatures without hints and stops there.
"""

import argparse
import ast
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lint_imports import installed_layout  # noqa: E402

ROOTS = ("directload", "kernels", "loaders")
MACHINERY = ("host_emu", "emu_")  # test machinery (host emulation): not public API


def _public_path(path):
    return not any(part.startswith("_") and part not in ("__init__.py", "__main__.py") for part in path.parts) \
        and not any(mark in path.name for mark in MACHINERY)


def missing_hints(source, name="<source>"):
    """``name:line qualified.name`` of each public function or method in ``source`` lacking a hint.

    Examples
    --------
    >>> missing_hints("def f(a: int) -> int: ...\\ndef g(a): ...\\nclass C:\\n    def m(self) -> None: ...\\n")
    ['<source>:2 g']
    """
    out = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                a = node.args
                params = [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                params += [p for p in (a.vararg, a.kwarg) if p is not None]
                if any(p.annotation is None for p in params) or (node.returns is None and node.name != "__init__"):
                    out.append(f"{name}:{node.lineno} {prefix}{node.name}")
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return out


def all_missing(tree):
    """Every public signature of the checkout ``tree`` lacking a hint."""
    found = []
    for root in ROOTS:
        for path in sorted((Path(tree) / root).rglob("*.py")):
            rel = path.relative_to(tree)
            if _public_path(rel):
                found += missing_hints(path.read_text(), str(rel))
    return found


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent), help="the checkout to check")
    p.add_argument("--missing", action="store_true", help="only list the public signatures without hints")
    args = p.parse_args(argv)
    tree = Path(args.tree).resolve()
    missing = all_missing(tree)
    for line in missing:
        print(f"no type hints: {line}")
    if args.missing or missing:
        print(f"{len(missing)} public signatures without type hints")
        return 1 if missing else 0
    tool = Path(sys.executable).with_name("mypy")
    with tempfile.TemporaryDirectory() as tmp:
        installed_layout(tree, tmp)
        return subprocess.call([str(tool), "--config-file", str(tree / "mypy.ini"), "--no-incremental",
                                "-p", "directload"], cwd=tmp,
                               env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


if __name__ == "__main__":
    sys.exit(main())
