"""Every public module's docstring examples run, and every public class shows one.

Each module is its own test case.  The examples are documentation (STYLE: "Numpydoc docstrings with a
runnable Example"), so they must run as written: on the CPU, in well under a second, writing only
under a temporary directory.
"""

import doctest
import importlib
import io
import pkgutil
from pathlib import Path

import pytest
from conftest import HAS_DGL, HAS_PYG

import directload
import directload.kernels
import directload.loaders

#: The training harness (the command line, training, experiments, the memory cap, plots), not library API:
#: the package directload.harness, and those modules where they lay at the top level before it.
_HARNESS = {"harness", "cli", "train", "experiments", "memcap", "plotting", "__main__"}
#: Test machinery that production code never imports.
_MACHINERY = {"directload.kernels.host_emu", "directload.kernels.host_emu_sample"}
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _walk(name, paths):
    """``name`` and the modules below it, found on disk without importing them."""
    yield name
    for info in pkgutil.iter_modules(paths):
        sub = f"{name}.{info.name}"
        if info.ispkg:
            yield from _walk(sub, [str(Path(info.module_finder.path) / info.name)])
        else:
            yield sub


def _public(name):
    parts = name.split(".")
    if any(p.startswith("_") for p in parts):
        return False
    if parts[1:] and (parts[1] in _HARNESS or parts[1].startswith("train")):
        return False
    return name not in _MACHINERY


# kernels/ and loaders/ install as directload.kernels and directload.loaders (setup.py's package_dir),
# so each of the three is walked from its own directory.
MODULES = sorted({m for pkg in (directload, directload.kernels, directload.loaders)
                  for m in _walk(pkg.__name__, pkg.__path__) if _public(m)})


def _load(name):
    """The module, or a skip naming the framework this lane lacks."""
    if name.startswith("directload.loaders.dgl") and not HAS_DGL:
        pytest.skip("needs DGL: runs in the DGL lane")
    if name.startswith("directload.loaders.pyg") and not HAS_PYG:
        pytest.skip("needs PyG and torch_sparse: runs in the PyG lane")
    return importlib.import_module(name)


def test_the_walk_finds_the_api():
    for name in ("directload", "directload.unified", "directload.stores.disk", "directload.kernels.api",
                 "directload.loaders.pipeline", "directload.loaders.lookahead", "directload.loaders.pyg.loader",
                 "directload.datasets"):
        assert name in MODULES
    for name in ("directload.harness", "directload.harness.cli", "directload.harness.train_dgl",
                 "directload.kernels.host_emu", "directload.__main__"):
        assert name not in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name, tmp_path, monkeypatch):
    module = _load(name)
    monkeypatch.chdir(tmp_path)  # an example that writes a relative path writes here
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    report = io.StringIO()
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, name):
        runner.run(test, out=report.write)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}:\n{report.getvalue()}"


@pytest.mark.parametrize("name", MODULES)
def test_public_classes_have_examples(name):
    module = _load(name)
    # vars(), not getattr(): a name a module provides lazily (PEP 562) is defined elsewhere, and asking
    # for it may import a framework this lane lacks.  A module without __all__ exports its plain names.
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    classes = [n for n in names if isinstance(vars(module).get(n), type) and vars(module)[n].__module__ == name]
    missing = [n for n in classes if ">>>" not in (vars(module)[n].__doc__ or "")]
    assert not missing, f"public classes of {name} without a '>>>' example in their docstring: {missing}"
