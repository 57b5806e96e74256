"""The documentation site builds in strict mode (every page, link, anchor and rendered docstring), and the
README's links into it resolve."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = ROOT / ".venv-docs" / "bin" / "mkdocs"


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
@pytest.mark.skipif(not MKDOCS.exists(), reason="no .venv-docs here (`bash scripts/dev.sh test` sets it up: "
                                                "python3.11 -m venv .venv-docs, then pip install the docs extra)")
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, encoding="utf-8", errors="replace", timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    # The API reference rendered each package, kernels/ and loaders/ included (installed under directload).
    for page, anchor in (("directload", "directload.to_unified"), ("stores", "directload.stores.DiskStore"),
                         ("kernels", "directload.kernels.api.gather"),
                         ("loaders-dgl", "directload.loaders.dgl.DataLoader"),
                         ("loaders-pyg", "directload.loaders.pyg.NeighborLoader"),
                         ("pipeline", "directload.loaders.pipeline.Pipeline"),
                         ("datasets", "directload.datasets.load")):
        html = (site / "api" / page / "index.html").read_text(encoding="utf-8")
        assert f'id="{anchor}"' in html, f"{anchor} is missing from the API page {page}"


def test_the_readme_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", readme)
             if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in links), "the README links into docs/"
    missing = [link for link in links if link and not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_docs_extra_is_read_from_setup_py():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from extras import extra
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    docs = extra("docs")
    assert any(req.startswith("mkdocstrings-python") for req in docs)
    with pytest.raises(ValueError, match="no 'nope' extra"):
        extra("nope")
