"""The house: imports flow one way, and production code never imports test machinery (import-linter)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "lint_imports.py"

pytestmark = pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
                                reason="import-linter is in the dev extra")


def _check(tree):
    return subprocess.run([sys.executable, str(SCRIPT), "--tree", str(tree)], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=300)


def _copy(tmp_path):
    tree = tmp_path / "tree"
    for name in ("directload", "kernels", "loaders", ".importlinter"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tree / name if src.is_dir() else tree)
    return tree


def test_every_contract_is_kept():
    proc = _check(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    contracts = (ROOT / ".importlinter").read_text().count("[importlinter:contract:")
    assert contracts >= 5 and f"{contracts} kept, 0 broken" in proc.stdout  # every one of them checked


@pytest.mark.parametrize("module, line, broken", [
    ("directload/capabilities.py", "import directload.loaders  # wrong way\n", "Imports flow one way"),
    ("kernels/api.py", "from directload.unified import to_unified  # wrong way\n", "Imports flow one way"),
    ("directload/stores/base.py", "from directload.kernels import host_emu  # test machinery\n",
     "never imports test machinery"),
    ("kernels/cpu.py", "from unittest import mock  # test machinery\n", "never imports test machinery"),
    # siblings declared independent
    ("directload/npy.py", "from directload import atomic  # a sibling\n", "Imports flow one way"),
    ("directload/stores/base.py", "import directload.datasets  # a sibling\n", "Imports flow one way"),
    ("directload/memory.py", "import directload.placement  # a sibling\n", "Imports flow one way"),
    # a framework's side never imports the harness that loads it by name (the cycle that was)
    ("directload/harness/train_dgl.py", "import directload.harness.train  # upward\n", "The harness in its own order"),
    ("directload/harness/train_inputs.py", "import directload.harness.train_pyg  # upward\n",
     "The harness in its own order"),
    ("directload/harness/train_dgl.py", "from directload.harness import train_pyg  # a sibling\n",
     "The harness in its own order"),
    ("directload/stores/cache.py", "import directload.harness.cli  # the library never imports the harness\n",
     "Imports flow one way"),
    ("directload/buffers.py", "import directload.unified  # a sibling\n", "Imports flow one way"),
])
def test_a_wrong_way_import_fails_the_check(tmp_path, module, line, broken):
    tree = _copy(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + "\n" + line)
    proc = _check(tree)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout
    assert broken in proc.stdout
