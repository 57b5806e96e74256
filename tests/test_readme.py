"""Every Python snippet in the README runs as written, on this machine, in a fresh interpreter."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 3


def _needs(code):
    """The framework a snippet imports, if this lane lacks it."""
    from conftest import HAS_DGL, HAS_PYG

    if re.search(r"^\s*(import dgl|from dgl\b|from directload\.loaders(\.dgl)? import DataLoader)", code, re.M) \
            and not HAS_DGL:
        return "DGL"
    if re.search(r"torch_geometric|directload\.loaders\.pyg", code) and not HAS_PYG:
        return "PyG"
    return None


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_snippet_runs_as_written(code, tmp_path):
    if _needs(code):
        pytest.skip(f"a {_needs(code)} snippet: it runs in the {_needs(code)} lane")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          encoding="utf-8", errors="replace", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
