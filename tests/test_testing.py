"""``directload.testing``: the store contract suite a plug-in's tests subclass.  The stores guide's three-line
plug-in runs it as written; the suite itself is never collected, needs no pytest, catches a store that breaks
the contract, and production code never imports it."""

import io
import re
import shutil
import subprocess
import sys
import types
import unittest
from pathlib import Path

import pytest
import torch

from directload.stores import FeatureStore, TensorStore, WrapperStore
from directload.testing import StoreContract

ROOT = Path(__file__).resolve().parent.parent


def _run(case):
    """``case``'s tests run by unittest: the result."""
    return unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(case))


def _contract_tests():
    return unittest.defaultTestLoader.getTestCaseNames(StoreContract)


def test_the_guides_plug_in_runs_the_whole_suite_as_written():
    guide = (ROOT / "docs" / "guides" / "stores.md").read_text(encoding="utf-8")
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "directload.testing" in b]
    assert snippet.count("\n", snippet.index("class TestDictRows")) == 3  # the contract, in three lines
    module = types.ModuleType("plug_in")
    exec(compile(snippet, "stores.md", "exec"), module.__dict__)
    result = _run(module.TestDictRows)
    assert result.wasSuccessful(), result.failures + result.errors
    assert result.testsRun == len(_contract_tests()) > 15 and not result.skipped


def test_the_suite_itself_is_skipped_and_its_subclasses_collected():
    class TestTensor(StoreContract):
        def make(self, table, directory):
            return TensorStore(table)

    assert StoreContract.__test__ is False and TestTensor.__test__ is True  # pytest's mark
    result = _run(StoreContract)  # python -m unittest finds it in a module that imports it
    assert result.wasSuccessful() and result.testsRun == 0 and len(result.skipped) == 1


def test_importing_it_needs_no_pytest_and_directload_never_imports_it():
    code = ("import sys, directload, directload.stores, directload.loaders; assert 'directload.testing' not in "
            "sys.modules; import directload.testing; print('pytest' in sys.modules, '_pytest' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8", timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "False"], proc.stderr[-2000:]


class _StatsOfItsOwnOnly(WrapperStore):
    """A composite that reports its own counters without its children's: not the contract."""

    def stats(self):
        return FeatureStore.stats(TensorStore(torch.zeros(1, 1)))


class _WarmDeclaredNotDone(WrapperStore):
    @property
    def capabilities(self):
        return frozenset({"stage", "warm"})


@pytest.mark.parametrize("store, test", [
    (_StatsOfItsOwnOnly, "test_stats_are_the_stores_own_counters_and_its_childrens"),
    (_WarmDeclaredNotDone, "test_capabilities_are_declared_and_true"),
])
def test_a_store_that_breaks_the_contract_fails_the_suite(store, test):
    class TestBroken(StoreContract):
        def make(self, table, directory):
            return store(TensorStore(table), own=True)

    result = _run(TestBroken)
    failed = {case._testMethodName for case, _ in result.failures + result.errors}
    assert failed == {test}


@pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
                    reason="import-linter is in the dev extra")
def test_production_code_importing_the_suite_fails_the_layer_check(tmp_path):
    from test_layers import _check, _copy

    tree = _copy(tmp_path)
    target = tree / "directload" / "stores" / "cache.py"
    target.write_text(target.read_text() + "\nimport directload.testing  # test machinery\n")
    proc = _check(tree)
    assert proc.returncode != 0 and "never imports test machinery" in proc.stdout
