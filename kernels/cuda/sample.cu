// Neighbour sampling kernels for directload: the GPU twin of kernels/sampling.py (its module docstring is the
// spec of the random streams and the picks).  The device functions below mirror that file line for line, so the
// same key gives the same picks on either device.  The one allowed difference: a weighted pick compares keys
// -log(u) / w, and CUDA's log may differ from the CPU's libm in the last ulp (CUDA C++ Programming Guide,
// "Mathematical Functions": log has 1 ulp of maximum error), which can swap two near-equal keys.
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

// A uniform integer in [0, m) from a 64-bit draw (m < 2^32).
__device__ __forceinline__ long long dls_below(dls_u64 x, long long m) {
    return (long long)(((x >> 32) * (dls_u64)m) >> 32);
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

// The k smallest keys -log(u)/w, kept sorted by insertion; zero weights never enter.
template <typename W>
__device__ __forceinline__ void dls_weighted(dls_u64 stream, const W* w, long long d, long long k, long long* out,
                                             double* keys) {
    long long n = 0;
    for (long long j = 0; j < d; ++j) {
        const double wj = (double)w[j];
        if (!(wj > 0.0)) continue;
        const double e = -log(dls_unit(dls_draw(stream, j))) / wj;
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

template <typename W>
__device__ __forceinline__ void dls_weighted_replace(dls_u64 stream, const W* w, long long d, long long k,
                                                     long long* out) {
    double total = 0.0;
    long long last = 0;
    for (long long j = 0; j < d; ++j) {
        if ((double)w[j] > 0.0) {
            total += (double)w[j];
            last = j;
        }
    }
    for (long long n = 0; n < k; ++n) {
        const double target = dls_unit(dls_draw(stream, n)) * total;
        double acc = 0.0;
        long long pick_j = last;
        for (long long j = 0; j < d; ++j) {
            if ((double)w[j] > 0.0) {
                acc += (double)w[j];
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
