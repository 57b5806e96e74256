"""Check the house's one-way imports (.importlinter) with import-linter.

setup.py installs kernels/ and loaders/ as directload.kernels and
directload.loaders; import-linter reads packages from disk, so it checks a
copy of the tree laid out as installed.  Exit status 0 when every contract
is kept.  ``--tree DIR`` checks another checkout (the tests use it).
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def installed_layout(tree, into):
    """Copy ``tree``'s directload/, kernels/ and loaders/ into ``into`` as the installed package."""
    pkg = Path(into) / "directload"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(tree) / "directload", pkg, ignore=ignore)
    shutil.copytree(Path(tree) / "kernels", pkg / "kernels", ignore=ignore)
    shutil.copytree(Path(tree) / "loaders", pkg / "loaders", ignore=ignore)
    return pkg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent), help="the checkout to check")
    args = p.parse_args(argv)
    tree = Path(args.tree).resolve()
    tool = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory() as tmp:
        installed_layout(tree, tmp)
        return subprocess.call([str(tool), "--config", str(tree / ".importlinter"), "--no-cache"], cwd=tmp,
                               env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


if __name__ == "__main__":
    sys.exit(main())
