"""directload's picks follow the distribution they promise: uniform without replacement (each neighbour, the last
one included, with probability k/d), uniform with replacement, and proportional to edge weights.

Statistical checks: each is a chi-square test on fixed streams (keys), so a run either always passes or always
fails; a correct sampler fails one check with probability ``ALPHA`` over the choice of the streams.  One graph
of ``NODES`` nodes of equal in-degree ``d`` is sampled once: every node's picks come from its own stream, so
``NODES`` independent draws of the same (d, k) are counted by the picked edge's offset in the node's list.
"""

import numpy as np
import pytest
from scipy import stats

from directload.kernels import sampling

ALPHA = 1e-4
NODES = 20_000


def _regular(d, nodes=NODES):
    indptr = np.arange(nodes + 1, dtype=np.int64) * d
    indices = np.arange(nodes * d, dtype=np.int64) % nodes
    return indptr, indices


def _offsets(d, k, replace=False, weights=None, key=12345):
    indptr, indices = _regular(d)
    w = None if weights is None else np.tile(np.asarray(weights, np.float64), NODES)
    frontier = np.arange(NODES, dtype=np.int64)
    _, eid, offsets = sampling.sample_hop(indptr, indices, None, w, frontier, k, replace, key, 0)
    return eid - np.repeat(indptr[:-1], np.diff(offsets)), offsets


@pytest.mark.parametrize("d,k", [(2, 1), (3, 2), (20, 5), (16, 15), (7, 1), (64, 40), (100, 40), (100, 70)])
def test_without_replacement_every_neighbour_has_probability_k_over_d(d, k):
    # d <= 64 picks with a 64-bit set ((3, 2), (16, 15) and (64, 40) through its complement); (100, 40) runs
    # Floyd's algorithm and (100, 70) the reservoir (k > FLOYD_MAX).
    picked, offsets = _offsets(d, k)
    assert np.all(np.diff(offsets) == k)
    for i in range(0, NODES, 997):  # distinct edges per node
        assert np.unique(picked[offsets[i]:offsets[i + 1]]).size == k
    counts = np.bincount(picked, minlength=d)
    p = k / d
    # Inclusions of one draw are negatively correlated (their sum is k): the statistic scaled by (d-1)/d is
    # chi-square with d-1 degrees of freedom.
    x = (d - 1) / d * np.sum((counts - NODES * p) ** 2 / (NODES * p * (1 - p)))
    assert stats.chi2.sf(x, d - 1) > ALPHA, (counts, x)
    assert counts[d - 1] > 0  # torch-sparse's off-by-one never picks the last neighbour when k = 1


@pytest.mark.parametrize("d,k", [(5, 3), (1, 4), (30, 2)])
def test_with_replacement_draws_are_uniform(d, k):
    picked, offsets = _offsets(d, k, replace=True)
    assert np.all(np.diff(offsets) == k)
    counts = np.bincount(picked, minlength=d)
    if d == 1:
        assert counts.tolist() == [NODES * k]
        return
    expected = NODES * k / d
    assert stats.chisquare(counts, np.full(d, expected)).pvalue > ALPHA


def _successive_inclusion(w, k):
    """Exact inclusion probabilities of successive sampling (torch.multinomial without replacement)."""
    w = np.asarray(w, np.float64)
    out = np.zeros(w.size)

    def walk(chosen, prob):
        if len(chosen) == k:
            for c in chosen:
                out[c] += prob
            return
        rest = w.sum() - w[list(chosen)].sum()
        for j in range(w.size):
            if j not in chosen and w[j] > 0:
                walk(chosen + (j,), prob * w[j] / rest)

    walk((), 1.0)
    return out


@pytest.mark.parametrize("weights,k", [([1, 2, 3, 0], 1), ([1, 2, 3, 0, 4], 2), ([5, 1, 1, 1], 3)])
def test_weighted_without_replacement_is_successive_sampling(weights, k):
    picked, offsets = _offsets(len(weights), k, weights=weights)
    positive = sum(1 for w in weights if w > 0)
    assert np.all(np.diff(offsets) == min(k, positive))
    counts = np.bincount(picked, minlength=len(weights))
    zero = [j for j, w in enumerate(weights) if w == 0]
    assert counts[zero].sum() == 0  # a zero weight is never picked
    p = _successive_inclusion(weights, k)
    live = [j for j, w in enumerate(weights) if w > 0 and p[j] < 1]
    z = (counts[live] - NODES * p[live]) / np.sqrt(NODES * p[live] * (1 - p[live]))
    # Each inclusion count is binomial: a two-sided z-test per neighbour, Bonferroni over the neighbours.
    assert np.all(2 * stats.norm.sf(np.abs(z)) > ALPHA / len(live)), (counts, NODES * p)


def test_weighted_with_replacement_is_proportional():
    weights = [1.0, 0.0, 3.0, 6.0]
    picked, offsets = _offsets(4, 2, replace=True, weights=weights)
    counts = np.bincount(picked, minlength=4)
    assert counts[1] == 0
    expected = np.array([1, 3, 6]) / 10 * picked.size
    assert stats.chisquare(counts[[0, 2, 3]], expected).pvalue > ALPHA


def test_pairs_are_drawn_together_as_often_as_uniform_sets_say():
    # Uniform k-subsets: every pair appears together with probability k(k-1)/(d(d-1)).
    d, k = 6, 3
    picked, offsets = _offsets(d, k)
    together = np.zeros((d, d))
    sets = np.sort(picked.reshape(-1, k), axis=1)
    for a in range(k):
        for b in range(a + 1, k):
            np.add.at(together, (sets[:, a], sets[:, b]), 1)
    pairs = together[np.triu_indices(d, 1)]
    expected = NODES * k * (k - 1) / (d * (d - 1))
    assert stats.chisquare(pairs, np.full(pairs.size, expected * pairs.sum() / (expected * pairs.size))).pvalue \
        > ALPHA
