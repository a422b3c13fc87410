// The residual add and the next RMSNorm of a layer in one pass on a CUDA
// device: the twin of `elementwise.rs`'s `add_rms_norm` (an `add`, then
// candle's `rms_norm`, on the CPU). Unfused, the sum is written by one
// launch and read back by the norm's; here each row is read once.
//
// For each row: sum = x + y (rounded to the activations' dtype, as the
// unfused add stores it), then out = sum / sqrt(mean(sum^2) + eps) * w,
// the mean and the scaling in f32 as candle's kernel computes them. Both
// `sum` (the new residual stream) and `out` (the norm's output) are
// written.
//
// Launch shape: one block of THREADS threads per row; each thread strides
// over the row (consecutive threads, consecutive values), keeping its
// share of the squares; the warps' partial sums meet in shared memory.
// A 4096-wide row is 16 values a thread: the launch is bound by reading
// x, y and w and writing twice.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// The host build (crates/cuda-host) registers each entry point by name.
#ifndef WICK_KERNEL
#define WICK_KERNEL(name)
#endif

#define THREADS 256
#define WARPS (THREADS / 32)

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}

template <typename T>
__device__ void add_rms_norm(const T* __restrict__ x, const T* __restrict__ y,
                             const T* __restrict__ w, int hidden, float eps,
                             T* __restrict__ sum, T* __restrict__ out) {
    const size_t at = (size_t)blockIdx.x * hidden;
    float squares = 0.f;
    for (int i = threadIdx.x; i < hidden; i += THREADS) {
        // Rounded to T first: the unfused path normalises the stored sum.
        const T s = from_f32<T>(to_f32(x[at + i]) + to_f32(y[at + i]));
        sum[at + i] = s;
        const float v = to_f32(s);
        squares += v * v;
    }
    __shared__ float partial[WARPS];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffff, squares, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = squares;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < WARPS; k++) total += partial[k];
    const float scale = rsqrtf(total / hidden + eps);
    // Each thread reads back the sums it wrote itself.
    for (int i = threadIdx.x; i < hidden; i += THREADS)
        out[at + i] = from_f32<T>(to_f32(sum[at + i]) * scale * to_f32(w[i]));
}

#define ADD_RMS_NORM(NAME, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        NAME(const T* x, const T* y, const T* w, int hidden, float eps, T* sum, T* out) {      \
        add_rms_norm<T>(x, y, w, hidden, eps, sum, out);                                       \
    }                                                                                          \
    WICK_KERNEL(NAME)

ADD_RMS_NORM(add_rms_norm_f32, float)
ADD_RMS_NORM(add_rms_norm_f16, __half)
ADD_RMS_NORM(add_rms_norm_bf16, __nv_bfloat16)
