// Host-emulation launcher: loops over blocks and threads and calls the kernels of
// gather.cu as ordinary functions.  Built by kernels/host_emu.py with g++.
#include "cuda_shim.h"

#include "gather.cu"

dim3 threadIdx, blockIdx, blockDim, gridDim;

// Runs f() once per emulated thread, with blockIdx/threadIdx set as a launch would.
template <typename F>
static void each_thread(unsigned grid, unsigned block, F f) {
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        for (unsigned t = 0; t < block; ++t) {
            threadIdx.x = t;
            f();
        }
    }
}

template <typename T, typename I>
static void launch(int aligned, unsigned grid, unsigned block, const void* src, const void* idx,
                   void* out, long long n_idx, long long row_elems, long long* trace_tid,
                   int* trace_step) {
    each_thread(grid, block, [&] {
        if (aligned) {
            gather_aligned<T, I>((const T*)src, (const I*)idx, (T*)out, n_idx, row_elems, trace_tid, trace_step);
        } else {
            gather_naive<T, I>((const T*)src, (const I*)idx, (T*)out, n_idx, row_elems, trace_tid, trace_step);
        }
    });
}

template <typename T>
static int launch_idx(int idx_bytes, int aligned, unsigned grid, unsigned block, const void* src,
                      const void* idx, void* out, long long n_idx, long long row_elems,
                      long long* trace_tid, int* trace_step) {
    if (idx_bytes == 4) {
        launch<T, int>(aligned, grid, block, src, idx, out, n_idx, row_elems, trace_tid, trace_step);
    } else if (idx_bytes == 8) {
        launch<T, long long>(aligned, grid, block, src, idx, out, n_idx, row_elems, trace_tid,
                             trace_step);
    } else {
        return -2;
    }
    return 0;
}

extern "C" int dl_emu_gather(int aligned, int elem, int idx_bytes, unsigned grid, unsigned block,
                             const void* src, const void* idx, void* out, long long n_idx,
                             long long row_elems, long long* trace_tid, int* trace_step) {
    switch (elem) {
        case 1: return launch_idx<unsigned char>(idx_bytes, aligned, grid, block, src, idx, out, n_idx, row_elems, trace_tid, trace_step);
        case 2: return launch_idx<unsigned short>(idx_bytes, aligned, grid, block, src, idx, out, n_idx, row_elems, trace_tid, trace_step);
        case 4: return launch_idx<unsigned int>(idx_bytes, aligned, grid, block, src, idx, out, n_idx, row_elems, trace_tid, trace_step);
        case 8: return launch_idx<unsigned long long>(idx_bytes, aligned, grid, block, src, idx, out, n_idx, row_elems, trace_tid, trace_step);
        case 16: return launch_idx<uint4>(idx_bytes, aligned, grid, block, src, idx, out, n_idx, row_elems, trace_tid, trace_step);
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
