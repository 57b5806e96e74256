"""The one mechanism that runs a test in one lane only: ``@pytest.mark.one_lane("dgl" | "pyg")``, honoured where
scripts/dev.sh names the lane (DIRECTLOAD_LANE), ignored by a plain pytest."""

import pytest
from conftest import split_by_lane


class _Item:
    """What the split reads of a collected test: its id and its closest marker."""

    def __init__(self, name, *marks):
        self.nodeid = name
        self._marks = {m.mark.name: m.mark for m in marks}

    def get_closest_marker(self, name):
        return self._marks.get(name)


ITEMS = [_Item("both"), _Item("dgl-only", pytest.mark.one_lane("dgl")), _Item("pyg-only", pytest.mark.one_lane("pyg")),
         _Item("slow-both", pytest.mark.slow)]


def _names(items):
    return [item.nodeid for item in items]


@pytest.mark.parametrize("lane, other", [("dgl", "pyg"), ("pyg", "dgl")])
def test_a_lane_leaves_the_other_lanes_tests_to_it(lane, other):
    here, elsewhere = split_by_lane(ITEMS, lane)
    assert _names(here) == ["both", f"{lane}-only", "slow-both"]
    assert _names(elsewhere) == [f"{other}-only"]


def test_every_test_runs_in_exactly_one_lane_or_in_both():
    dgl, _ = split_by_lane(ITEMS, "dgl")
    pyg, _ = split_by_lane(ITEMS, "pyg")
    assert sorted(set(_names(dgl)) | set(_names(pyg))) == sorted(_names(ITEMS))
    assert set(_names(dgl)) & set(_names(pyg)) == {"both", "slow-both"}


def test_a_plain_run_runs_every_test():
    here, elsewhere = split_by_lane(ITEMS, "")
    assert _names(here) == _names(ITEMS) and elsewhere == []


@pytest.mark.parametrize("mark", [pytest.mark.one_lane("torch"), pytest.mark.one_lane(),
                                  pytest.mark.one_lane("dgl", "pyg")])
def test_a_mark_that_names_no_lane_is_refused(mark):
    with pytest.raises(pytest.UsageError, match="one_lane takes one lane"):
        split_by_lane([_Item("bad", mark)], "")
