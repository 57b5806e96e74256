// Host emulation of the few CUDA built-ins gather.cu uses, so g++ can compile and
// run the very same kernels on the CPU.  Threads run one after another: valid
// because the kernels use no shared memory, barriers or warp intrinsics.
#pragma once

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

// CUDA's built-in 16-byte vector type, for the vector-unit specialisation.
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
