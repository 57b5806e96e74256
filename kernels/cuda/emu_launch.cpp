// Host-emulation launcher: loops over blocks and threads and calls the kernels of
// gather.cu as ordinary functions.  Built by kernels/host_emu.py with g++, with
// emu_sample.cpp (sample.cu's kernels) beside it in one library.
#include "cuda_shim.h"

#include "gather.cu"

dim3 threadIdx, blockIdx, blockDim, gridDim;

long long dl_emu_misaligned = 0, dl_emu_stray_loads = 0, dl_emu_stray_stores = 0;
static const std::uintptr_t kOpen = ~std::uintptr_t(0);
std::uintptr_t dl_emu_load_lo = 0, dl_emu_load_hi = kOpen, dl_emu_store_lo = 0, dl_emu_store_hi = kOpen;

// The bytes a launch may load (its table) and store (its output); null opens a fence.
static void fence(const void* src, long long src_bytes, const void* out, long long out_bytes) {
    const std::uintptr_t s = reinterpret_cast<std::uintptr_t>(src), o = reinterpret_cast<std::uintptr_t>(out);
    dl_emu_load_lo = src ? s : 0;
    dl_emu_load_hi = src ? s + (std::uintptr_t)src_bytes : kOpen;
    dl_emu_store_lo = out ? o : 0;
    dl_emu_store_hi = out ? o + (std::uintptr_t)out_bytes : kOpen;
}

// Arguments of one row-gather launch (naive or aligned), as the kernels take them.
struct GatherArgs {
    const void* src;
    const void* idx;
    const long long* pos;
    void* out;
    long long n_idx, row_elems, n_rows;
    unsigned long long* err;
    unsigned long long stamp;
    long long* trace_tid;
    int* trace_step;
};

template <typename T, typename I>
static void launch(int aligned, unsigned grid, unsigned block, const GatherArgs& a) {
    each_thread(grid, block, [&] {
        if (aligned) {
            gather_aligned<T, I>((const T*)a.src, (const I*)a.idx, a.pos, (T*)a.out, a.n_idx, a.row_elems,
                                 a.n_rows, a.err, a.stamp, a.trace_tid, a.trace_step);
        } else {
            gather_naive<T, I>((const T*)a.src, (const I*)a.idx, a.pos, (T*)a.out, a.n_idx, a.row_elems,
                               a.n_rows, a.err, a.stamp, a.trace_tid, a.trace_step);
        }
    });
}

template <typename T>
static int launch_idx(int idx_bytes, int aligned, unsigned grid, unsigned block, const GatherArgs& a) {
    if (idx_bytes == 4) {
        launch<T, int>(aligned, grid, block, a);
    } else if (idx_bytes == 8) {
        launch<T, long long>(aligned, grid, block, a);
    } else {
        return -2;
    }
    return 0;
}

// gather_naive / gather_aligned; src_bytes and out_bytes bound the accesses the counters accept.
extern "C" int dl_emu_gather(int aligned, int elem, int idx_bytes, unsigned grid, unsigned block,
                             const void* src, long long src_bytes, const void* idx, const long long* pos,
                             void* out, long long out_bytes, long long n_idx, long long row_elems,
                             long long n_rows, unsigned long long* err, unsigned long long stamp,
                             long long* trace_tid, int* trace_step) {
    const GatherArgs a{src, idx, pos, out, n_idx, row_elems, n_rows, err, stamp, trace_tid, trace_step};
    fence(src, src_bytes, out, out_bytes);
    switch (elem) {
        case 1: return launch_idx<unsigned char>(idx_bytes, aligned, grid, block, a);
        case 2: return launch_idx<unsigned short>(idx_bytes, aligned, grid, block, a);
        case 4: return launch_idx<unsigned int>(idx_bytes, aligned, grid, block, a);
        case 8: return launch_idx<unsigned long long>(idx_bytes, aligned, grid, block, a);
        case 16: return launch_idx<uint4>(idx_bytes, aligned, grid, block, a);
    }
    return -1;
}

template <typename I, int W>
static void launch_rowvec(unsigned grid, unsigned block, const void* src, const void* idx, const long long* pos,
                          void* out, long long n_idx, long long row_bytes, long long n_rows, int lanes,
                          unsigned long long* err, unsigned long long stamp) {
    each_thread(grid, block, [&] {
        gather_rowvec<I, W>((const unsigned char*)src, (const I*)idx, pos, (unsigned char*)out, n_idx, row_bytes,
                            n_rows, lanes, err, stamp);
    });
}

template <typename I>
static int rowvec_width(int width, unsigned grid, unsigned block, const void* src, const void* idx,
                        const long long* pos, void* out, long long n_idx, long long row_bytes, long long n_rows,
                        int lanes, unsigned long long* err, unsigned long long stamp) {
    switch (width) {
        case 16: launch_rowvec<I, 16>(grid, block, src, idx, pos, out, n_idx, row_bytes, n_rows, lanes, err, stamp); return 0;
        case 8: launch_rowvec<I, 8>(grid, block, src, idx, pos, out, n_idx, row_bytes, n_rows, lanes, err, stamp); return 0;
        case 4: launch_rowvec<I, 4>(grid, block, src, idx, pos, out, n_idx, row_bytes, n_rows, lanes, err, stamp); return 0;
        case 2: launch_rowvec<I, 2>(grid, block, src, idx, pos, out, n_idx, row_bytes, n_rows, lanes, err, stamp); return 0;
        case 1: launch_rowvec<I, 1>(grid, block, src, idx, pos, out, n_idx, row_bytes, n_rows, lanes, err, stamp); return 0;
    }
    return -1;
}

// gather_rowvec<I, width>.  Returns -1 (width), -2 (index size) or -3 (lanes not a power of two
// from 1 to 32 that divides the block).
extern "C" int dl_emu_rowvec(int width, int idx_bytes, int lanes, unsigned grid, unsigned block, const void* src,
                             long long src_bytes, const void* idx, const long long* pos, void* out,
                             long long out_bytes, long long n_idx, long long row_bytes, long long n_rows,
                             unsigned long long* err, unsigned long long stamp) {
    if (lanes < 1 || lanes > 32 || (lanes & (lanes - 1)) != 0 || block % (unsigned)lanes != 0) return -3;
    fence(src, src_bytes, out, out_bytes);
    if (idx_bytes == 4) {
        return rowvec_width<int>(width, grid, block, src, idx, pos, out, n_idx, row_bytes, n_rows, lanes, err, stamp);
    }
    if (idx_bytes == 8) {
        return rowvec_width<long long>(width, grid, block, src, idx, pos, out, n_idx, row_bytes, n_rows, lanes, err,
                                       stamp);
    }
    return -2;
}

// check_clamp<I>: clamped has idx's type.
extern "C" int dl_emu_check_clamp(int idx_bytes, unsigned grid, unsigned block, const void* idx, void* clamped,
                                  long long n, long long n_rows, unsigned long long* err, unsigned long long stamp) {
    fence(nullptr, 0, nullptr, 0);
    if (idx_bytes == 4) {
        each_thread(grid, block, [&] { check_clamp<int>((const int*)idx, (int*)clamped, n, n_rows, err, stamp); });
    } else if (idx_bytes == 8) {
        each_thread(grid, block, [&] {
            check_clamp<long long>((const long long*)idx, (long long*)clamped, n, n_rows, err, stamp);
        });
    } else {
        return -2;
    }
    return 0;
}

// The access counters: misaligned, stray loads, stray stores.
extern "C" void dl_emu_counters(long long* result) {
    result[0] = dl_emu_misaligned;
    result[1] = dl_emu_stray_loads;
    result[2] = dl_emu_stray_stores;
}

extern "C" void dl_emu_reset_counters() {
    dl_emu_misaligned = dl_emu_stray_loads = dl_emu_stray_stores = 0;
}

// One checked load (store = 0) or store of zeros (store = 1) of `width` bytes at p, fences open:
// shows that the counters catch a misaligned access.
extern "C" int dl_emu_probe(void* p, int width, int store) {
    fence(nullptr, 0, nullptr, 0);
    switch (width) {
        case 1: store ? dl_store<unsigned char>(p, 0) : (void)dl_load<unsigned char>(p); return 0;
        case 2: store ? dl_store<unsigned short>(p, 0) : (void)dl_load<unsigned short>(p); return 0;
        case 4: store ? dl_store<unsigned int>(p, 0) : (void)dl_load<unsigned int>(p); return 0;
        case 8: store ? dl_store<unsigned long long>(p, 0) : (void)dl_load<unsigned long long>(p); return 0;
        case 16: store ? dl_store<uint4>(p, uint4{}) : (void)dl_load<uint4>(p); return 0;
    }
    return -1;
}

template <typename T>
static void launch_tiered(int aligned, unsigned grid, unsigned block, const void* cache, const void* flat,
                          const long long* where, void* out, long long n, long long row_elems) {
    each_thread(grid, block, [&] {
        if (aligned) {
            gather_tiered_aligned<T>((const T*)cache, (const T*)flat, where, (T*)out, n, row_elems);
        } else {
            gather_tiered_naive<T>((const T*)cache, (const T*)flat, where, (T*)out, n, row_elems);
        }
    });
}

extern "C" int dl_emu_gather_tiered(int aligned, int elem, unsigned grid, unsigned block, const void* cache,
                                    const void* flat, const long long* where, void* out, long long n,
                                    long long row_elems) {
    fence(nullptr, 0, out, n * row_elems * elem);
    switch (elem) {
        case 1: launch_tiered<unsigned char>(aligned, grid, block, cache, flat, where, out, n, row_elems); return 0;
        case 2: launch_tiered<unsigned short>(aligned, grid, block, cache, flat, where, out, n, row_elems); return 0;
        case 4: launch_tiered<unsigned int>(aligned, grid, block, cache, flat, where, out, n, row_elems); return 0;
        case 8: launch_tiered<unsigned long long>(aligned, grid, block, cache, flat, where, out, n, row_elems); return 0;
    }
    return -1;
}

extern "C" void dl_emu_tier_row(long long where, long long row_elems, long long elem, long long cache_mod,
                                long long flat_mod, long long* result) {
    const DlTierRow t = dl_tier_row(where, row_elems, elem, cache_mod, flat_mod);
    result[0] = t.tier;
    result[1] = t.first;
    result[2] = t.row_addr;
}

extern "C" void dl_emu_aligned(long long lane, long long step, long long row_addr,
                               long long row_bytes, long long elem, long long warp,
                               long long line, long long* result) {
    const DlGeometry g = dl_aligned_geometry(row_addr, row_bytes, elem, warp, line);
    long long lo, hi;
    dl_aligned_span(lane, step, row_addr, row_bytes, elem, warp, g, &lo, &hi);
    result[0] = g.base;
    result[1] = g.first;
    result[2] = g.last;
    result[3] = g.steps;
    result[4] = g.wrap;
    result[5] = lo;
    result[6] = hi;
}

template <int CODEC, int OUT, typename I>
static void launch_decode(unsigned grid, unsigned block, const void* codes, const void* idx, void* out, long long n,
                          long long code_row_bytes, long long dim, long long n_rows, unsigned long long* err,
                          unsigned long long stamp) {
    each_thread(grid, block, [&] {
        gather_decode<CODEC, OUT, I>((const unsigned char*)codes, (const I*)idx, (unsigned char*)out, n,
                                     code_row_bytes, dim, n_rows, err, stamp);
    });
}

template <int CODEC, int OUT>
static int decode_idx(int idx_bytes, unsigned grid, unsigned block, const void* codes, const void* idx, void* out,
                      long long n, long long code_row_bytes, long long dim, long long n_rows, unsigned long long* err,
                      unsigned long long stamp) {
    if (idx_bytes == 4) {
        launch_decode<CODEC, OUT, int>(grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
    } else if (idx_bytes == 8) {
        launch_decode<CODEC, OUT, long long>(grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
    } else {
        return -2;
    }
    return 0;
}

template <int CODEC>
static int decode_out(int out_kind, int idx_bytes, unsigned grid, unsigned block, const void* codes, const void* idx,
                      void* out, long long n, long long code_row_bytes, long long dim, long long n_rows,
                      unsigned long long* err, unsigned long long stamp) {
    switch (out_kind) {
        case 0: return decode_idx<CODEC, 0>(idx_bytes, grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
        case 1: return decode_idx<CODEC, 1>(idx_bytes, grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
        case 2: return decode_idx<CODEC, 2>(idx_bytes, grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
    }
    return -3;
}

// gather_decode<codec, out_kind, I>.  Returns -1 (codec), -2 (index size) or -3 (output kind).
extern "C" int dl_emu_decode(int codec, int out_kind, int idx_bytes, unsigned grid, unsigned block, const void* codes,
                             long long codes_bytes, const void* idx, void* out, long long out_bytes, long long n,
                             long long code_row_bytes, long long dim, long long n_rows, unsigned long long* err,
                             unsigned long long stamp) {
    fence(codes, codes_bytes, out, out_bytes);
    switch (codec) {
        case 0: return decode_out<0>(out_kind, idx_bytes, grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
        case 1: return decode_out<1>(out_kind, idx_bytes, grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
        case 2: return decode_out<2>(out_kind, idx_bytes, grid, block, codes, idx, out, n, code_row_bytes, dim, n_rows, err, stamp);
    }
    return -1;
}
