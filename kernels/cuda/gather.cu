// Row gather kernels for directload, one job each:
//  - gather_naive: one thread per output element (PyTorch's old index kernel's access pattern);
//  - gather_aligned: one warp per row, each warp step confined to whole 128-byte lines, circular
//    shift at the row head (PyTorch-Direct's kernel);
//  - gather_rowvec: a whole row at once in W-byte vectors (the units wholly inside the row, in the
//    source's alignment) plus naturally aligned scalar pieces at its head and tail, with sub-warps of
//    `lanes` lanes so small rows share a warp; each lane issues all its loads before its stores;
//  - check_clamp: ids checked and clamped for torch's index_select;
//  - gather_tiered_*: rows from a GPU cache or a flat mapped tier.
//
// Bounds (naive, aligned, rowvec and check_clamp; the tiered kernels take a `where` the caller
// checked): an id < 0 or >= n_rows stores `stamp` into *err (when err is not null: a word of pinned,
// GPU-mapped host memory; a plain, idempotent store) and is clamped into the table before any load,
// because an out-of-range read of mapped memory kills the CUDA context.
// Sorted ids: work item i writes output row pos[i] when pos is not null (torch.sort's permutation).
//
// T is the bit-carrier of an element (unsigned char/short/int/long long: the gather copies bits, so
// fp16, bf16 and int16 share one specialisation; uint4 for 16-byte units), I the index type (int or
// long long).  All offsets are 64-bit; no kernel body of naive or rowvec divides 64-bit integers.
//
// Every load and store of table or output bytes goes through dl_load/dl_store.  On a GPU they are
// plain accesses; the host emulation (kernels/cuda/cuda_shim.h) counts any that is misaligned for its
// width (x86 would allow it silently; a GPU faults) or falls outside the launch's table or output.
//
// dl_aligned_geometry / dl_aligned_span mirror kernels/indexing.py line for line; tests compare the
// two input by input, and the host-emulation build (kernels/cuda/emu_launch.cpp) runs these very
// kernels on the CPU.

#ifndef DL_HOST_EMULATION
#define DL_UNROLL _Pragma("unroll")
// A grid-stride loop left rolled: unrolling it costs a 64-bit division for the trip count.
#define DL_ROLLED _Pragma("unroll 1")

template <typename T>
__device__ __forceinline__ T dl_load(const void* p) {
    return *static_cast<const T*>(p);
}

template <typename T>
__device__ __forceinline__ void dl_store(void* p, T v) {
    *static_cast<T*>(p) = v;
}
#endif

// The bounds contract: a bad id flags *err with stamp and is clamped to [0, n_rows - 1].
__device__ __forceinline__ long long dl_checked_row(long long id, long long n_rows, unsigned long long* err,
                                                    unsigned long long stamp) {
    if (id < 0 || id >= n_rows) {
        if (err != nullptr) *err = stamp;
        id = id < 0 ? 0 : n_rows - 1;
    }
    return id;
}

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
__global__ void gather_naive(const T* __restrict__ src, const I* __restrict__ idx, const long long* __restrict__ pos,
                             T* __restrict__ out, long long n_idx, long long row_elems, long long n_rows,
                             unsigned long long* err, unsigned long long stamp, long long* trace_tid,
                             int* trace_step) {
    // Thread tid copies flat elements tid, tid + stride, ... (naive_element in indexing.py).  The row and
    // column advance by the stride's quotient and remainder, found once in 32 bits, so the loop has no
    // 64-bit division.  Launches keep grid * block < 2^32.
    if (row_elems <= 0) return;
    const long long total = n_idx * row_elems;
    const unsigned int stride = gridDim.x * blockDim.x;
    const unsigned int tid = blockIdx.x * blockDim.x + threadIdx.x;
    long long r = 0, c = tid, dr = 0, dc = stride;
    if (row_elems <= 0xFFFFFFFFLL) {
        const unsigned int re = (unsigned int)row_elems;
        r = tid / re;
        c = tid % re;
        dr = stride / re;
        dc = stride % re;
    }
    long long step = 0;
    DL_ROLLED
    for (long long i = tid; i < total; i += stride, ++step) {
        const long long row = dl_checked_row((long long)idx[r], n_rows, err, stamp);
        const long long at = (pos != nullptr ? pos[r] : r) * row_elems + c;
        dl_store<T>(out + at, dl_load<T>(src + row * row_elems + c));
        dl_trace(trace_tid, trace_step, at, tid, step);
        r += dr;
        c += dc;
        if (c >= row_elems) {
            c -= row_elems;
            ++r;
        }
    }
}

template <typename T, typename I>
__global__ void gather_aligned(const T* __restrict__ src, const I* __restrict__ idx,
                               const long long* __restrict__ pos, T* __restrict__ out, long long n_idx,
                               long long row_elems, long long n_rows, unsigned long long* err,
                               unsigned long long stamp, long long* trace_tid, int* trace_step) {
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
        const long long row = dl_checked_row((long long)idx[r], n_rows, err, stamp);
        const long long dst = pos != nullptr ? pos[r] : r;
        const long long row_addr = src_mod + row * row_bytes;
        const T* s = src + row * row_elems;
        T* o = out + dst * row_elems;
        const DlGeometry g = dl_aligned_geometry(row_addr, row_bytes, elem, DL_WARP, DL_LINE);
        for (long long step = 0; step < g.steps; ++step) {
            long long lo, hi;
            dl_aligned_span(lane, step, row_addr, row_bytes, elem, DL_WARP, g, &lo, &hi);
            if constexpr (sizeof(T) < 4) {
                if (hi - lo == 4 / (long long)sizeof(T)) {
                    // A whole 4-byte word inside the row: one aligned 32-bit load.
                    const unsigned int w = dl_load<unsigned int>(s + lo);
                    for (long long c = lo; c < hi; ++c) {
                        dl_store<T>(o + c, (T)(w >> (8 * sizeof(T) * (c - lo))));  // little-endian
                        dl_trace(trace_tid, trace_step, dst * row_elems + c, tid, step);
                    }
                    continue;
                }
            }
            // One element per lane; with T = uint4 (16-byte units, chosen by the caller
            // when rows and both tables are 16-byte aligned) a vector load and store.
            for (long long c = lo; c < hi; ++c) {
                dl_store<T>(o + c, dl_load<T>(s + c));
                dl_trace(trace_tid, trace_step, dst * row_elems + c, tid, step);
            }
        }
    }
}

// ---- rowvec: a whole row at once ------------------------------------------------------------------

// The vector type of each load width, and its log2.
template <int W> struct DlVec;
template <> struct DlVec<16> { typedef uint4 type; };
template <> struct DlVec<8> { typedef unsigned long long type; };
template <> struct DlVec<4> { typedef unsigned int type; };
template <> struct DlVec<2> { typedef unsigned short type; };
template <> struct DlVec<1> { typedef unsigned char type; };

template <int W> struct DlLog2 { static constexpr int value = 1 + DlLog2<W / 2>::value; };
template <> struct DlLog2<1> { static constexpr int value = 0; };

// One naturally aligned piece of n bytes (1, 2, 4 or 8), zero-extended.
__device__ __forceinline__ unsigned long long dl_load_n(const unsigned char* p, int n) {
    switch (n) {
        case 8: return dl_load<unsigned long long>(p);
        case 4: return dl_load<unsigned int>(p);
        case 2: return dl_load<unsigned short>(p);
        default: return dl_load<unsigned char>(p);
    }
}

// The low n bytes of v (n a power of two <= 8) at p, in the widest stores p's alignment allows.
__device__ __forceinline__ void dl_store_n(unsigned char* p, unsigned long long v, int n) {
    const unsigned int a = (unsigned int)(unsigned long long)p;
    int w = (int)(a & (0u - a));  // p's alignment: its lowest set address bit
    if (w == 0 || w > n) w = n;
    for (int k = 0; k < n; k += w) {
        const unsigned long long part = v >> (8 * k);  // little-endian, as on x86 and NVIDIA GPUs
        switch (w) {
            case 8: dl_store<unsigned long long>(p + k, part); break;
            case 4: dl_store<unsigned int>(p + k, (unsigned int)part); break;
            case 2: dl_store<unsigned short>(p + k, (unsigned short)part); break;
            default: dl_store<unsigned char>(p + k, (unsigned char)part); break;
        }
    }
}

// A vector at p: one store when p is as aligned as the vector, else the widest narrower ones.
__device__ __forceinline__ void dl_store_vec(unsigned char* p, uint4 v) {
    if (((unsigned int)(unsigned long long)p & 15u) == 0) {
        dl_store<uint4>(p, v);
        return;
    }
    dl_store_n(p, (unsigned long long)v.x | ((unsigned long long)v.y << 32), 8);
    dl_store_n(p + 8, (unsigned long long)v.z | ((unsigned long long)v.w << 32), 8);
}

template <typename V>
__device__ __forceinline__ void dl_store_vec(unsigned char* p, V v) {
    dl_store_n(p, (unsigned long long)v, (int)sizeof(V));
}

// Piece j of a row's scalar part: the bytes outside its whole W-aligned units, [0, hb) and then
// [ts, row_bytes), in naturally aligned 1/2/4/8-byte pieces (at most 2 log2 W of them).  mis is the
// row's source address modulo W.  The head climbs to W alignment (an ascending ladder) and, when the
// row ends first, steps down over what is left; the tail starts aligned and steps down.
// Returns false when there is no piece j.
template <int W>
__device__ __forceinline__ bool dl_piece(unsigned int mis, long long hb, long long ts, long long row_bytes, int j,
                                         long long* off, int* n) {
    int k = 0;
    long long x = 0;
    DL_UNROLL
    for (int p = 1; p < W; p <<= 1) {
        if (((mis + (unsigned int)x) & (unsigned int)p) != 0) {
            if (x + p > hb) break;
            if (k++ == j) {
                *off = x;
                *n = p;
                return true;
            }
            x += p;
        }
    }
    DL_UNROLL
    for (int p = W / 2; p >= 1; p >>= 1) {
        if (((hb - x) & p) != 0) {
            if (k++ == j) {
                *off = x;
                *n = p;
                return true;
            }
            x += p;
        }
    }
    x = ts;
    DL_UNROLL
    for (int p = W / 2; p >= 1; p >>= 1) {
        if (((row_bytes - x) & p) != 0) {
            if (k++ == j) {
                *off = x;
                *n = p;
                return true;
            }
            x += p;
        }
    }
    return false;
}

// Loads in flight per lane before it stores (a 2 KiB row is 4 x 16 B per lane of a warp).
#define DL_BATCH 4

// gather_rowvec<I, W>: out row (pos ? pos[i] : i) = src row idx[i], rows of row_bytes bytes.
// `lanes` (a power of two, 1..32, dividing the block) lanes copy each row; the grid strides over rows.
template <typename I, int W>
__global__ void gather_rowvec(const unsigned char* __restrict__ src, const I* __restrict__ idx,
                              const long long* __restrict__ pos, unsigned char* __restrict__ out, long long n_idx,
                              long long row_bytes, long long n_rows, int lanes, unsigned long long* err,
                              unsigned long long stamp) {
    typedef typename DlVec<W>::type V;
    constexpr int LW = DlLog2<W>::value;
    const int lg = __ffs(lanes) - 1;
    const int lane = (int)(threadIdx.x & (unsigned int)(lanes - 1));
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long groups = ((long long)gridDim.x * blockDim.x) >> lg;
    const long long batch = (long long)lanes * DL_BATCH;
    DL_ROLLED
    for (long long i = t >> lg; i < n_idx; i += groups) {
        const long long row = dl_checked_row((long long)idx[i], n_rows, err, stamp);
        const long long dst = pos != nullptr ? pos[i] : i;
        const unsigned char* s = src + row * row_bytes;
        unsigned char* o = out + dst * row_bytes;
        // Vectors cover [hb, ts): the W-aligned source units wholly inside the row.
        const unsigned int mis = (unsigned int)(unsigned long long)s & (unsigned int)(W - 1);
        const long long head = (long long)((W - mis) & (unsigned int)(W - 1));
        const long long hb = head < row_bytes ? head : row_bytes;
        const long long nvec = head < row_bytes ? (row_bytes - head) >> LW : 0;
        const long long ts = hb + (nvec << LW);
        // This lane's first scalar piece is loaded now and stored after the vectors: its round trip
        // overlaps theirs.
        long long poff = 0;
        int pn = 0;
        const bool piece = dl_piece<W>(mis, hb, ts, row_bytes, lane, &poff, &pn);
        const unsigned long long pv = piece ? dl_load_n(s + poff, pn) : 0ull;
        const unsigned char* sv = s + hb;
        unsigned char* ov = o + hb;
        for (long long k = lane; k < nvec; k += batch) {
            V v[DL_BATCH] = {};
    DL_UNROLL
            for (int b = 0; b < DL_BATCH; ++b) {
                const long long kb = k + (long long)b * lanes;
                if (kb < nvec) v[b] = dl_load<V>(sv + (kb << LW));
            }
    DL_UNROLL
            for (int b = 0; b < DL_BATCH; ++b) {
                const long long kb = k + (long long)b * lanes;
                if (kb < nvec) dl_store_vec(ov + (kb << LW), v[b]);
            }
        }
        if (piece) dl_store_n(o + poff, pv, pn);
        // More pieces than lanes (a row has at most 2 log2 W; tiny sub-warps only): the rest one by one.
        if (lanes < 2 * LW) {
            for (int j = lane + lanes; dl_piece<W>(mis, hb, ts, row_bytes, j, &poff, &pn); j += lanes) {
                dl_store_n(o + poff, dl_load_n(s + poff, pn), pn);
            }
        }
    }
}

// check_clamp<I>: clamped[i] = idx[i] clamped into [0, n_rows - 1], a bad id flagging *err (the
// bounds contract), so torch's index_select can run over the mapped view without a device assert.
template <typename I>
__global__ void check_clamp(const I* __restrict__ idx, I* __restrict__ clamped, long long n, long long n_rows,
                            unsigned long long* err, unsigned long long stamp) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        clamped[i] = (I)dl_checked_row((long long)idx[i], n_rows, err, stamp);
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
        dl_store<T>(out + i, dl_load<T>((t.tier == 0 ? cache : flat) + t.first + c));
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
            for (long long c = lo; c < hi; ++c) dl_store<T>(o + c, dl_load<T>(s + c));
        }
    }
}

// ---- gather_decode: rows decoded inside the gather ---------------------------------------------------
// Output row i = decode(code row idx[i]).  CODEC 0 float16, 1 bfloat16, 2 int8 rowwise (dim uint8 codes, then
// the row's float32 scale and offset, little-endian, inside the row); OUT 0 float32, 1 float16, 2 bfloat16.
// The arithmetic is kernels/half_bits.py's and kernels/decode_cpu.py's, bit for bit: code * scale rounded, then
// + offset rounded (never a fused multiply-add: __fmul_rn/__fadd_rn); float to half rounded to nearest even.
// One warp per row, the grid striding over rows; each lane decodes groups of 4 features: one 4-byte (int8) or
// 8-byte (half) load of the group's codes where the group is aligned for it, and one 16-byte (float32) or
// 8-byte (half) store where the output is, else element by element.  Bounds as the other gathers.

#ifndef DL_HOST_EMULATION
__device__ __forceinline__ float dl_as_float(unsigned int b) { return __uint_as_float(b); }
__device__ __forceinline__ unsigned int dl_float_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float dl_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float dl_add_rn(float a, float b) { return __fadd_rn(a, b); }
#endif

__device__ __forceinline__ float dl_half_to_float(unsigned int h) {
    const unsigned int sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0x1Fu) return dl_as_float(sign | 0x7F800000u | (mant ? 0x00400000u : 0u) | (mant << 13));  // NaN quiet
    if (exp == 0u) {  // zero or subnormal: mant * 2**-24, exact in float32
        const float v = dl_mul_rn((float)mant, 5.9604644775390625e-08f);
        return sign ? -v : v;
    }
    return dl_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__device__ __forceinline__ unsigned short dl_float_to_half(float value) {
    const unsigned int f = dl_float_bits(value);
    const unsigned int sign = (f & 0x80000000u) >> 16, f_exp = f & 0x7F800000u;
    if (f_exp >= 0x47800000u) {
        const unsigned int f_sig = f & 0x007FFFFFu;
        if (f_exp == 0x7F800000u && f_sig != 0u) {
            const unsigned int nan = 0x7C00u + (f_sig >> 13);
            return (unsigned short)(sign + (nan == 0x7C00u ? nan + 1u : nan));
        }
        return (unsigned short)(sign + 0x7C00u);
    }
    if (f_exp <= 0x38000000u) {
        if (f_exp < 0x33000000u) return (unsigned short)sign;
        unsigned int f_sig = (0x00800000u + (f & 0x007FFFFFu)) >> (113u - (f_exp >> 23));
        if ((f_sig & 0x3FFFu) != 0x1000u || (f & 0x7FFu) != 0u) f_sig += 0x1000u;
        return (unsigned short)(sign + (f_sig >> 13));
    }
    const unsigned int h_exp = (f_exp - 0x38000000u) >> 13;
    unsigned int f_sig = f & 0x007FFFFFu;
    if ((f_sig & 0x3FFFu) != 0x1000u) f_sig += 0x1000u;
    return (unsigned short)(sign + (f_sig >> 13) + h_exp);
}

__device__ __forceinline__ unsigned short dl_float_to_bfloat(float value) {
    const unsigned int f = dl_float_bits(value);
    if ((f & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)0x7FC0u;
    return (unsigned short)((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16);
}

// 4 bytes at p as a little-endian word: one load where p is 4-aligned, else byte by byte.
__device__ __forceinline__ unsigned int dl_load_word(const unsigned char* p) {
    if (((unsigned int)(unsigned long long)p & 3u) == 0u) return dl_load<unsigned int>(p);
    return (unsigned int)dl_load<unsigned char>(p) | ((unsigned int)dl_load<unsigned char>(p + 1) << 8) |
           ((unsigned int)dl_load<unsigned char>(p + 2) << 16) | ((unsigned int)dl_load<unsigned char>(p + 3) << 24);
}

// The output bits of one feature of code `code` (an int8 code, or a half's bits).
template <int CODEC, int OUT>
__device__ __forceinline__ unsigned int dl_decode_bits(unsigned int code, float scale, float offset) {
    if ((CODEC == 0 && OUT == 1) || (CODEC == 1 && OUT == 2)) return code;  // the codes are the output's bits
    float x;
    if (CODEC == 2) {
        x = dl_add_rn(dl_mul_rn((float)code, scale), offset);
    } else if (CODEC == 1) {
        x = dl_as_float(code << 16);
    } else {
        x = dl_half_to_float(code);
    }
    if (OUT == 0) return dl_float_bits(x);
    return OUT == 1 ? dl_float_to_half(x) : dl_float_to_bfloat(x);
}

template <int CODEC, int OUT, typename I>
__global__ void gather_decode(const unsigned char* __restrict__ codes, const I* __restrict__ idx,
                              unsigned char* __restrict__ out, long long n, long long code_row_bytes, long long dim,
                              long long n_rows, unsigned long long* err, unsigned long long stamp) {
    constexpr long long CODE = CODEC == 2 ? 1 : 2, OUTB = OUT == 0 ? 4 : 2;
    const long long lane = threadIdx.x % DL_WARP;
    const long long warps_per_block = blockDim.x / DL_WARP;
    const long long total_warps = (long long)gridDim.x * warps_per_block;
    const long long groups = (dim + 3) >> 2;
    DL_ROLLED
    for (long long i = (long long)blockIdx.x * warps_per_block + threadIdx.x / DL_WARP; i < n; i += total_warps) {
        const long long r = dl_checked_row((long long)idx[i], n_rows, err, stamp);
        const unsigned char* row = codes + r * code_row_bytes;
        unsigned char* o = out + i * dim * OUTB;
        float scale = 0.0f, offset = 0.0f;
        if (CODEC == 2) {
            scale = dl_as_float(dl_load_word(row + dim));
            offset = dl_as_float(dl_load_word(row + dim + 4));
        }
        DL_ROLLED
        for (long long g = lane; g < groups; g += DL_WARP) {
            const long long c0 = g << 2;
            const int k = dim - c0 < 4 ? (int)(dim - c0) : 4;
            const unsigned char* s = row + c0 * CODE;
            unsigned int code[4] = {0u, 0u, 0u, 0u};
            if (k == 4 && ((unsigned int)(unsigned long long)s & (unsigned int)(4 * CODE - 1)) == 0u) {
                const unsigned long long v = CODE == 1 ? (unsigned long long)dl_load<unsigned int>(s)
                                                       : dl_load<unsigned long long>(s);
                DL_UNROLL
                for (int j = 0; j < 4; ++j) code[j] = (unsigned int)(v >> (8 * CODE * j)) & (CODE == 1 ? 0xFFu : 0xFFFFu);
            } else {
                for (int j = 0; j < k; ++j) {
                    code[j] = CODE == 1 ? (unsigned int)dl_load<unsigned char>(s + j)
                                        : (unsigned int)dl_load<unsigned short>(s + 2 * j);
                }
            }
            unsigned int bits[4];
            DL_UNROLL
            for (int j = 0; j < 4; ++j) bits[j] = dl_decode_bits<CODEC, OUT>(code[j], scale, offset);
            unsigned char* d = o + c0 * OUTB;
            if (k == 4 && ((unsigned int)(unsigned long long)d & (unsigned int)(4 * OUTB - 1)) == 0u) {
                if (OUTB == 4) {
                    dl_store<uint4>(d, uint4{bits[0], bits[1], bits[2], bits[3]});
                } else {
                    dl_store<unsigned long long>(d, (unsigned long long)bits[0] | ((unsigned long long)bits[1] << 16) |
                                                        ((unsigned long long)bits[2] << 32) |
                                                        ((unsigned long long)bits[3] << 48));
                }
            } else {
                for (int j = 0; j < k; ++j) {
                    if (OUTB == 4) {
                        dl_store<unsigned int>(d + 4 * j, bits[j]);
                    } else {
                        dl_store<unsigned short>(d + 2 * j, (unsigned short)bits[j]);
                    }
                }
            }
        }
    }
}
