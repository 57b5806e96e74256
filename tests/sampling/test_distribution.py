"""directload's picks follow the distribution they promise: uniform without replacement (each neighbour, the last
one included, with probability k/d), uniform with replacement, and proportional to edge weights, at in-degrees
past 2**31 and 2**32 and at weights across float64's range too, in the CPU twin and in sample.cu's kernels (under
the host emulation).

Statistical checks: each is a chi-square test on fixed streams (keys), so a run either always passes or always
fails; a correct sampler fails one check with probability ``ALPHA`` over the choice of the streams.  One graph
of ``NODES`` nodes of equal in-degree ``d`` is sampled once: every node's picks come from its own stream, so
``NODES`` independent draws of the same (d, k) are counted by the picked edge's offset in the node's list.
"""

import contextlib
import mmap
import platform
import sys

import numpy as np
import pytest
from scipy import stats

from directload.kernels import host_emu_sample, sampling

ALPHA = 1e-4
NODES = 20_000
#: The CPU twin and sample.cu's kernels run on the CPU by the host emulation: one distribution.
SAMPLERS = {"cpu": sampling.sample_hop, "emulation": host_emu_sample.sample_hop}


def _regular(d, nodes=NODES):
    indptr = np.arange(nodes + 1, dtype=np.int64) * d
    indices = np.arange(nodes * d, dtype=np.int64) % nodes
    return indptr, indices


def _offsets(d, k, replace=False, weights=None, key=12345, hop=sampling.sample_hop):
    indptr, indices = _regular(d)
    w = None if weights is None else np.tile(np.asarray(weights, getattr(weights, "dtype", np.float64)), NODES)
    frontier = np.arange(NODES, dtype=np.int64)
    _, eid, offsets = hop(indptr, indices, None, w, frontier, k, replace, key, 0)
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


# ---- in-degrees past 2**31 and 2**32, in address space only ----------------------------------------------------

#: Nodes of one huge in-degree sampled in one hop (each its own stream).
HUGE_NODES = 10_000
#: Linux's MAP_NORESERVE on x86-64 and arm64 (Python names it from 3.12).
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


def _untouched_int32(n):
    """``n`` int32 zeros in reserved address space: a private anonymous mapping without reserve is not charged,
    and its untouched pages read as the kernel's zero page, so only page tables of the pages read cost memory
    (hardly any with huge pages advised: reads then map the huge zero page)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("reserving address space without memory is written for Linux on x86-64 and arm64")
    try:
        buf = mmap.mmap(-1, 4 * n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    except OSError as e:
        pytest.skip(f"cannot reserve {4 * n} bytes of address space: {e}")
    with contextlib.suppress(OSError, AttributeError):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, np.int32)


def _huge_picks(hop, d, k, replace):
    """The offsets picked at ``HUGE_NODES`` nodes of in-degree ``d`` sharing one list: the crafted indptr
    ``[0, d, 0, d, ...]`` gives every even node the edges ``[0, d)`` (an odd node, never sampled, has a negative
    degree; no check runs at the kernel level).  Nothing here is O(d)."""
    indptr = np.zeros(2 * HUGE_NODES, np.int64)
    indptr[1::2] = d
    frontier = np.arange(0, 2 * HUGE_NODES, 2, dtype=np.int64)
    _, eid, offsets = hop(indptr, _untouched_int32(d), None, None, frontier, k, replace, 2024, 0)
    assert np.all(np.diff(offsets) == k) and eid.dtype == np.int64
    return eid, offsets


def _cells(picked, d):
    """``(name, counts, exact probabilities)`` of the offsets' residues mod 3 and mod 5 and of their halves."""
    for r in (3, 5):
        sizes = np.array([(d - c + r - 1) // r for c in range(r)])
        yield f"mod {r}", np.bincount(picked % r, minlength=r), sizes / d
    yield "halves", np.bincount(picked >= d // 2, minlength=2), np.array([d // 2, d - d // 2]) / d


@pytest.mark.parametrize("d", [3 * 2**30, 5 * 2**30], ids=["3x2^30", "5x2^30"])
@pytest.mark.parametrize("replace,k", [(True, 5), (False, 10)], ids=["replace", "floyd"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_in_degrees_past_2_to_the_31_and_32_are_drawn_uniformly(sampler, replace, k, d):
    # A 32-bit draw, ((x >> 32) * d) >> 32, picked offsets = 0 (mod 3) half of the time at 3 * 2**30, never
    # 4 (mod 5) at 5 * 2**30, and there (the product wrapping) too few in the upper half.
    assert replace or k <= sampling.FLOYD_MAX < d  # Floyd's algorithm: k draws, no O(d) reservoir
    picked, offsets = _huge_picks(SAMPLERS[sampler], d, k, replace)
    assert picked.min() >= 0 and picked.max() < d
    if not replace:
        sets = np.sort(picked.reshape(-1, k), axis=1)
        assert (np.diff(sets, axis=1) > 0).all()  # distinct edges per node
    for name, counts, p in _cells(picked, d):
        # Three chi-square tests, Bonferroni: each at ALPHA / 3.  Without replacement the k picks of a node are
        # dependent only through their distinctness, which at k / d < 1e-8 changes no count measurably.
        pvalue = stats.chisquare(counts, p * picked.size).pvalue
        assert pvalue > ALPHA / 3, (name, counts, p * picked.size)


# ---- weights across float64's range ----------------------------------------------------------------------------

TINY = 5e-324  # the least subnormal, 2**-1074
F32_MAX, F32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).smallest_subnormal)
#: name: (weights, their dtype, a model of the same ratios in ordinary numbers, fanout without replacement).
EXTREMES = {
    "subnormal-equal": ([TINY] * 3, np.float64, [1, 1, 1], 1),
    "subnormal-ratios": ([TINY, 2 * TINY, 4 * TINY], np.float64, [1, 2, 4], 1),
    "1e-300": ([1e-300, 2e-300, 4e-300], np.float64, [1, 2, 4], 2),
    "1e308-equal": ([1e308] * 3, np.float64, [1, 1, 1], 1),
    "1e308-total-overflows": ([1e308, 1e308, 5e307, 0.0], np.float64, [2, 2, 1, 0], 2),
    "float64-max": ([np.finfo(np.float64).max, np.finfo(np.float64).max / 4], np.float64, [4, 1], 1),
    "float32-max": ([F32_MAX, F32_MAX, F32_MAX / 2], np.float32, [2, 2, 1], 1),
    "float32-subnormal": ([F32_TINY, 2 * F32_TINY, 4 * F32_TINY], np.float32, [1, 2, 4], 1),
    # After both 1e308, the third pick is 5e-324 one time in three: its ratio to 1e-323 holds next to 1e308.
    "tiny-and-huge": ([1e308, TINY, 1e308, 2 * TINY, 0.0], np.float64, [1e15, 1, 1e15, 2, 0], 3),
}
#: A model probability below this is an edge never drawn (5e-324 next to 1e308: 1e-632).
NEVER = 1e-12


def _extreme(case):
    weights, dtype, model, k = EXTREMES[case]
    w = np.asarray(weights, dtype)
    assert (w[np.asarray(model) > 0] > 0).all()  # none rounds to zero in its dtype
    return w, np.asarray(model, np.float64), k


@pytest.mark.parametrize("case", EXTREMES)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_extreme_weights_with_replacement_are_proportional(sampler, case):
    # Summed as they are, equal weights of 1e308 overflowed to inf and always gave the second edge, and subnormal
    # totals rounded u * total to a few multiples of 5e-324.
    w, model, _ = _extreme(case)
    picked, offsets = _offsets(w.size, 2, replace=True, weights=w, hop=SAMPLERS[sampler])
    assert np.all(np.diff(offsets) == 2)
    counts = np.bincount(picked, minlength=w.size)
    p = model / model.sum()
    assert counts[p < NEVER].sum() == 0
    live = p >= NEVER
    assert stats.chisquare(counts[live], p[live] / p[live].sum() * picked.size).pvalue > ALPHA, counts


@pytest.mark.parametrize("case", EXTREMES)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_extreme_weights_without_replacement_are_successive_sampling(sampler, case):
    # With keys -log(u) / w, equal weights of 5e-324 gave keys of inf, which all tie: the first edge won always.
    w, model, k = _extreme(case)
    picked, offsets = _offsets(w.size, k, weights=w, hop=SAMPLERS[sampler])
    assert np.all(np.diff(offsets) == k)
    counts = np.bincount(picked, minlength=w.size)
    p = _successive_inclusion(model, k)
    assert counts[p < NEVER].sum() == 0 and (counts[p > 1 - NEVER] == NODES).all()
    live = (p >= NEVER) & (p <= 1 - NEVER)
    z = (counts[live] - NODES * p[live]) / np.sqrt(NODES * p[live] * (1 - p[live]))
    assert np.all(2 * stats.norm.sf(np.abs(z)) > ALPHA / live.sum()), (counts, NODES * p)
