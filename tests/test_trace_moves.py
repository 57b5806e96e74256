"""scripts/trace_moves.py: the count of moves between the package's files that one batch makes."""


import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def tool():
    return load_script("trace_moves")


def test_moves_count_changes_of_file_and_returns_to_files_left(tool):
    steps = ["a.py", "a.py", "b.py", "c.py", "b.py", "b.py", "a.py"]
    assert tool.moves(steps) == (4, 2, ["a.py", "b.py", "c.py"], ["a.py", "b.py", "c.py", "b.py", "a.py"])
    assert tool.moves([]) == (0, 0, [], [])


def test_call_edges_count_calls_across_files_and_those_back_into_the_stack(tool):
    calls = {1: [("a.py", "b.py", False), ("b.py", "a.py", True)], 2: [("c.py", "b.py", False)]}
    assert tool.call_edges(calls) == (3, 1)
    assert tool.call_edges({}) == (0, 0)


def test_a_call_back_into_a_file_on_the_stack_is_a_back_edge(tool, tmp_path, monkeypatch):
    # three real files of a package named like ours: a calls b, b calls back into a, then c
    pkg = tmp_path / "directload"
    pkg.mkdir()
    (pkg / "a.py").write_text("def top(b):\n    return b.mid()\n\ndef leaf():\n    return 1\n")
    (pkg / "b.py").write_text("def mid():\n    from directload_t import a, c\n    return a.leaf() + c.end()\n")
    (pkg / "c.py").write_text("def end():\n    return 2\n")
    import importlib.util as iu
    mods = {}
    for name in ("a", "b", "c"):
        spec = iu.spec_from_file_location(f"directload_t.{name}", pkg / f"{name}.py")
        mods[name] = iu.module_from_spec(spec)
        spec.loader.exec_module(mods[name])
    fake = type("M", (), mods)
    monkeypatch.setitem(__import__("sys").modules, "directload_t", fake)
    with tool.Tracer() as tracer:
        assert tracer.record(lambda: mods["a"].top(mods["b"])) is None
    calls = [c for cs in tracer.calls.values() for c in cs]
    assert calls == [("directload/a.py", "directload/b.py", False), ("directload/b.py", "directload/a.py", True),
                     ("directload/b.py", "directload/c.py", False)]


def test_only_the_packages_files_are_traced(tool):
    assert tool._ours("/x/directload/stores/cache.py") == "directload/stores/cache.py"
    assert tool._ours("/x/kernels/api.py") == "kernels/api.py"
    assert tool._ours("/v/lib/site-packages/torch/nn/functional.py") is None


def test_a_tiered_read_is_traced(tool, capsys):
    assert tool.main(["tiered"]) == 0
    line = capsys.readouterr().out.splitlines()[1].split()
    assert line[0] == "tiered" and int(line[1]) > 0 and int(line[3]) >= 3
    assert int(line[5]) > 0 and 0 <= int(line[6]) <= int(line[5])  # calls across files, and back
    with pytest.raises(SystemExit):
        tool.main(["nonsense"])
