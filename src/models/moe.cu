// The routed experts of a mixture-of-experts block on a CUDA device: the
// twin of `route` and `grouped_forward` in `moe.rs`. The router's scores
// stay on the device and the experts' weights stay in their GGUF blocks,
// so a step's MoE layer is four launches and no copy to the host.
//
// A step of T rows with top k experts each has S = T * k slots; slot
// `row * k + j` is row `row`'s j-th choice. `plan` (u32) holds, one after
// another: the expert of each slot [S], the slots sorted by expert
// ("order") [S], each slot's place in that order ("pos") [S], and the
// tiles [max_tiles][3]: (expert, first place in order, slots), at most
// TILE_ROWS slots of one expert each. max_tiles = ceil(S / TILE_ROWS) +
// min(experts, S) bounds the tiles any routing needs, so the grids below
// are sized on the host without reading the routing back; a tile past
// the routing's own has 0 slots and its blocks return at once.
//
// `moe_route`: one block of ROUTE_THREADS. A thread per row: softmax of
//   the row's scores, its top k by score (ties to the lower expert, as
//   torch.topk), their weights (renormalized over the k where the family
//   does, times the expert's scale where it has one). Then the slots are
//   counted per expert in shared memory, the counts scanned into offsets
//   and tiles, and each slot placed within its expert's run. Places within
//   a run go by atomics, so their order varies between runs, but each
//   slot's outputs are computed alone and summed by `moe_combine` in a
//   fixed order, so the results do not. Each expert's slots are also added
//   to `load` (the layer's counters for /metrics).
// `moe_gate_up`: grid (ceil(ff / GEMM_WARPS), max_tiles), GEMM_WARPS
//   warps. Warp w computes output column j = blockIdx.x * GEMM_WARPS + w of
//   the tile's expert, gate and up, for all its slots: the lanes take the
//   row's 32-weight blocks in turn, dequantize them in registers and dot
//   them with every slot's input row, then the warp sums its lanes. Each
//   weight is read once per tile. Out: act(gate, up) per place, [S, ff].
// `moe_down`: the same shape over the down projection, [S, ff] to [S,
//   hidden], per place, the expert's bias added.
// `moe_combine`: grid (T, ceil(hidden / COMBINE_THREADS)), a thread per
//   output value: the row's k slots summed by their weights, in slot order.
//
// Weights are `[experts, n, k]` in a GGUF block type (GGML's type ids
// below), each row `row_bytes` long; k is a multiple of 32 (256 for the
// K-quants), so every 32 inputs of a row are one block, or one sub-block
// of a K-quant's 256.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// The host build (crates/cuda-host) registers each entry point by name.
#ifndef WICK_KERNEL
#define WICK_KERNEL(name)
#endif

#define ROUTE_THREADS 256
#define MAX_EXPERTS 512
#define MAX_TOP_K 16
#define TILE_ROWS 8
#define GEMM_WARPS 8
#define COMBINE_THREADS 256

// GGML's type ids.
#define W_F32 0
#define W_F16 1
#define W_Q4_0 2
#define W_Q4_1 3
#define W_Q5_0 6
#define W_Q5_1 7
#define W_Q8_0 8
#define W_Q4_K 12
#define W_Q5_K 13
#define W_Q6_K 14
#define W_BF16 30

// The experts' activations (`Act` in elementwise.rs).
#define ACT_SILU 0
#define ACT_GELU_TANH 1
#define ACT_SWIGLU_OAI 2

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

// A K-quant's 6-bit scale and min of sub-block `j` (GGML's
// `get_scale_min_k4`).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, float* d, float* m) {
    if (j < 4) {
        *d = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *d = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// The 32 weights of block `b` (inputs 32b .. 32b + 31) of the row at
// `row`, as GGML dequantizes them.
__device__ void dequant32(int type, const uint8_t* row, int b, float* w) {
    switch (type) {
    case W_F32: {
        const uint8_t* p = row + 128 * (size_t)b;
        for (int i = 0; i < 32; i++) w[i] = __uint_as_float(u32_at(p + 4 * i));
        break;
    }
    case W_F16: {
        const uint8_t* p = row + 64 * (size_t)b;
        for (int i = 0; i < 32; i++) w[i] = f16_at(p + 2 * i);
        break;
    }
    case W_BF16: {
        const uint8_t* p = row + 64 * (size_t)b;
        for (int i = 0; i < 32; i++)
            w[i] = __bfloat162float(
                __ushort_as_bfloat16((unsigned short)(p[2 * i] | (p[2 * i + 1] << 8))));
        break;
    }
    case W_Q4_0: {
        const uint8_t* q = row + 18 * (size_t)b;
        const float d = f16_at(q);
        for (int j = 0; j < 16; j++) {
            w[j] = (float)((q[2 + j] & 0xF) - 8) * d;
            w[j + 16] = (float)((q[2 + j] >> 4) - 8) * d;
        }
        break;
    }
    case W_Q4_1: {
        const uint8_t* q = row + 20 * (size_t)b;
        const float d = f16_at(q), m = f16_at(q + 2);
        for (int j = 0; j < 16; j++) {
            w[j] = (float)(q[4 + j] & 0xF) * d + m;
            w[j + 16] = (float)(q[4 + j] >> 4) * d + m;
        }
        break;
    }
    case W_Q5_0:
    case W_Q5_1: {
        const bool q5_1 = type == W_Q5_1;
        const uint8_t* q = row + (q5_1 ? 24 : 22) * (size_t)b;
        const float d = f16_at(q), m = q5_1 ? f16_at(q + 2) : -16.f * d;
        const uint8_t* hq = q + (q5_1 ? 4 : 2);
        const uint32_t qh = u32_at(hq);
        const uint8_t* qs = hq + 4;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[j] = (float)lo * d + m;
            w[j + 16] = (float)hi * d + m;
        }
        break;
    }
    case W_Q8_0: {
        const uint8_t* q = row + 34 * (size_t)b;
        const float d = f16_at(q);
        for (int j = 0; j < 32; j++) w[j] = (float)(int8_t)q[2 + j] * d;
        break;
    }
    case W_Q4_K:
    case W_Q5_K: {
        // 256 inputs: d, dmin, 12 bytes of scales, (Q5_K: 32 bytes of high
        // bits,) 128 bytes of nibbles in four runs of 32, each run's low
        // nibbles one sub-block and its high nibbles the next.
        const bool q5 = type == W_Q5_K;
        const int s = b % 8;
        const uint8_t* q = row + (q5 ? 176 : 144) * (size_t)(b / 8);
        float sc, mn;
        scale_min_k4(s, q + 4, &sc, &mn);
        const float d = f16_at(q) * sc, m = f16_at(q + 2) * mn;
        const uint8_t* qh = q + 16;
        const uint8_t* ql = q + (q5 ? 48 : 16) + 32 * (s / 2);
        const int shift = 4 * (s % 2);
        for (int l = 0; l < 32; l++) {
            int v = (ql[l] >> shift) & 0xF;
            if (q5 && (qh[l] >> s) & 1) v += 16;
            w[l] = d * (float)v - m;
        }
        break;
    }
    case W_Q6_K: {
        // 256 inputs: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8
        // scales (one per 16 inputs), d. Each half of 128 inputs takes 64
        // low and 32 high bytes; its quarter `qq` takes the low (qq 0, 1)
        // or high (2, 3) nibbles of the first (0, 2) or second (1, 3) 32
        // low bytes, and bits 2 qq of the high bytes.
        const int s = b % 8, half = s / 4, qq = s % 4;
        const uint8_t* q = row + 210 * (size_t)(b / 8);
        const float d = f16_at(q + 208);
        const uint8_t* ql = q + 64 * half + 32 * (qq & 1);
        const uint8_t* qh = q + 128 + 32 * half;
        const int8_t* sc = (const int8_t*)(q + 192) + 8 * half + 2 * qq;
        const int lshift = qq >= 2 ? 4 : 0;
        for (int l = 0; l < 32; l++) {
            const int v = ((ql[l] >> lshift) & 0xF) | (((qh[l] >> (2 * qq)) & 3) << 4);
            w[l] = d * (float)sc[l / 16] * (float)(v - 32);
        }
        break;
    }
    default:
        for (int i = 0; i < 32; i++) w[i] = 0.f;
    }
}

__device__ __forceinline__ float activate(int act, float g, float u) {
    switch (act) {
    case ACT_GELU_TANH: {
        const float x = 0.7978846f * g * (1.f + 0.044715f * g * g);
        return g / (1.f + expf(-2.f * x)) * u;
    }
    case ACT_SWIGLU_OAI: {
        g = fminf(g, 7.f);
        u = fminf(fmaxf(u, -7.f), 7.f);
        return g / (1.f + expf(-1.702f * g)) * (u + 1.f);
    }
    default:
        return g / (1.f + expf(-g)) * u;
    }
}

extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
    moe_route(const float* __restrict__ scores, const float* __restrict__ expert_scale,
              uint32_t* __restrict__ plan, float* __restrict__ weights,
              unsigned long long* __restrict__ load, int rows, int experts, int top_k,
              int renormalize, int has_scale, int max_tiles) {
    __shared__ uint32_t counts[MAX_EXPERTS];
    __shared__ uint32_t offsets[MAX_EXPERTS];
    __shared__ uint32_t first_tile[MAX_EXPERTS];
    __shared__ uint32_t filled[MAX_EXPERTS];
    const int tid = threadIdx.x;
    const int slots = rows * top_k;
    uint32_t* choice = plan;
    uint32_t* order = plan + slots;
    uint32_t* pos = plan + 2 * slots;
    uint32_t* tiles = plan + 3 * slots;
    for (int e = tid; e < experts; e += ROUTE_THREADS) {
        counts[e] = 0;
        filled[e] = 0;
    }
    __syncthreads();
    for (int r = tid; r < rows; r += ROUTE_THREADS) {
        const float* s = scores + (size_t)r * experts;
        float max = -INFINITY;
        for (int e = 0; e < experts; e++) max = fmaxf(max, s[e]);
        float sum = 0.f;
        for (int e = 0; e < experts; e++) sum += expf(s[e] - max);
        int chosen[MAX_TOP_K];
        float top_sum = 0.f;
        for (int j = 0; j < top_k; j++) {
            int best = -1;
            for (int e = 0; e < experts; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= chosen[i] == e;
                if (!taken && (best < 0 || s[e] > s[best])) best = e;
            }
            chosen[j] = best;
            top_sum += expf(s[best] - max);
        }
        const float norm = renormalize ? top_sum : sum;
        for (int j = 0; j < top_k; j++) {
            const int e = chosen[j];
            float w = expf(s[e] - max) / norm;
            if (has_scale) w *= expert_scale[e];
            choice[r * top_k + j] = (uint32_t)e;
            weights[r * top_k + j] = w;
            atomicAdd(&counts[e], 1u);
        }
    }
    __syncthreads();
    if (tid == 0) {
        uint32_t at = 0, tile = 0;
        for (int e = 0; e < experts; e++) {
            offsets[e] = at;
            first_tile[e] = tile;
            at += counts[e];
            tile += (counts[e] + TILE_ROWS - 1) / TILE_ROWS;
        }
    }
    __syncthreads();
    for (int i = tid; i < slots; i += ROUTE_THREADS) {
        const uint32_t e = choice[i];
        const uint32_t p = offsets[e] + atomicAdd(&filled[e], 1u);
        order[p] = (uint32_t)i;
        pos[i] = p;
    }
    for (int t = tid; t < max_tiles; t += ROUTE_THREADS) tiles[3 * t + 2] = 0;
    __syncthreads();
    for (int e = tid; e < experts; e += ROUTE_THREADS) {
        const uint32_t n = counts[e];
        for (uint32_t i = 0; i * TILE_ROWS < n; i++) {
            uint32_t* t = tiles + 3 * (first_tile[e] + i);
            t[0] = (uint32_t)e;
            t[1] = offsets[e] + i * TILE_ROWS;
            t[2] = min(n - i * TILE_ROWS, (uint32_t)TILE_ROWS);
        }
        if (n) atomicAdd(&load[e], (unsigned long long)n);
    }
}
WICK_KERNEL(moe_route)

// One warp's dot products of weight row `w` (`k` inputs, in `type`) with
// the tile's input rows `x[r]`, r < n: the lanes take 32-input blocks in
// turn; every lane returns the sums.
__device__ __forceinline__ void dot_rows(int type, const uint8_t* w, const float* const* x, int n,
                                         int k, float* acc) {
    const int lane = threadIdx.x % 32;
    for (int r = 0; r < TILE_ROWS; r++) acc[r] = 0.f;
    for (int b = lane; b < k / 32; b += 32) {
        float v[32];
        dequant32(type, w, b, v);
        for (int r = 0; r < TILE_ROWS; r++) {
            if (r >= n) break;
            const float* xr = x[r] + 32 * b;
            float s = 0.f;
            for (int i = 0; i < 32; i++) s += v[i] * xr[i];
            acc[r] += s;
        }
    }
    for (int r = 0; r < TILE_ROWS; r++)
        for (int o = 16; o > 0; o /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
}

extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32)
    moe_gate_up(const float* __restrict__ x, const uint8_t* __restrict__ gate,
                const uint8_t* __restrict__ up, const float* __restrict__ bias,
                const uint32_t* __restrict__ plan, float* __restrict__ h, int rows, int top_k,
                int hidden, int ff, int gate_type, int up_type, int gate_row_bytes,
                int up_row_bytes, int has_bias, int act) {
    const int slots = rows * top_k;
    const uint32_t* order = plan + slots;
    const uint32_t* tile = plan + 3 * slots + 3 * blockIdx.y;
    const int e = (int)tile[0], first = (int)tile[1], n = (int)tile[2];
    const int j = blockIdx.x * GEMM_WARPS + threadIdx.x / 32;
    if (n == 0 || j >= ff) return;
    const float* xs[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++)
        xs[r] = x + (size_t)(order[first + min(r, n - 1)] / top_k) * hidden;
    float g[TILE_ROWS], u[TILE_ROWS];
    dot_rows(gate_type, gate + ((size_t)e * ff + j) * gate_row_bytes, xs, n, hidden, g);
    dot_rows(up_type, up + ((size_t)e * ff + j) * up_row_bytes, xs, n, hidden, u);
    // Per expert, the bias holds the gate's ff values, then the up's.
    const float bg = has_bias ? bias[(size_t)e * 2 * ff + j] : 0.f;
    const float bu = has_bias ? bias[(size_t)e * 2 * ff + ff + j] : 0.f;
    if (threadIdx.x % 32 == 0)
        for (int r = 0; r < n; r++)
            h[(size_t)(first + r) * ff + j] = activate(act, g[r] + bg, u[r] + bu);
}
WICK_KERNEL(moe_gate_up)

extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32)
    moe_down(const float* __restrict__ h, const uint8_t* __restrict__ down,
             const float* __restrict__ bias, const uint32_t* __restrict__ plan,
             float* __restrict__ y, int rows, int top_k, int hidden, int ff, int down_type,
             int down_row_bytes, int has_bias) {
    const int slots = rows * top_k;
    const uint32_t* tile = plan + 3 * slots + 3 * blockIdx.y;
    const int e = (int)tile[0], first = (int)tile[1], n = (int)tile[2];
    const int i = blockIdx.x * GEMM_WARPS + threadIdx.x / 32;
    if (n == 0 || i >= hidden) return;
    const float* hs[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) hs[r] = h + (size_t)(first + min(r, n - 1)) * ff;
    float acc[TILE_ROWS];
    dot_rows(down_type, down + ((size_t)e * hidden + i) * down_row_bytes, hs, n, ff, acc);
    const float b = has_bias ? bias[(size_t)e * hidden + i] : 0.f;
    if (threadIdx.x % 32 == 0)
        for (int r = 0; r < n; r++) y[(size_t)(first + r) * hidden + i] = acc[r] + b;
}
WICK_KERNEL(moe_down)

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    moe_combine(const float* __restrict__ y, const uint32_t* __restrict__ plan,
                const float* __restrict__ weights, float* __restrict__ out, int rows, int top_k,
                int hidden) {
    const int r = blockIdx.x, i = blockIdx.y * COMBINE_THREADS + threadIdx.x;
    if (i >= hidden) return;
    const uint32_t* pos = plan + 2 * rows * top_k;
    float acc = 0.f;
    for (int j = 0; j < top_k; j++) {
        const int slot = r * top_k + j;
        acc += weights[slot] * y[(size_t)pos[slot] * hidden + i];
    }
    out[(size_t)r * hidden + i] = acc;
}
WICK_KERNEL(moe_combine)
