"""Static caches: the ``capacity`` rows of highest score, fixed up front; misses pass through.

:func:`degree` scores rows by in-degree (PaGraph, quiver); :func:`presample` by how often K pre-sampled
batches read them (GNNLab).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from .base import Policy


class Static(Policy):
    """The ``capacity`` rows of highest score (above zero), fixed up front; misses pass through.

    Examples
    --------
    >>> policy = Static(2, scores=[0, 5, 1, 9])
    >>> sorted(policy.cached()), policy.access([1, 2]).tolist()
    ([1, 3], [True, False])
    """

    name = "static"

    def __init__(self, capacity: int, scores: npt.ArrayLike, name: str = "static") -> None:
        super().__init__(capacity)
        scores = np.asarray(scores)
        order = np.argsort(-scores, kind="stable")[:self.capacity]
        self._rows = set(order[scores[order] > 0].tolist()) if scores.size else set()
        self.name = name

    def _access(self, ids):
        return self.contains(ids)  # fixed up front: a hit is a row it holds

    def _members(self):
        return self._rows


def degree(capacity: int, in_degrees: npt.ArrayLike) -> Static:
    """The rows of highest in-degree (a row read by many neighbours is read often).

    Examples
    --------
    >>> sorted(degree(2, in_degrees=[3, 0, 7]).cached())
    [0, 2]
    """
    return Static(capacity, np.asarray(in_degrees, np.float64) + 1e-9, name="degree")


def presample(capacity: int, batches: Iterable[npt.ArrayLike], num_rows: int) -> Static:
    """The rows that ``batches`` (K pre-sampled batches) read most often.

    Examples
    --------
    >>> sorted(presample(1, [[0, 1], [1]], num_rows=3).cached())
    [1]
    """
    counts = np.zeros(num_rows, np.int64)
    for b in batches:
        np.add.at(counts, np.unique(np.asarray(b, np.int64)), 1)
    return Static(capacity, counts, name="presample")
