"""Every error class directload defines subclasses ``DirectloadError`` and keeps a builtin base, so both
``except DirectloadError`` and the builtin ``except`` a caller already wrote catch it."""

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from conftest import HAS_DGL, HAS_PYG

import directload
import directload.kernels
import directload.loaders
from directload.errors import DirectloadError, DirectloadWarning

ROOT = Path(__file__).resolve().parents[1]


def _modules():
    out = []
    for pkg in (directload, directload.kernels, directload.loaders):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not info.name.endswith("__main__"):  # runs the command line when imported
                out.append(info.name)
    return sorted(set(out))


_FRAMEWORKS = ("dgl", "torch_geometric", "torch_sparse", "torch_scatter", "pyg_lib")


def _load(name):
    """The module, or None where it needs the other lane's framework."""
    if name.startswith("directload.loaders.dgl") and not HAS_DGL:
        return None
    if name.startswith("directload.loaders.pyg") and not HAS_PYG:
        return None
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # a module of the other lane (directload.harness.train_pyg, ...)
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else getattr(exc.__cause__, "name", None)
        if (missing or "").split(".")[0] in _FRAMEWORKS:
            return None
        raise


def _errors():
    found = {}
    for name in _modules():
        module = _load(name)
        if module is None:
            continue
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if (issubclass(cls, BaseException) and not issubclass(cls, Warning) and cls.__module__ == name
                    and not cls_name.startswith("_")):
                found[f"{name}.{cls_name}"] = cls
    return found


_BUILTIN = {c for c in vars(builtins).values() if isinstance(c, type) and issubclass(c, BaseException)}


def test_every_error_subclasses_directload_error_and_keeps_a_builtin_base():
    errors = _errors()
    assert "directload.graph.GraphError" in errors and "directload.shared.SharedTableError" in errors
    assert len(errors) >= 20, sorted(errors)
    missing = [name for name, cls in errors.items() if not issubclass(cls, DirectloadError)]
    assert not missing, f"errors that do not subclass DirectloadError: {missing}"
    bare = [name for name, cls in errors.items() if cls is not DirectloadError
            and not any(base in _BUILTIN and base not in (Exception, BaseException) for base in cls.__mro__)]
    assert not bare, f"errors without a builtin base (ValueError, RuntimeError, ...): {bare}"


@pytest.mark.parametrize("make,builtin", [
    (lambda: __import__("directload.graph", fromlist=["CSCGraph"]).CSCGraph(
        __import__("torch").tensor([1, 1]), __import__("torch").tensor([0])), ValueError),
])
def test_the_builtin_except_still_catches_them(make, builtin):
    with pytest.raises(builtin) as info:
        make()
    assert isinstance(info.value, DirectloadError)


def test_errors_module_is_the_bottom_layer():
    # capabilities and the kernels subclass it, so it imports nothing (of directload's own or any other).
    tree = ast.parse(Path(directload.errors.__file__).read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _warning_classes():
    found = {}
    for name in _modules():
        module = _load(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass) if module is not None else ():
            if issubclass(cls, Warning) and cls.__module__ == name and not cls_name.startswith("_"):
                found[f"{name}.{cls_name}"] = cls
    return found


def test_every_warning_subclasses_directload_warning():
    warns = _warning_classes()
    assert {"directload.errors.SamplerWarning", "directload.stores.disk_open.DirectIOWarning",
            "directload.kernels.tune_store.TunerCacheWarning", "directload.publish.PublishWaitWarning"} <= set(warns)
    assert not [name for name, cls in warns.items() if not issubclass(cls, DirectloadWarning)]


_SOURCES = [p for root in ("directload", "kernels", "loaders") for p in sorted((ROOT / root).rglob("*.py"))]


def _calls(tree, test):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and test(node)]


@pytest.mark.parametrize("path", _SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bare_runtime_error_and_every_warning_has_directloads_category(path):
    # A caller catches directload's errors with ``except DirectloadError`` and filters its warnings with one
    # ``DirectloadWarning``: a bare ``RuntimeError``, or a warning of a builtin category, escapes both.
    tree = ast.parse(path.read_text())
    bare = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
            and isinstance(node.exc.func, ast.Name) and node.exc.func.id in ("RuntimeError", "Exception")]
    assert not bare, f"{path.name}: a bare RuntimeError raised at lines {bare}"
    builtin_warnings = {n for n, c in vars(builtins).items() if isinstance(c, type) and issubclass(c, Warning)}

    def is_warn(node):
        f = node.func
        return isinstance(f, ast.Attribute) and f.attr == "warn" and isinstance(f.value, ast.Name) \
            and f.value.id == "warnings"

    for call in _calls(tree, is_warn):
        category = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "category"), None)
        assert category is not None, f"{path.name}:{call.lineno}: a warning without a category (a bare UserWarning)"
        assert not (isinstance(category, ast.Name) and category.id in builtin_warnings), \
            f"{path.name}:{call.lineno}: a warning of the builtin {category.id}, not a DirectloadWarning"
