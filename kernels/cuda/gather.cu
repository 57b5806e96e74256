// Row gather kernels for directload: naive (one thread per output element, the
// access pattern of PyTorch's index kernel) and aligned (one warp per row, every
// warp step confined to whole 128-byte lines, circular shift at the row head).
//
// T is the bit-carrier of the element (unsigned char/short/int/long long: the
// gather copies bits, so fp16, bf16 and int16 share one specialisation; uint4
// for 16-byte vector units where rows allow), I the index type (int or long
// long).  All offsets are 64-bit.
//
// dl_aligned_geometry / dl_aligned_span mirror kernels/indexing.py line for
// line; tests compare the two input by input, and the host-emulation build
// (kernels/cuda/emu_launch.cpp) runs these very kernels on the CPU.

#define DL_WARP 32
#define DL_LINE 128

struct DlGeometry {
    long long base, first, last, steps, wrap;
};

__host__ __device__ __forceinline__ DlGeometry dl_aligned_geometry(
    long long row_addr, long long row_bytes, long long elem, long long warp, long long line) {
    const long long u = elem >= 4 ? elem : 4;
    DlGeometry g;
    g.base = row_addr - row_addr % line;
    g.first = (row_addr - g.base) / u;
    g.last = (row_addr + row_bytes - 1 - g.base) / u;
    const long long windows = (g.last + warp) / warp;
    const long long tail = g.last + 1 - warp * (windows - 1);
    g.wrap = tail <= g.first ? tail : 0;
    g.steps = g.wrap > 0 ? windows - 1 : windows;
    return g;
}

// Elements [*lo, *hi) of the row that `lane` copies at `step`; empty means idle.
__host__ __device__ __forceinline__ void dl_aligned_span(
    long long lane, long long step, long long row_addr, long long row_bytes, long long elem,
    long long warp, const DlGeometry& g, long long* lo, long long* hi) {
    const long long unit = (step == 0 && lane < g.wrap) ? lane + warp * g.steps : step * warp + lane;
    if (unit < g.first || unit > g.last) {
        *lo = 0;
        *hi = 0;
        return;
    }
    const long long u = elem >= 4 ? elem : 4;
    long long a = g.base + unit * u - row_addr;
    long long b = a + u;
    if (a < 0) a = 0;
    if (b > row_bytes) b = row_bytes;
    *lo = a / elem;
    *hi = b / elem;
}

// Optional trace (null in production): which thread and step wrote each output
// element, so tests can check the kernel against the model thread by thread.
__device__ __forceinline__ void dl_trace(long long* trace_tid, int* trace_step, long long pos,
                                         long long tid, long long step) {
    if (trace_tid != nullptr) {
        trace_tid[pos] = tid;
        trace_step[pos] = (int)step;
    }
}

template <typename T, typename I>
__global__ void gather_naive(const T* __restrict__ src, const I* __restrict__ idx,
                             T* __restrict__ out, long long n_idx, long long row_elems,
                             long long* trace_tid, int* trace_step) {
    const long long total = n_idx * row_elems;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long step = 0;
    for (long long i = tid; i < total; i += stride, ++step) {
        const long long r = i / row_elems;  // naive_element(i, row_elems)
        const long long c = i % row_elems;
        out[i] = src[(long long)idx[r] * row_elems + c];
        dl_trace(trace_tid, trace_step, i, tid, step);
    }
}

template <typename T, typename I>
__global__ void gather_aligned(const T* __restrict__ src, const I* __restrict__ idx,
                               T* __restrict__ out, long long n_idx, long long row_elems,
                               long long* trace_tid, int* trace_step) {
    const long long elem = (long long)sizeof(T);
    const long long row_bytes = row_elems * elem;
    // Row addresses count from the line below src; only the remainder matters.
    const long long src_mod = (long long)((unsigned long long)src % DL_LINE);
    const long long warps_per_block = blockDim.x / DL_WARP;
    const long long lane = threadIdx.x % DL_WARP;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total_warps = (long long)gridDim.x * warps_per_block;
    for (long long r = (long long)blockIdx.x * warps_per_block + threadIdx.x / DL_WARP; r < n_idx;
         r += total_warps) {
        const long long row = (long long)idx[r];
        const long long row_addr = src_mod + row * row_bytes;
        const T* s = src + row * row_elems;
        T* o = out + r * row_elems;
        const DlGeometry g = dl_aligned_geometry(row_addr, row_bytes, elem, DL_WARP, DL_LINE);
        for (long long step = 0; step < g.steps; ++step) {
            long long lo, hi;
            dl_aligned_span(lane, step, row_addr, row_bytes, elem, DL_WARP, g, &lo, &hi);
            if constexpr (sizeof(T) < 4) {
                if (hi - lo == 4 / (long long)sizeof(T)) {
                    // A whole 4-byte word inside the row: one aligned 32-bit load.
                    const unsigned int w = *reinterpret_cast<const unsigned int*>(s + lo);
                    for (long long c = lo; c < hi; ++c) {
                        o[c] = (T)(w >> (8 * sizeof(T) * (c - lo)));  // little-endian
                        dl_trace(trace_tid, trace_step, r * row_elems + c, tid, step);
                    }
                    continue;
                }
            }
            // One element per lane; with T = uint4 (16-byte units, chosen by the caller
            // when rows and both tables are 16-byte aligned) a vector load and store.
            for (long long c = lo; c < hi; ++c) {
                o[c] = s[c];
                dl_trace(trace_tid, trace_step, r * row_elems + c, tid, step);
            }
        }
    }
}

// The tiered gather: output row r comes from the cache (where[r] >= 0: slot where[r]) or from
// the flat tier (where[r] < 0: the row at element -where[r]-1, e.g. in mapped staging memory).
// dl_tier_row mirrors kernels/indexing.tier_row.
struct DlTierRow {
    long long tier, first, row_addr;
};

__host__ __device__ __forceinline__ DlTierRow dl_tier_row(long long where, long long row_elems, long long elem,
                                                         long long cache_mod, long long flat_mod) {
    DlTierRow t;
    if (where >= 0) {
        t.tier = 0;
        t.first = where * row_elems;
        t.row_addr = cache_mod + t.first * elem;
    } else {
        t.tier = 1;
        t.first = -where - 1;
        t.row_addr = flat_mod + t.first * elem;
    }
    return t;
}

template <typename T>
__global__ void gather_tiered_naive(const T* __restrict__ cache, const T* __restrict__ flat,
                                    const long long* __restrict__ where, T* __restrict__ out, long long n,
                                    long long row_elems) {
    const long long total = n * row_elems;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long r = i / row_elems;
        const long long c = i % row_elems;
        const DlTierRow t = dl_tier_row(where[r], row_elems, 1, 0, 0);
        out[i] = (t.tier == 0 ? cache : flat)[t.first + c];
    }
}

template <typename T>
__global__ void gather_tiered_aligned(const T* __restrict__ cache, const T* __restrict__ flat,
                                      const long long* __restrict__ where, T* __restrict__ out, long long n,
                                      long long row_elems) {
    const long long elem = (long long)sizeof(T);
    const long long row_bytes = row_elems * elem;
    const long long cache_mod = (long long)((unsigned long long)cache % DL_LINE);
    const long long flat_mod = (long long)((unsigned long long)flat % DL_LINE);
    const long long warps_per_block = blockDim.x / DL_WARP;
    const long long lane = threadIdx.x % DL_WARP;
    const long long total_warps = (long long)gridDim.x * warps_per_block;
    for (long long r = (long long)blockIdx.x * warps_per_block + threadIdx.x / DL_WARP; r < n; r += total_warps) {
        const DlTierRow t = dl_tier_row(where[r], row_elems, elem, cache_mod, flat_mod);
        const T* s = (t.tier == 0 ? cache : flat) + t.first;
        T* o = out + r * row_elems;
        const DlGeometry g = dl_aligned_geometry(t.row_addr, row_bytes, elem, DL_WARP, DL_LINE);
        for (long long step = 0; step < g.steps; ++step) {
            long long lo, hi;
            dl_aligned_span(lane, step, t.row_addr, row_bytes, elem, DL_WARP, g, &lo, &hi);
            for (long long c = lo; c < hi; ++c) o[c] = s[c];
        }
    }
}
