// Host emulation of the few CUDA built-ins gather.cu and sample.cu use, so g++ can
// compile and run the very same kernels on the CPU.  Threads run one after another:
// valid because the kernels use no shared memory, barriers or warp intrinsics, and
// their atomics only need each one to be indivisible, which a serial run gives.
//
// It also checks every table and output access, which a GPU would fault on and
// x86 silently allows: dl_load/dl_store count an address that is not a multiple
// of its width, and one outside the launch's fences (the table for loads, the
// output for stores; such an access is skipped, a load reads zero).  The counters
// are read through emu_launch.cpp's dl_emu_counters.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#define DL_HOST_EMULATION 1

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define DL_UNROLL _Pragma("GCC unroll 8")
#define DL_ROLLED

// CUDA's built-in 16-byte vector type, for the vector-unit specialisation.
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};

// Position of the lowest set bit, 1-based (0 for 0), as CUDA's __ffs.
inline int __ffs(int x) { return __builtin_ffs(x); }

// CUDA's atomicMin on a 64-bit word: stores min(*p, v) and returns the old value.
inline long long atomicMin(long long* p, long long v) {
    const long long old = *p;
    if (v < old) *p = v;
    return old;
}

// Runs f() once per emulated thread, with blockIdx/threadIdx set as a launch would.
template <typename F>
inline void each_thread(unsigned grid, unsigned block, F f) {
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

// Access counters and fences (bytes [lo, hi) a launch may load or store).
extern long long dl_emu_misaligned, dl_emu_stray_loads, dl_emu_stray_stores;
extern std::uintptr_t dl_emu_load_lo, dl_emu_load_hi, dl_emu_store_lo, dl_emu_store_hi;

// Whether an access of `width` bytes at p is aligned and inside [lo, hi); counts what is not.
inline bool dl_emu_check(const void* p, std::uintptr_t width, std::uintptr_t lo, std::uintptr_t hi,
                         long long* stray) {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
    if (a % width != 0) ++dl_emu_misaligned;
    if (a < lo || a + width > hi) {
        ++*stray;
        return false;
    }
    return true;
}

// Bit casts and singly rounded float32 arithmetic (CUDA's __uint_as_float, __float_as_uint, __fmul_rn and
// __fadd_rn; -std=c++17 builds without contracting a * b + c).
inline float dl_as_float(unsigned int b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
inline unsigned int dl_float_bits(float f) {
    unsigned int b;
    std::memcpy(&b, &f, 4);
    return b;
}
inline float dl_mul_rn(float a, float b) { return a * b; }
inline float dl_add_rn(float a, float b) { return a + b; }

template <typename T>
inline T dl_load(const void* p) {
    T v{};
    if (dl_emu_check(p, sizeof(T), dl_emu_load_lo, dl_emu_load_hi, &dl_emu_stray_loads)) {
        std::memcpy(&v, p, sizeof(T));
    }
    return v;
}

template <typename T>
inline void dl_store(void* p, T v) {
    if (dl_emu_check(p, sizeof(T), dl_emu_store_lo, dl_emu_store_hi, &dl_emu_stray_stores)) {
        std::memcpy(p, &v, sizeof(T));
    }
}
