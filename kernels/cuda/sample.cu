// Neighbour sampling kernels for directload: the GPU twin of kernels/sampling.py (its module docstring is the
// spec of the random streams and the picks).  The device functions below mirror that file line for line, so the
// same key gives the same picks on either device: integer draws are exact integer arithmetic (Lemire's
// multiply-high, the high half from 32-bit halves, with its rejection), and the weighted paths' scaling by powers
// of two (frexp, ldexp) is exact on both.  The one allowed difference: a weighted pick without replacement
// compares keys built with log (-log(u) / w, or its log), and CUDA's log may differ from the CPU's libm in the last ulp (CUDA C++
// Programming Guide, "Mathematical Functions": log has 1 ulp of maximum error), which can swap two near-equal
// keys.  NVRTC compiles with --fmad=false, so no product is fused into a sum as the CPU never does.
//
// In-degrees are below 2^62 (kernels/sampling.MAX_DEGREE): the draws are exact up to 2^63, and one node's edges
// alone (a fanout -1 hop) never reach position DLS_CLAIM, where a claim q - DLS_CLAIM would turn non-negative.
//
//  - sample_counts<P, W>: how many edges each frontier node gives;
//  - sample_picks<P, I, E, W>: the picks, their neighbours, edge ids and (optionally) target local ids;
//  - relabel_claim / relabel_flag / relabel_append / relabel_rows <I>: batch-local ids in first-seen order
//    (the serial order of kernels/sampling.relabel), with an inclusive scan of relabel_flag's flags between
//    relabel_flag and relabel_append (torch.cumsum on the host side);
//  - place_seeds<I>: the seeds first, each in its place, after relabel_claim over them;
//  - reset_marks: clears the marks of a batch's nodes.
//
// P is indptr's type, I that of indices (and of the picked neighbours), E that of the edge ids, W that of the
// weights (int or long long; float or double).  Null eids: the edge id is its position; null weights: uniform.
//
// A frontier is nodes[*lo_at .. *hi_at): its span lives on the device, so a batch's hops run with no host read.
// Launches cover an upper bound of `bound` frontier nodes or edges; threads past the device-side count idle.
// One thread per frontier node; every loop is grid-strided.
//
// marks[v] (int64, one per node) is v's batch-local id plus one, 0 when v is not in the batch, and, between
// relabel_claim and relabel_append, q - DLS_CLAIM for the first edge q that picked v (atomicMin keeps the
// smallest q, whatever the thread order).  Claims are negative, ids positive, so the two never mix.

#ifndef DL_HOST_EMULATION
#define DL_ROLLED _Pragma("unroll 1")
#endif

#define DLS_GOLDEN 0x9E3779B97F4A7C15ull
#define DLS_SMALL_MAX 64
#define DLS_FLOYD_MAX 64
#define DLS_CLAIM (1ll << 62)
#define DLS_RATIO_MIN 1e-280
#define DLS_RATIO_MAX 1e280

typedef unsigned long long dls_u64;

__device__ __forceinline__ long long dls_min(long long a, long long b) { return a < b ? a : b; }

// splitmix64's finaliser of a uint64.
__device__ __forceinline__ dls_u64 dls_mix(dls_u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The stream of one node at one hop of the batch keyed `key`.
__device__ __forceinline__ dls_u64 dls_node_stream(dls_u64 key, long long hop, long long node) {
    return dls_mix(dls_mix(key + ((dls_u64)hop + 1ull) * DLS_GOLDEN) ^ (dls_u64)node);
}

// The n-th 64-bit draw of a stream.
__device__ __forceinline__ dls_u64 dls_draw(dls_u64 stream, long long n) {
    return dls_mix(stream + ((dls_u64)n + 1ull) * DLS_GOLDEN);
}

// The high 64 bits of the 128-bit product a * b, from 32-bit halves (as kernels/sampling.mulhi64).
__device__ __forceinline__ dls_u64 dls_mulhi64(dls_u64 a, dls_u64 b) {
    const dls_u64 a0 = a & 0xFFFFFFFFull, a1 = a >> 32;
    const dls_u64 b0 = b & 0xFFFFFFFFull, b1 = b >> 32;
    const dls_u64 p01 = a0 * b1, p10 = a1 * b0;
    const dls_u64 mid = ((a0 * b0) >> 32) + (p01 & 0xFFFFFFFFull) + (p10 & 0xFFFFFFFFull);
    return a1 * b1 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

// A uniform integer in [0, m) from a 64-bit draw, exact for 1 <= m < 2^63: Lemire's method (ACM TOMACS 29(1),
// 2019, https://arxiv.org/abs/1805.10941), redrawing x = mix(x + GOLDEN) while x * m's low half is below 2^64 mod m.
__device__ __forceinline__ long long dls_below(dls_u64 x, long long m) {
    const dls_u64 um = (dls_u64)m;
    if (x * um < um) {  // only then can the low half be below 2^64 mod m (< m): the rare, slow path
        const dls_u64 t = (0ull - um) % um;
        while (x * um < t) x = dls_mix(x + DLS_GOLDEN);
    }
    return (long long)dls_mulhi64(x, um);
}

// A uniform real in (0, 1] from a 64-bit draw.
__device__ __forceinline__ double dls_unit(dls_u64 x) {
    return ((double)(x >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

// How many edges a node of in-degree d (`positive` of them of positive weight) gives.
__device__ __forceinline__ long long dls_pick_count(long long d, long long k, int replace, long long positive) {
    (void)d;
    if (k < 0) return positive;
    if (replace) return positive > 0 ? k : 0;
    return dls_min(k, positive);
}

// d <= 64: Floyd's algorithm over a 64-bit set of offsets, for the smaller of the picks and their complement.
__device__ __forceinline__ void dls_small(dls_u64 stream, long long d, long long k, long long* out) {
    const long long m = 2 * k <= d ? k : d - k;
    dls_u64 bits = 0;
    long long n = 0;
    for (long long j = d - m; j < d; ++j) {
        long long t = dls_below(dls_draw(stream, n), j + 1);
        if ((bits >> t) & 1ull) t = j;
        bits |= 1ull << t;
        ++n;
    }
    if (m != k) bits = ~bits;
    long long q = 0;
    for (long long j = 0; j < d; ++j) {
        if ((bits >> j) & 1ull) out[q++] = j;
    }
}

__device__ __forceinline__ void dls_floyd(dls_u64 stream, long long d, long long k, long long* out) {
    long long n = 0;
    for (long long j = d - k; j < d; ++j) {
        long long t = dls_below(dls_draw(stream, n), j + 1);
        for (long long q = 0; q < n; ++q) {
            if (out[q] == t) {
                t = j;
                break;
            }
        }
        out[n] = t;
        ++n;
    }
}

__device__ __forceinline__ void dls_reservoir(dls_u64 stream, long long d, long long k, long long* out) {
    for (long long j = 0; j < k; ++j) out[j] = j;
    for (long long j = k; j < d; ++j) {
        const long long r = dls_below(dls_draw(stream, j - k), j + 1);
        if (r < k) out[r] = j;
    }
}

// Whether every positive weight of the node lies in [DLS_RATIO_MIN, DLS_RATIO_MAX], where -log(u) / w is finite
// and normal (-log(u) is at most 36.8): the keys then need one log, not three.
template <typename W>
__device__ __forceinline__ bool dls_ratio_keys(const W* w, long long d) {
    for (long long j = 0; j < d; ++j) {
        const double wj = (double)w[j];
        if (wj > 0.0 && (wj < DLS_RATIO_MIN || wj > DLS_RATIO_MAX)) return false;
    }
    return true;
}

// The k smallest keys -log(u) / w, kept sorted by insertion; zero weights never enter.  Where a weight of the node
// lies outside [DLS_RATIO_MIN, DLS_RATIO_MAX], their logs log(-log(u)) - log(w) (the same order: -log(u)/w is inf
// for w = 5e-324, and equal infinite keys all tie).
template <typename W>
__device__ __forceinline__ void dls_weighted(dls_u64 stream, const W* w, long long d, long long k, long long* out,
                                             double* keys) {
    const bool ratio = dls_ratio_keys(w, d);
    long long n = 0;
    for (long long j = 0; j < d; ++j) {
        const double wj = (double)w[j];
        if (!(wj > 0.0)) continue;
        const double g = -log(dls_unit(dls_draw(stream, j)));
        const double e = ratio ? g / wj : log(g) - log(wj);
        if (n == k && e >= keys[n - 1]) continue;
        long long q = n < k ? n : k - 1;
        while (q > 0 && keys[q - 1] > e) {
            keys[q] = keys[q - 1];
            out[q] = out[q - 1];
            --q;
        }
        keys[q] = e;
        out[q] = j;
        if (n < k) ++n;
    }
}

// Two powers of two whose product 2^s brings the largest weight into [0.5, 1); w * s1 * s2 rounds once (the first
// product is exact whenever s2 is not 1: every weight is then below 2^-1023).
template <typename W>
__device__ __forceinline__ void dls_scale(const W* w, long long d, double* s1, double* s2) {
    double top = 0.0;
    for (long long j = 0; j < d; ++j) {
        if ((double)w[j] > top) top = (double)w[j];
    }
    int e;
    frexp(top, &e);
    const int s = -e;
    const int first = s < 1023 ? s : 1023;
    *s1 = ldexp(1.0, first);
    *s2 = ldexp(1.0, s - first);
}

// Inverse CDF over the weights scaled by 2^s: the total stays below d and subnormal weights keep their ratios.
template <typename W>
__device__ __forceinline__ void dls_weighted_replace(dls_u64 stream, const W* w, long long d, long long k,
                                                     long long* out) {
    double s1, s2;
    dls_scale(w, d, &s1, &s2);
    double total = 0.0;
    long long last = 0;
    for (long long j = 0; j < d; ++j) {
        if ((double)w[j] > 0.0) {
            total += (double)w[j] * s1 * s2;
            last = j;
        }
    }
    for (long long n = 0; n < k; ++n) {
        const double target = dls_unit(dls_draw(stream, n)) * total;
        double acc = 0.0;
        long long pick_j = last;
        for (long long j = 0; j < d; ++j) {
            if ((double)w[j] > 0.0) {
                acc += (double)w[j] * s1 * s2;
                if (target <= acc) {
                    pick_j = j;
                    break;
                }
            }
        }
        out[n] = pick_j;
    }
}

// One node's `count` picked edge offsets (0 <= p < d) into out[0 .. count); w is the node's first weight.
template <typename W>
__device__ __forceinline__ void dls_pick(dls_u64 stream, const W* w, long long d, long long count, int replace,
                                         long long* out, double* keys) {
    if (count == 0) return;
    if (w != nullptr) {
        if (replace) {
            dls_weighted_replace(stream, w, d, count, out);
        } else {
            dls_weighted(stream, w, d, count, out, keys);
        }
    } else if (replace) {
        for (long long n = 0; n < count; ++n) out[n] = dls_below(dls_draw(stream, n), d);
    } else if (count >= d) {
        for (long long j = 0; j < d; ++j) out[j] = j;
    } else if (d <= DLS_SMALL_MAX) {
        dls_small(stream, d, count, out);
    } else if (count <= DLS_FLOYD_MAX) {
        dls_floyd(stream, d, count, out);
    } else {
        dls_reservoir(stream, d, count, out);
    }
}

// The frontier's size: nodes[*lo_at .. *hi_at), at most `bound`.
__device__ __forceinline__ long long dls_span(const long long* lo_at, const long long* hi_at, long long bound) {
    return dls_min(*hi_at - *lo_at, bound);
}

// counts[i] = the picks of frontier node i, for i < bound (0 past the frontier).
template <typename P, typename W>
__global__ void sample_counts(const P* __restrict__ indptr, const W* __restrict__ weights,
                              const long long* __restrict__ nodes, const long long* lo_at, const long long* hi_at,
                              long long bound, long long k, int replace, long long* __restrict__ counts) {
    const long long lo = *lo_at;
    const long long n = dls_span(lo_at, hi_at, bound);
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < bound; i += stride) {
        if (i >= n) {
            counts[i] = 0;
            continue;
        }
        const long long v = nodes[lo + i];
        const long long e0 = (long long)indptr[v];
        const long long d = (long long)indptr[v + 1] - e0;
        long long positive = d;
        if (weights != nullptr) {
            positive = 0;
            for (long long j = 0; j < d; ++j) {
                if ((double)weights[e0 + j] > 0.0) ++positive;
            }
        }
        counts[i] = dls_pick_count(d, k, replace, positive);
    }
}

// Frontier node i's picks at [offsets[i], offsets[i + 1]) (sample_counts' counts, scanned): its neighbours in nbr, their edge ids in eid
// (eids[e], or the position e in indices), and, when col is not null, i's batch-local id *lo_at + i.
// keys: scratch of one double per pick (weighted picks without replacement only, else null).
template <typename P, typename I, typename E, typename W>
__global__ void sample_picks(const P* __restrict__ indptr, const I* __restrict__ indices,
                             const E* __restrict__ eids, const W* __restrict__ weights,
                             const long long* __restrict__ nodes, const long long* lo_at, const long long* hi_at,
                             long long bound, int replace, dls_u64 key, long long hop,
                             const long long* __restrict__ offsets, I* __restrict__ nbr, long long* __restrict__ eid,
                             double* __restrict__ keys, long long* __restrict__ col) {
    const long long lo = *lo_at;
    const long long n = dls_span(lo_at, hi_at, bound);
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long off = offsets[i];
        const long long count = offsets[i + 1] - off;
        if (count == 0) continue;
        const long long v = nodes[lo + i];
        const long long e0 = (long long)indptr[v];
        const long long d = (long long)indptr[v + 1] - e0;
        dls_pick<W>(dls_node_stream(key, hop, v), weights != nullptr ? weights + e0 : nullptr, d, count, replace,
                    eid + off, keys != nullptr ? keys + off : nullptr);
        for (long long q = off; q < off + count; ++q) {
            const long long e = e0 + eid[q];
            nbr[q] = indices[e];
            eid[q] = eids != nullptr ? (long long)eids[e] : e;
            if (col != nullptr) col[q] = lo + i;
        }
    }
}

// Relabelling: q runs over the picked edges (or the seeds) [0, min(*total_at, bound)).
__device__ __forceinline__ long long dls_edges(const long long* total_at, long long bound) {
    return dls_min(*total_at, bound);
}

// Each node not yet in the batch is claimed by the first edge q that picked it.
template <typename I>
__global__ void relabel_claim(const I* __restrict__ nbr, const long long* total_at, long long bound,
                              long long* marks) {
    const long long total = dls_edges(total_at, bound);
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += stride) {
        const long long v = (long long)nbr[q];
        // A node in the batch keeps its positive mark through this kernel: the plain read is race-free.
        if (marks[v] <= 0) atomicMin(&marks[v], q - DLS_CLAIM);
    }
}

// nodes[i] = seeds[i] for i < min(*total_at, bound), each seed in its place (a repeated one too); marks[v] = the
// first place of v plus one, from relabel_claim's claims over the seeds (kernels/sampling.place_seeds).
template <typename I>
__global__ void place_seeds(const I* __restrict__ seeds, const long long* total_at, long long bound,
                            long long* marks, long long* __restrict__ nodes) {
    const long long total = dls_edges(total_at, bound);
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long v = (long long)seeds[i];
        nodes[i] = v;
        // Only the first place of v writes marks[v], as in relabel_append.
        if (marks[v] == i - DLS_CLAIM) marks[v] = i + 1;
    }
}

// flags[q] = 1 where edge q claimed its node, for q < bound (0 past the edges).
template <typename I>
__global__ void relabel_flag(const I* __restrict__ nbr, const long long* total_at, long long bound,
                             const long long* __restrict__ marks, long long* __restrict__ flags) {
    const long long total = dls_edges(total_at, bound);
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < bound; q += stride) {
        flags[q] = q < total && marks[(long long)nbr[q]] == q - DLS_CLAIM ? 1 : 0;
    }
}

// The claiming edge q appends its node at local id *count_at + scan[q] - 1 (scan: the flags' inclusive sum).
template <typename I>
__global__ void relabel_append(const I* __restrict__ nbr, const long long* total_at, long long bound,
                               long long* marks, const long long* __restrict__ scan, const long long* count_at,
                               long long* __restrict__ nodes) {
    const long long total = dls_edges(total_at, bound);
    const long long count = *count_at;
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += stride) {
        const long long v = (long long)nbr[q];
        // Only the claimer writes marks[v]; other edges of v see its claim or its id, never their own q.
        if (marks[v] == q - DLS_CLAIM) {
            const long long local = count + scan[q] - 1;
            nodes[local] = v;
            marks[v] = local + 1;
        }
    }
}

// rows[q] = the batch-local id of edge q's node.
template <typename I>
__global__ void relabel_rows(const I* __restrict__ nbr, const long long* total_at, long long bound,
                             const long long* __restrict__ marks, long long* __restrict__ rows) {
    const long long total = dls_edges(total_at, bound);
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += stride) {
        rows[q] = marks[(long long)nbr[q]] - 1;
    }
}

// marks[nodes[i]] = 0 for i < min(*count_at, bound): only the marks a batch touched.
__global__ void reset_marks(long long* marks, const long long* __restrict__ nodes, const long long* count_at,
                            long long bound) {
    const long long count = dls_min(*count_at, bound);
    const long long stride = (long long)gridDim.x * blockDim.x;
    DL_ROLLED
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        marks[nodes[i]] = 0;
    }
}
