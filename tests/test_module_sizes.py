"""Small parts with one job each: no module of the stores, the kernels or the loaders passes 500 lines (a
file that grows past it has taken a second job; split it by job, as kernels/api.py and cpu.py were)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOST_LINES = 500
MODULES = sorted(p for place in ("directload/stores", "kernels", "loaders") for p in (ROOT / place).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_of_the_stores_kernels_or_loaders_passes_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MOST_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by job"


def test_the_walk_finds_the_modules():
    names = {str(p.relative_to(ROOT)) for p in MODULES}
    assert {"kernels/api.py", "directload/stores/base.py", "loaders/pipeline.py", "loaders/dgl/sampler.py"} <= names
