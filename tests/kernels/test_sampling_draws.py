"""The sampling streams' integer draws against a Python model of kernels/sampling.py's spec: the multiply-high,
Lemire's method with its redraw, and the in-degree limit; sample.cu (under the host emulation) redraws alike."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from directload.kernels import host_emu_sample as emu
from directload.kernels import sampling as cpu

M64 = 2**64
#: Sizes where 32-bit draws went wrong (past 2**31, past 2**32) and the ends of the accepted range.
SIZES = (1, 2, 3, 7, 2**31 + 1, 3 * 2**30, 2**32 - 1, 2**32 + 1, 5 * 2**30, cpu.MAX_DEGREE - 1, 2**63 - 1)
uint64s = st.integers(0, M64 - 1) | st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63, M64 - 1])
sizes = st.integers(1, 2**63 - 1) | st.integers(1, 2**32) | st.sampled_from(SIZES)


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
    return z ^ (z >> 31)


def _unxorshift(z, s):
    out = z
    for _ in range(64 // s):
        out = z ^ (out >> s)
    return out


def _unmix(z):
    z = _unxorshift(z, 31) * pow(0x94D049BB133111EB, -1, M64) % M64
    z = _unxorshift(z, 27) * pow(0xBF58476D1CE4E5B9, -1, M64) % M64
    return _unxorshift(z, 30)


def _below(x, m):
    """The spec: the high half of x * m, redrawn from the same slot while the low half is below 2**64 mod m."""
    while x * m % M64 < M64 % m:
        x = _mix((x + cpu.GOLDEN) % M64)
    return x * m >> 64


@settings(deadline=None)  # the first example compiles
@given(uint64s, uint64s)
def test_mulhi64_is_the_high_half_of_the_product(a, b):
    assert int(cpu.mulhi64(np.uint64(a), np.uint64(b))) == a * b >> 64


@settings(deadline=None)
@given(uint64s, sizes)
def test_below_is_lemires_method(x, m):
    got = cpu.below(np.uint64(x), m)
    assert 0 <= got < m and got == _below(x, m)


def test_mix_model_and_its_inverse():
    for z in (0, 1, cpu.GOLDEN, M64 - 1, 12345678901234567):
        assert _mix(z) == int(cpu.mix(np.uint64(z))) and _unmix(_mix(z)) == z


def test_a_rejected_draw_is_redrawn_from_the_same_slot():
    """A key crafted so that node 5's first draw at hop 0 is 0, which every m but a power of two rejects (the
    low half of 0 * m is 0, below 2**64 mod m): both devices redraw mix(0 + GOLDEN), and the next draw is the
    stream's own."""
    node, d = 5, 3
    stream = (-cpu.GOLDEN) % M64  # draw(stream, 0) = mix(stream + GOLDEN) = mix(0) = 0
    key = (_unmix(_unmix(stream) ^ node) - cpu.GOLDEN) % M64
    assert int(cpu.node_stream(np.uint64(key), 0, node)) == stream and int(cpu.draw(np.uint64(stream), 0)) == 0
    want = [_below(0, d), _below(_mix((stream + 2 * cpu.GOLDEN) % M64), d)]
    assert want[0] == _mix(cpu.GOLDEN) * d >> 64 != 0  # the 32-bit draw, ((0 >> 32) * 3) >> 32, gave 0
    indptr = np.array([0, 0, 0, 0, 0, 0, d], np.int64)
    indices = np.zeros(d, np.int64)
    for sample_hop in (cpu.sample_hop, emu.sample_hop):
        nbr, eid, offsets = sample_hop(indptr, indices, None, None, np.array([node]), 2, True, key, 0)
        assert eid.tolist() == want and offsets.tolist() == [0, 2]


def test_in_degrees_below_max_degree_pass_the_check():
    # Lemire's draws are exact up to 2**63; MAX_DEGREE = 2**62 keeps one node's edge positions below sample.cu's
    # claim offset.  A 32-bit draw refused 2**32 and was biased above 2**31.
    assert cpu.MAX_DEGREE == 2**62
    for d in (2**32, 5 * 2**30, cpu.MAX_DEGREE - 1):
        assert cpu.check_csc(np.array([0, d], np.int64), d, np.zeros(0, np.int64), 1) == (-1, -1)
    assert cpu.check_csc(np.array([0, 1, 1 + cpu.MAX_DEGREE], np.int64), 1 + cpu.MAX_DEGREE,
                         np.zeros(0, np.int64), 1) == (5, 1)
