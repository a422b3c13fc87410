// Kernels that test the emulator itself (tests/cuda_kernels.rs): each
// breaks one rule of CUDA's, or checks one warp function, so that the tests
// can show that a broken kernel fails here as it could on a GPU.

// Thread t stores in[t] in shared memory and reads its neighbour's: without
// the barrier (`sync` 0), every order of the threads has one reading before
// its neighbour wrote. Up to 1024 threads.
extern "C" __global__ void selftest_neighbour(const float* in, float* out, int sync) {
    __shared__ float values[1024];
    const unsigned t = threadIdx.x;
    values[t] = in[t];
    if (sync) __syncthreads();
    out[t] = values[(t + 1) % blockDim.x];
}
WICK_KERNEL(selftest_neighbour)

// Every lane's result of one warp function: `op` 0 idx, 1 up, 2 down, 3
// xor, 4 ballot (of in[t] != 0), over the lanes in `mask` (the others
// write nothing).
extern "C" __global__ void selftest_warp(const int* in, int* out, unsigned mask, int op, int arg,
                                         int width) {
    const unsigned t = threadIdx.x;
    if (!(mask >> (t % 32) & 1)) return;
    int v = in[t];
    switch (op) {
        case 0: v = __shfl_sync(mask, v, arg, width); break;
        case 1: v = __shfl_up_sync(mask, v, arg, width); break;
        case 2: v = __shfl_down_sync(mask, v, arg, width); break;
        case 3: v = __shfl_xor_sync(mask, v, arg, width); break;
        default: v = (int)__ballot_sync(mask, v); break;
    }
    out[t] = v;
}
WICK_KERNEL(selftest_warp)

// A warp reduction after the lanes at or past `active` have returned: the
// full mask names lanes that ended.
extern "C" __global__ void selftest_early_return(float* out, int active) {
    if ((int)threadIdx.x >= active) return;
    float v = threadIdx.x;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    out[threadIdx.x] = v;
}
WICK_KERNEL(selftest_early_return)

// A barrier only the threads below `active` reach.
extern "C" __global__ void selftest_divergent_barrier(float* out, int active) {
    if ((int)threadIdx.x < active) __syncthreads();
    out[threadIdx.x] = 1.f;
}
WICK_KERNEL(selftest_divergent_barrier)
