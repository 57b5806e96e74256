"""The sampler's random streams and one node's picks, in Numba: the per-node half of ``kernels.sampling``.

The streams and the picks are specified in :mod:`directload.kernels.sampling`'s module docstring (the one
definition, which ``kernels/cuda/sample.cu`` also implements line for line); the batch drivers that run these
over a frontier are there too.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, uint64

__all__ = ["GOLDEN", "SMALL_MAX", "FLOYD_MAX", "RATIO_MIN", "RATIO_MAX", "mix", "node_stream", "draw", "mulhi64",
           "below", "unit", "pick_count", "pick"]

#: The golden-ratio increment of splitmix64.
GOLDEN = 0x9E3779B97F4A7C15
#: In-degrees up to this pick with a 64-bit set (the smaller of k and d - k draws, offsets in ascending order).
SMALL_MAX = 64
#: Above it, fanouts up to this use Floyd's algorithm (O(k^2) compares, k draws); larger ones a reservoir (d - k draws).
FLOYD_MAX = 64
#: Weighted picks without replacement compare -log(u) / w where every positive weight of a node lies in
#: [RATIO_MIN, RATIO_MAX] (one log an edge), their logs otherwise (three): the same order, no overflow.
RATIO_MIN = 1e-280
RATIO_MAX = 1e280

_G = uint64(GOLDEN)
_M1 = uint64(0xBF58476D1CE4E5B9)
_M2 = uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32, _S11 = uint64(30), uint64(27), uint64(31), uint64(32), uint64(11)
_ONE = uint64(1)
_ZERO = uint64(0)
_LO32 = uint64(0xFFFFFFFF)


@njit(inline="always", cache=True)
def mix(z: int) -> int:
    """splitmix64's finaliser of a uint64."""
    z = uint64(z)
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(inline="always", cache=True)
def node_stream(key: int, hop: int, node: int) -> int:
    """The stream of one node at one hop of the batch keyed ``key``."""
    return mix(mix(uint64(key) + (uint64(hop) + _ONE) * _G) ^ uint64(node))


@njit(inline="always", cache=True)
def draw(stream: int, n: int) -> int:
    """The ``n``-th 64-bit draw of a stream."""
    return mix(uint64(stream) + (uint64(n) + _ONE) * _G)


@njit(inline="always", cache=True)
def mulhi64(a: int, b: int) -> int:
    """The high 64 bits of the 128-bit product of two uint64s, from their 32-bit halves (as sample.cu's).

    >>> int(mulhi64(np.uint64(2**63), 6)), int(mulhi64(np.uint64(2**64 - 1), np.uint64(2**64 - 1))) == 2**64 - 2
    (3, True)
    """
    a, b = uint64(a), uint64(b)
    a0, a1 = a & _LO32, a >> _S32
    b0, b1 = b & _LO32, b >> _S32
    p01, p10 = a0 * b1, a1 * b0
    mid = ((a0 * b0) >> _S32) + (p01 & _LO32) + (p10 & _LO32)  # below 3 * 2**32: no carry lost
    return a1 * b1 + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32)


@njit(inline="always", cache=True)
def below(x: int, m: int) -> np.int64:
    """A uniform integer in ``[0, m)`` from a 64-bit draw, exact for ``1 <= m < 2**63``.

    Lemire's method (ACM TOMACS 29(1), 2019, https://arxiv.org/abs/1805.10941): the high half of ``x * m``,
    redrawing ``x = mix(x + GOLDEN)`` while the low half is below ``2**64 mod m``.

    >>> int(below(np.uint64(2**63 + 1), 3 * 2**30))  # the middle of the draws: the middle of [0, m)
    1610612736
    >>> int(below(np.uint64(0), 3))  # 0 * 3 has a low half of 0, below 2**64 mod 3 = 1: redrawn from the slot
    2
    """
    x, um = uint64(x), uint64(m)
    if x * um < um:  # only then can the low half be below 2**64 mod m (< m): the rare, slow path
        t = (_ZERO - um) % um
        while x * um < t:
            x = mix(x + _G)
    return np.int64(mulhi64(x, um))


@njit(inline="always", cache=True)
def unit(x: int) -> np.float64:
    """A uniform real in ``(0, 1]`` from a 64-bit draw."""
    return (np.float64(uint64(x) >> _S11) + 1.0) * (1.0 / 9007199254740992.0)


@njit(inline="always", cache=True)
def pick_count(d: int, k: int, replace: bool, positive: int) -> int:
    """How many edges a node of in-degree ``d`` (``positive`` of them of positive weight) gives."""
    if k < 0:
        return positive
    if replace:
        return k if positive > 0 else 0
    return min(k, positive)


@njit(inline="always", cache=True)
def _small(stream, d, k, out, off):
    # d <= 64: Floyd's algorithm over a 64-bit set of offsets, for the smaller of the picks and their complement.
    m = k if 2 * k <= d else d - k
    bits = uint64(0)
    n = 0
    for j in range(d - m, d):
        t = below(draw(stream, n), j + 1)
        if (bits >> uint64(t)) & _ONE:
            t = j
        bits |= _ONE << uint64(t)
        n += 1
    if m != k:
        bits = ~bits
    q = off
    for j in range(d):
        if (bits >> uint64(j)) & _ONE:
            out[q] = j
            q += 1


@njit(inline="always", cache=True)
def _floyd(stream, d, k, out, off):
    n = 0
    for j in range(d - k, d):
        t = below(draw(stream, n), j + 1)
        for q in range(n):
            if out[off + q] == t:
                t = j
                break
        out[off + n] = t
        n += 1


@njit(inline="always", cache=True)
def _reservoir(stream, d, k, out, off):
    for j in range(k):
        out[off + j] = j
    for j in range(k, d):
        r = below(draw(stream, j - k), j + 1)
        if r < k:
            out[off + r] = j


@njit(inline="always", cache=True)
def _ratio_keys(w, lo, d):
    # Whether every positive weight of the node lies in [RATIO_MIN, RATIO_MAX], where -log(u) / w is finite and
    # normal (-log(u) is at most 36.8): the keys then need one log, not three.
    for j in range(d):
        wj = np.float64(w[lo + j])
        if wj > 0.0 and (wj < RATIO_MIN or wj > RATIO_MAX):
            return False
    return True


@njit(inline="always", cache=True)
def _weighted(stream, w, lo, d, k, out, keys, off):
    # The k smallest keys -log(u) / w, kept sorted by insertion; zero weights never enter.  Where a weight of the
    # node lies outside [RATIO_MIN, RATIO_MAX], their logs log(-log(u)) - log(w) (the same order: -log(u)/w is inf
    # for w = 5e-324, and equal infinite keys all tie).
    ratio = _ratio_keys(w, lo, d)
    n = 0
    for j in range(d):
        wj = np.float64(w[lo + j])
        if not wj > 0.0:
            continue
        g = -np.log(unit(draw(stream, j)))
        e = g / wj if ratio else np.log(g) - np.log(wj)
        if n == k and e >= keys[off + n - 1]:
            continue
        q = n if n < k else k - 1
        while q > 0 and keys[off + q - 1] > e:
            keys[off + q] = keys[off + q - 1]
            out[off + q] = out[off + q - 1]
            q -= 1
        keys[off + q] = e
        out[off + q] = j
        if n < k:
            n += 1


@njit(inline="always", cache=True)
def _scale(w, lo, d):
    # Two powers of two whose product 2**s brings the largest weight into [0.5, 1); w * s1 * s2 rounds once (the
    # first product is exact whenever s2 is not 1: every weight is then below 2**-1023).
    top = 0.0
    for j in range(d):
        if np.float64(w[lo + j]) > top:
            top = np.float64(w[lo + j])
    s = -math.frexp(top)[1]
    first = min(s, 1023)
    return math.ldexp(1.0, first), math.ldexp(1.0, s - first)


@njit(inline="always", cache=True)
def _weighted_replace(stream, w, lo, d, k, out, off):
    # Inverse CDF over the weights scaled by 2**s: the total stays below d and subnormal weights keep their ratios.
    s1, s2 = _scale(w, lo, d)
    total = 0.0
    last = 0
    for j in range(d):
        if w[lo + j] > 0.0:
            total += np.float64(w[lo + j]) * s1 * s2
            last = j
    for n in range(k):
        target = unit(draw(stream, n)) * total
        acc = 0.0
        pick_j = last
        for j in range(d):
            if w[lo + j] > 0.0:
                acc += np.float64(w[lo + j]) * s1 * s2
                if target <= acc:
                    pick_j = j
                    break
        out[off + n] = pick_j


@njit(inline="always", cache=True)
def pick(stream: int, w: np.ndarray, weighted: bool, lo: int, d: int, k: int, count: int, replace: bool,
         out: np.ndarray, keys: np.ndarray, off: int) -> None:
    """Write one node's ``count`` picked edge offsets (``0 <= p < d``) to ``out[off:off + count]``."""
    if count == 0:
        return
    if weighted:
        if replace:
            _weighted_replace(stream, w, lo, d, count, out, off)
        else:
            _weighted(stream, w, lo, d, count, out, keys, off)
    elif replace:
        for n in range(count):
            out[off + n] = below(draw(stream, n), d)
    elif count >= d:
        for j in range(d):
            out[off + j] = j
    elif d <= SMALL_MAX:
        _small(stream, d, count, out, off)
    elif count <= FLOYD_MAX:
        _floyd(stream, d, count, out, off)
    else:
        _reservoir(stream, d, count, out, off)

