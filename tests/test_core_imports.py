"""The core imports and works with neither framework installed; a missing framework names its extra."""

import subprocess
import sys
import textwrap

_BLOCKED = ("dgl", "torch_geometric", "torch_sparse", "torch_scatter", "ogb", "pyg_lib")

_PRELUDE = f"""
import importlib.abc, sys
BLOCKED = {_BLOCKED!r}

class Block(importlib.abc.MetaPathFinder):  # as if none of them were installed
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}")

sys.meta_path.insert(0, Block())
"""


def _run(code):
    proc = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_core_works_without_dgl_pyg_or_ogb(tmp_path):
    out = _run(f"""
        import torch
        import directload
        import directload.capabilities, directload.datasets, directload.loaders, directload.loaders.pipeline
        from directload.kernels import gather
        from directload.datasets import synthesize

        table = directload.to_unified(torch.arange(12.0).reshape(4, 3))
        assert table[torch.tensor([3, 0])].tolist() == [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]]
        assert torch.equal(gather(table.host, torch.tensor([1])), table.host[[1]])
        synthesize({str(tmp_path)!r}, "synth-tiny", progress=False)  # generating needs no framework
        try:  # loading reads OGB's files with OGB's readers
            directload.datasets.load({str(tmp_path)!r}, "synth-tiny")
        except ImportError as exc:
            assert "pip install 'directload[ogb]'" in str(exc), str(exc)
        else:
            raise SystemExit("load() without OGB: no ImportError")
        directload.capabilities.capabilities()
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not loaded, loaded
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_missing_framework_says_which_extra_to_install():
    out = _run("""
        import directload.loaders
        for what, extra in (("from directload.loaders import DataLoader", "directload[dgl]"),
                            ("import directload.loaders.dgl", "directload[dgl]"),
                            ("import directload.loaders.pyg", "directload[pyg]"),
                            ("import directload.datasets as d; d.load('data', 'ogbn-products')", "directload[ogb]")):
            try:
                exec(what)
            except ImportError as exc:
                assert extra in str(exc), (what, str(exc))
            except FileNotFoundError:
                pass  # load() looks for the files first; there are none here
            else:
                raise SystemExit(f"{what}: no ImportError")
        print("ok")
    """)
    assert out.strip() == "ok"


def test_setup_py_installs_every_package_of_the_tree():
    """A package missing from setup.py's list works from a checkout and is absent from an install."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    tree = ast.parse((root / "setup.py").read_text())
    listed = next(ast.literal_eval(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                  for k in node.keywords if k.arg == "packages")
    homes = {"directload": root / "directload", "directload.kernels": root / "kernels",
             "directload.loaders": root / "loaders"}
    found = set()
    for top, path in homes.items():
        for init in path.rglob("__init__.py"):
            rel = init.parent.relative_to(path).parts
            found.add(".".join((top, *rel)) if rel else top)
    assert found == set(listed)
