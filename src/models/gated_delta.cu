// The gated delta rule of Qwen3.5's linear-attention layers on a CUDA
// device: the twin of `GatedDelta::run` in `gated_delta.rs`, over every
// sequence of a step at once, each sequence's state read from and written
// back to its slot of one device pool (so no state leaves the GPU).
//
// Two launches per layer:
//
// `delta_conv`: the causal depthwise conv over q, k and v with its SiLU.
//   Launch shape: grid (sequences, ceil(conv_dim / CONV_THREADS)), one
//   thread per channel of one sequence; the thread walks the sequence's
//   tokens in order with the channel's last `taps - 1` inputs in registers
//   (read from the slot, or zero for a sequence at position 0) and writes
//   them back at the end. Channels share nothing, so there is no barrier.
//
// `delta_rule`: the recurrence and the gated RMSNorm. Launch shape: grid
//   (sequences, value heads), RULE_THREADS threads: thread (r, j), r =
//   tid / dv, j = tid % dv, holds column j of rows r, r + R, r + 2R, ... of
//   the head's [dk, dv] state in registers (R = RULE_THREADS / dv groups of
//   rows). For each token in order: q and k of the head's key head are
//   l2-normed (block sums), the state decays, S^T k meets over the R groups
//   in shared memory, the delta update, then S^T q the same way, and the
//   norm's sum of squares over j. A head's tokens are sequential, so the
//   parallelism is sequences x heads x dv: a decode step of one Qwen3.5
//   stream is 32 blocks per layer.
//
// `seqs` holds four u32 per sequence: first row in the step, rows, state
// slot, and 1 when the sequence starts at position 0 (its state starts
// from zero). `params` holds the layer's f32 constants one after another:
// the conv's [conv_dim, taps] weights, -exp(A_log) and dt_bias per value
// head, and the norm's [dv] weights. A slot's state starts at
// `slot * state_stride + state_at`: the conv's last inputs [taps - 1,
// conv_dim] (oldest first), then each value head's [dk, dv] matrix.

#include <stdint.h>

// The host build (crates/cuda-host) registers each entry point by name.
#ifndef WICK_KERNEL
#define WICK_KERNEL(name)
#endif

#define CONV_THREADS 256
#define MAX_TAPS 8
#define RULE_THREADS 128
#define RULE_WARPS (RULE_THREADS / 32)
// Rows of the state a thread holds: dk / R at most.
#define MAX_ROWS 128
#define MAX_DK 256

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

extern "C" __global__ void __launch_bounds__(CONV_THREADS)
    delta_conv(const float* __restrict__ rows, const float* __restrict__ params,
               const uint32_t* __restrict__ seqs, float* __restrict__ states,
               float* __restrict__ mixed, int width, int conv_dim, int taps, int state_stride,
               int state_at) {
    const int ch = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (ch >= conv_dim) return;
    const uint32_t* s = seqs + 4 * blockIdx.x;
    const uint32_t start = s[0], len = s[1], slot = s[2], fresh = s[3];
    float* hist = states + (size_t)slot * state_stride + state_at;
    const float* w = params + (size_t)ch * taps;
    float h[MAX_TAPS];
#pragma unroll
    for (int j = 0; j < MAX_TAPS; j++)
        h[j] = (j < taps - 1 && !fresh) ? hist[(size_t)j * conv_dim + ch] : 0.f;
    for (uint32_t t = 0; t < len; t++) {
        const size_t row = start + t;
        const float x = rows[row * width + ch];
        float acc = w[taps - 1] * x;
#pragma unroll
        for (int j = 0; j < MAX_TAPS; j++)
            if (j < taps - 1) acc += w[j] * h[j];
        mixed[row * conv_dim + ch] = silu(acc);
        // Shift the window: the oldest input leaves, this one enters.
#pragma unroll
        for (int j = 0; j < MAX_TAPS - 1; j++)
            if (j < taps - 2) h[j] = h[j + 1];
        if (taps > 1) h[taps - 2] = x;
    }
#pragma unroll
    for (int j = 0; j < MAX_TAPS; j++)
        if (j < taps - 1) hist[(size_t)j * conv_dim + ch] = h[j];
}
WICK_KERNEL(delta_conv)

// The sum of `v` over the block; `scratch` holds RULE_WARPS floats. Every
// thread gets the total. Starts and ends with the scratch free to reuse.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < RULE_WARPS; w++) total += scratch[w];
    __syncthreads();
    return total;
}

extern "C" __global__ void __launch_bounds__(RULE_THREADS)
    delta_rule(const float* __restrict__ rows, const float* __restrict__ mixed,
               const float* __restrict__ params, const uint32_t* __restrict__ seqs,
               float* __restrict__ states, float* __restrict__ out, int width, int conv_dim,
               int taps, int k_heads, int v_heads, int dk, int dv, int tiled, float eps,
               int state_stride, int state_at) {
    const int h = blockIdx.y;
    const int tid = threadIdx.x;
    const int groups = RULE_THREADS / dv;
    const int r = tid / dv, j = tid % dv;
    const int n_rows = (dk - r + groups - 1) / groups;
    const int kw = k_heads * dk, vw = v_heads * dv;
    const int g = tiled ? h % k_heads : h / (v_heads / k_heads);
    const uint32_t* s = seqs + 4 * blockIdx.x;
    const uint32_t start = s[0], len = s[1], slot = s[2], fresh = s[3];
    float* state = states + (size_t)slot * state_stride + state_at +
                   (size_t)(taps - 1) * conv_dim + (size_t)h * dk * dv;
    const float* neg_a = params + (size_t)conv_dim * taps;
    const float* dt_bias = neg_a + v_heads;
    const float* norm = dt_bias + v_heads;

    float st[MAX_ROWS];
#pragma unroll
    for (int m = 0; m < MAX_ROWS; m++)
        st[m] = (m < n_rows && !fresh) ? state[(size_t)(r + m * groups) * dv + j] : 0.f;

    __shared__ float qs[MAX_DK], ks[MAX_DK];
    __shared__ float part[RULE_THREADS];
    __shared__ float scratch[RULE_WARPS];
    const float q_scale = rsqrtf((float)dk);
    for (uint32_t t = 0; t < len; t++) {
        const size_t row = start + t;
        const float* m = mixed + row * conv_dim;
        const float* in = rows + row * width;
        // q and k of the key head, each l2-normed; each thread sums the
        // squares of the values it loaded.
        float qq = 0.f, kk = 0.f;
        for (int i = tid; i < dk; i += RULE_THREADS) {
            const float q = m[g * dk + i], k = m[kw + g * dk + i];
            qs[i] = q;
            ks[i] = k;
            qq += q * q;
            kk += k * k;
        }
        const float q_inv = rsqrtf(block_sum(qq, scratch) + 1e-6f) * q_scale;
        const float k_inv = rsqrtf(block_sum(kk, scratch) + 1e-6f);
        const float b = in[conv_dim + vw + h], a = in[conv_dim + vw + v_heads + h];
        const float sp = a + dt_bias[h] > 20.f ? a + dt_bias[h] : log1pf(expf(a + dt_bias[h]));
        const float decay = expf(neg_a[h] * sp);
        const float beta = 1.f / (1.f + expf(-b));
        // S decays; this thread's share of (S^T k)_j.
        float kv = 0.f;
#pragma unroll
        for (int mm = 0; mm < MAX_ROWS; mm++) {
            if (mm < n_rows) {
                st[mm] *= decay;
                kv += st[mm] * (ks[r + mm * groups] * k_inv);
            }
        }
        part[tid] = kv;
        __syncthreads();
        kv = 0.f;
        for (int rr = 0; rr < groups; rr++) kv += part[rr * dv + j];
        const float d = (m[2 * kw + h * dv + j] - kv) * beta;
        float o = 0.f;
#pragma unroll
        for (int mm = 0; mm < MAX_ROWS; mm++) {
            if (mm < n_rows) {
                const int i = r + mm * groups;
                st[mm] += ks[i] * k_inv * d;
                o += st[mm] * (qs[i] * q_inv);
            }
        }
        __syncthreads();  // every group has read `part`
        part[tid] = o;
        __syncthreads();
        o = 0.f;
        for (int rr = 0; rr < groups; rr++) o += part[rr * dv + j];
        // The RMSNorm over the head's dv outputs, gated by silu(z); group 0
        // holds each j once.
        const float inv = rsqrtf(block_sum(r == 0 ? o * o : 0.f, scratch) / dv + eps);
        if (r == 0) {
            const float z = in[conv_dim + h * dv + j];
            out[row * vw + h * dv + j] = o * inv * norm[j] * silu(z);
        }
    }
#pragma unroll
    for (int m = 0; m < MAX_ROWS; m++)
        if (m < n_rows) state[(size_t)(r + m * groups) * dv + j] = st[m];
}
WICK_KERNEL(delta_rule)
