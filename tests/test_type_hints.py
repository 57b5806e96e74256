"""scripts/check_types.py: every public signature of the package carries type hints (mypy checks them in CI)."""

from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tool():
    return load_script("check_types")


def test_a_public_signature_without_a_hint_is_found(tool):
    source = (
        "def ok(a: int, *b: int, c: str = '', **d: float) -> None: ...\n"
        "def no_return(a: int): ...\n"
        "def no_param(a) -> int: ...\n"
        "def _private(a): ...\n"
        "class C:\n"
        "    def __init__(self, a: int): ...\n"
        "    def m(self, b): ...\n"
        "    @property\n"
        "    def p(self): ...\n"
        "class _Hidden:\n"
        "    def m(self, b): ...\n"
    )
    assert tool.missing_hints(source, "x.py") == ["x.py:2 no_return", "x.py:3 no_param", "x.py:7 C.m", "x.py:9 C.p"]


def test_private_modules_and_the_test_machinery_are_not_public(tool):
    assert tool._public_path(Path("directload/stores/cache.py"))
    assert not tool._public_path(Path("directload/_private.py"))
    assert not tool._public_path(Path("kernels/host_emu_sample.py"))


def test_every_public_signature_of_the_package_has_type_hints(tool):
    missing = tool.all_missing(ROOT)
    assert not missing, f"{len(missing)} public signatures without type hints, e.g. {missing[:5]}"
