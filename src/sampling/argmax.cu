// Greedy picks on a CUDA device: the twin of `sampler.rs`'s `argmax`. A row
// that needs only its argmax (plain greedy decoding) sends one u32 back to
// the host instead of its whole vocabulary of logits.
//
// Launch shape: one block of THREADS threads per row of logits. Each thread
// strides over the row, so consecutive threads read consecutive floats, and
// keeps the largest value it saw with the lowest index holding it; the warps
// then reduce those pairs by shuffles, and warp 0 reduces the warps' pairs
// from shared memory. A 128k vocabulary is 250 loads per thread, and a
// batch of rows spreads over the SMs, so the launch is bound by reading the
// logits once. The host's rule holds: the lowest id among the largest
// values, NaN never picked, a row of NaN giving 0.

#include <math.h>
#include <stdint.h>

// The host build (crates/cuda-host) registers each entry point by name.
#ifndef WICK_KERNEL
#define WICK_KERNEL(name)
#endif

#define THREADS 512
#define NONE 0xffffffffu

// Keeps the larger value, the lower index on a tie; NaN compares false.
__device__ __forceinline__ void keep_best(float& v, uint32_t& i, float ov, uint32_t oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

__device__ __forceinline__ void warp_best(float& v, uint32_t& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffff, v, o);
        const uint32_t oi = __shfl_xor_sync(0xffffffff, i, o);
        keep_best(v, i, ov, oi);
    }
}

extern "C" __global__ void argmax_rows_f32(const float* __restrict__ logits, uint32_t vocab,
                                           uint32_t* __restrict__ out) {
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float v = -INFINITY;
    uint32_t i = NONE;
    for (uint32_t j = threadIdx.x; j < vocab; j += THREADS) keep_best(v, i, row[j], j);
    warp_best(v, i);

    __shared__ float values[THREADS / 32];
    __shared__ uint32_t ids[THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        values[warp] = v;
        ids[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < THREADS / 32 ? values[lane] : -INFINITY;
        i = lane < THREADS / 32 ? ids[lane] : NONE;
        warp_best(v, i);
        if (lane == 0) out[blockIdx.x] = i == NONE ? 0 : i;
    }
}
WICK_KERNEL(argmax_rows_f32)
