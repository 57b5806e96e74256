"""The simulator lane: NUMBA_ENABLE_CUDASIM=1 must be set before numba is imported."""

import os
import sys

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or (
    "numba" in sys.modules and not sys.modules["numba"].config.ENABLE_CUDASIM
):
    pytest.exit("run this lane as: NUMBA_ENABLE_CUDASIM=1 pytest tests/cudasim", returncode=4)


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.cudasim)
