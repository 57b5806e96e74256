// Host-emulation launcher of sample.cu's kernels (built with emu_launch.cpp into one library by
// kernels/host_emu.py).  Each entry point takes the byte sizes of the kernel's template types, the launch
// shape, then the kernel's own arguments in the kernel's order.  Returns 0, or -2 for a bad size.
#include "cuda_shim.h"

#include "sample.cu"

// f(T{}) for the integer type of `bytes` (int, long long).
template <typename F>
static int by_int(int bytes, F f) {
    if (bytes == 4) return f(0);
    if (bytes == 8) return f(0ll);
    return -2;
}

// f(T{}) for the real type of `bytes` (float, double).
template <typename F>
static int by_real(int bytes, F f) {
    if (bytes == 4) return f(0.0f);
    if (bytes == 8) return f(0.0);
    return -2;
}

extern "C" int dl_emu_sample_counts(int p_bytes, int w_bytes, unsigned grid, unsigned block, const void* indptr,
                                    const void* weights, const long long* nodes, const long long* lo_at,
                                    const long long* hi_at, long long bound, long long k, int replace,
                                    long long* counts) {
    return by_int(p_bytes, [&](auto p) {
        return by_real(w_bytes, [&](auto w) {
            using P = decltype(p);
            using W = decltype(w);
            each_thread(grid, block, [&] {
                sample_counts<P, W>((const P*)indptr, (const W*)weights, nodes, lo_at, hi_at, bound, k, replace,
                                    counts);
            });
            return 0;
        });
    });
}

extern "C" int dl_emu_sample_picks(int p_bytes, int i_bytes, int e_bytes, int w_bytes, unsigned grid,
                                   unsigned block, const void* indptr, const void* indices, const void* eids,
                                   const void* weights, const long long* nodes, const long long* lo_at,
                                   const long long* hi_at, long long bound, int replace, unsigned long long key,
                                   long long hop, const long long* offsets, void* nbr, long long* eid, double* keys,
                                   long long* col) {
    return by_int(p_bytes, [&](auto p) {
        return by_int(i_bytes, [&](auto i) {
            return by_int(e_bytes, [&](auto e) {
                return by_real(w_bytes, [&](auto w) {
                    using P = decltype(p);
                    using I = decltype(i);
                    using E = decltype(e);
                    using W = decltype(w);
                    each_thread(grid, block, [&] {
                        sample_picks<P, I, E, W>((const P*)indptr, (const I*)indices, (const E*)eids,
                                                 (const W*)weights, nodes, lo_at, hi_at, bound, replace, key, hop,
                                                 offsets, (I*)nbr, eid, keys, col);
                    });
                    return 0;
                });
            });
        });
    });
}

extern "C" int dl_emu_relabel_claim(int i_bytes, unsigned grid, unsigned block, const void* nbr,
                                    const long long* total_at, long long bound, long long* marks) {
    return by_int(i_bytes, [&](auto i) {
        using I = decltype(i);
        each_thread(grid, block, [&] { relabel_claim<I>((const I*)nbr, total_at, bound, marks); });
        return 0;
    });
}

extern "C" int dl_emu_place_seeds(int i_bytes, unsigned grid, unsigned block, const void* seeds,
                                  const long long* total_at, long long bound, long long* marks, long long* nodes) {
    return by_int(i_bytes, [&](auto i) {
        using I = decltype(i);
        each_thread(grid, block, [&] { place_seeds<I>((const I*)seeds, total_at, bound, marks, nodes); });
        return 0;
    });
}

extern "C" int dl_emu_relabel_flag(int i_bytes, unsigned grid, unsigned block, const void* nbr,
                                   const long long* total_at, long long bound, const long long* marks,
                                   long long* flags) {
    return by_int(i_bytes, [&](auto i) {
        using I = decltype(i);
        each_thread(grid, block, [&] { relabel_flag<I>((const I*)nbr, total_at, bound, marks, flags); });
        return 0;
    });
}

extern "C" int dl_emu_relabel_append(int i_bytes, unsigned grid, unsigned block, const void* nbr,
                                     const long long* total_at, long long bound, long long* marks,
                                     const long long* scan, const long long* count_at, long long* nodes) {
    return by_int(i_bytes, [&](auto i) {
        using I = decltype(i);
        each_thread(grid, block, [&] {
            relabel_append<I>((const I*)nbr, total_at, bound, marks, scan, count_at, nodes);
        });
        return 0;
    });
}

extern "C" int dl_emu_relabel_rows(int i_bytes, unsigned grid, unsigned block, const void* nbr,
                                   const long long* total_at, long long bound, const long long* marks,
                                   long long* rows) {
    return by_int(i_bytes, [&](auto i) {
        using I = decltype(i);
        each_thread(grid, block, [&] { relabel_rows<I>((const I*)nbr, total_at, bound, marks, rows); });
        return 0;
    });
}

extern "C" int dl_emu_reset_marks(unsigned grid, unsigned block, long long* marks, const long long* nodes,
                                  const long long* count_at, long long bound) {
    each_thread(grid, block, [&] { reset_marks(marks, nodes, count_at, bound); });
    return 0;
}
