"""kernels/ split by job: small modules that talk through public names, the old import paths kept, and every
module under the test-machinery contract."""

import ast
import configparser
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"  # installed as directload.kernels
MODULES = sorted(p.stem for p in KERNELS.glob("*.py") if p.stem != "__init__")
# The test machinery: host emulation of the CUDA C kernels, imported by tests only.
MACHINERY = {"host_emu", "host_emu_sample"}

# The public names each module had before it was split, and where they live now.  A user's or a test's
# ``from directload.kernels.<old> import <name>`` keeps working, and gives the same object.
MOVED = {
    "api": {"resolve_backend": "registry", "launcher": "registry", "BACKENDS": "registry",
            "check_devices": "operands", "check_no_overlap": "operands", "GatherFuture": "futures",
            "POOL_BYTES": "cpu_path", "vector_units": "variants"},
    "cpu": {"launch": "cpu_launch", "set_team": "cpu_launch", "team": "cpu_launch", "get_num_threads": "cpu_launch",
            "set_num_threads": "cpu_launch", "SERIAL_BYTES": "cpu_launch", "first_invalid": "cpu_kernels",
            "PREFETCH_ROWS": "cpu_kernels", "PREFETCH_LINES": "cpu_kernels", "MEMCPY_BYTES": "cpu_kernels",
            "prefetch": "intrinsics", "wait_policy": "wait_policy", "LIBGOMP_SPINS": "wait_policy",
            "prepare": "cpu_path", "ready": "cpu_path", "note_fallback": "cpu_path", "LOAD_AFTER_S": "cpu_path"},
    "tiered": {"launch_tiered": "cpu_launch", "tiered_launcher": "registry", "check_where": "operands"},
    "operands": {"RowWords": "views", "row_words": "views"},
    "sampling": {name: "sampling_picks" for name in ("GOLDEN", "SMALL_MAX", "FLOYD_MAX", "RATIO_MIN", "RATIO_MAX",
                                                      "mix", "node_stream", "draw", "mulhi64", "below", "unit",
                                                      "pick_count", "pick")},
}


def _source(name):
    return (KERNELS / f"{name}.py").read_text()


@pytest.mark.parametrize("name", MODULES)
def test_no_module_is_over_500_lines(name):
    assert len(_source(name).splitlines()) <= 500


def _private_uses(tree):
    """``(line, name)`` of every private name a module takes from a sibling: ``from .x import _y`` and
    ``x._y`` where ``x`` is a sibling module imported with ``from . import x``."""
    siblings = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                if node.module is None:
                    siblings.add(alias.asname or alias.name)
                elif alias.name.startswith("_"):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in siblings
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_no_module_takes_a_private_name_from_another(name):
    assert _private_uses(ast.parse(_source(name))) == []


def test_the_private_name_check_can_fail():
    tree = ast.parse("from . import api, cpu\nfrom .api import _CARRIER, gather\nx = cpu._team_kernel(1)\n")
    assert _private_uses(tree) == [(2, "api._CARRIER"), (3, "cpu._team_kernel")]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_import_paths_give_the_moved_names(old):
    module = importlib.import_module(f"directload.kernels.{old}")
    for name, home in MOVED[old].items():
        assert getattr(module, name) is getattr(importlib.import_module(f"directload.kernels.{home}"), name), name
        assert name in module.__all__, name


def test_every_production_module_is_under_the_test_machinery_contract():
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    sources = set(config["importlinter:contract:test-machinery"]["source_modules"].split())
    forbidden = set(config["importlinter:contract:test-machinery"]["forbidden_modules"].split())
    assert {f"directload.kernels.{m}" for m in MACHINERY} <= forbidden
    missing = {f"directload.kernels.{m}" for m in MODULES if m not in MACHINERY} - sources
    assert missing == set()
