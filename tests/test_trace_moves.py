"""scripts/trace_moves.py: the count of moves between the package's files that one batch makes."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "trace_moves.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("trace_moves", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_moves_count_changes_of_file_and_returns_to_files_left(tool):
    steps = ["a.py", "a.py", "b.py", "c.py", "b.py", "b.py", "a.py"]
    assert tool.moves(steps) == (4, 2, ["a.py", "b.py", "c.py"], ["a.py", "b.py", "c.py", "b.py", "a.py"])
    assert tool.moves([]) == (0, 0, [], [])


def test_only_the_packages_files_are_traced(tool):
    assert tool._ours("/x/directload/stores/cache.py") == "directload/stores/cache.py"
    assert tool._ours("/x/kernels/api.py") == "kernels/api.py"
    assert tool._ours("/v/lib/site-packages/torch/nn/functional.py") is None


def test_a_tiered_read_is_traced(tool, capsys):
    assert tool.main(["tiered"]) == 0
    line = capsys.readouterr().out.splitlines()[1].split()
    assert line[0] == "tiered" and int(line[1]) > 0 and int(line[3]) >= 3
    with pytest.raises(SystemExit):
        tool.main(["nonsense"])
