// Paged attention on a CUDA device: the GPU twin of `host.rs`.
//
// One launch per layer covers the whole flat batch, decode rows and prompt
// chunks alike: every row attends causally to its own sequence's cached
// positions, read from the block pool through the block table in the step's
// packed metadata (`models/step_meta.rs`, the kernel section). A prompt chunk
// reads the blocks cached before it, so prefix-cache hits and chunked prefill
// need nothing special.
//
// The pool is `[num_blocks * block_size, kv_heads * head_dim]` (K and V
// apart), so slot `s` of head `h` starts at `s * kv_dim + h * head_dim`.
//
// Metadata, all u32 in one buffer (`meta`):
//   meta[seqs + 5 * s ..]  start row, rows, first position, offset of its
//                          block table, offset of its sliding-window table
//   meta[row_seq + r]      the sequence of row r
//   meta[row_end + r]      the end of the positions row r sees: one past
//                          its own, or the end of a span its rows see
//                          whole (a Gemma 3 image's tokens)
//   meta[slots + r]        the pool slot row r's K/V are written to

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// The host build (crates/cuda-host) registers each entry point by name.
#ifndef WICK_KERNEL
#define WICK_KERNEL(name)
#endif

#define WARPS 4
#define MAX_GROUP 8
#define SEQ_FIELDS 5

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
    return x;
}

// Cache write by slot mapping. Launch shape: one block per new row, its
// threads striding over the row's K and V heads (`kv_dim` values each), so
// consecutive threads touch consecutive elements on both sides.
template <typename Q, typename KV>
__device__ void write_kv(const Q* __restrict__ qkv, int qkv_stride, int k_at, int v_at,
                         int kv_dim, const uint32_t* __restrict__ meta, int slots,
                         KV* __restrict__ k_pool, KV* __restrict__ v_pool) {
    const int row = blockIdx.x;
    const size_t dst = (size_t)meta[slots + row] * kv_dim;
    const Q* src = qkv + (size_t)row * qkv_stride;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k_pool[dst + i] = from_f32<KV>(to_f32(src[k_at + i]));
        v_pool[dst + i] = from_f32<KV>(to_f32(src[v_at + i]));
    }
}

// Attention. Launch shape: grid (rows, kv_heads * subgroups, parts), WARPS
// warps a block. A block owns one query row and one KV head, i.e. the query
// heads that share it (GQA; up to MAX_GROUP of them, more take `subgroups`
// blocks), so each key and value read from the pool serves all of them. Warp w takes keys w, w + WARPS, ... of the block's part of the
// row's range; a key's head vector is spread over the warp's 32 lanes (EPL
// = head_dim / 32 values each, so one read is one coalesced segment), the
// dot products are reduced with shuffles, and each warp keeps an online
// softmax (max, sum, weighted values) per query head in registers. The
// warps' states are merged through shared memory at the end.
//
// With few rows (one stream's decode), rows * kv_heads blocks would leave
// most of the GPU idle, so the host splits each row's key range into `parts`
// of `part_len` keys over blockIdx.z (flash-decoding): each part then writes
// its unnormalised state to `part_ml` / `part_acc`, and `combine` merges the
// parts. With one part the block writes the output row itself.
//
// `sinks` (when `has_sinks`): a logit per query head that joins the softmax
// once, with no value (gpt-oss). It enters where the softmax is finished:
// here with one part, else in `combine`.
template <typename Q, typename KV, int EPL>
__device__ void attend(const Q* __restrict__ qkv, int qkv_stride, const KV* __restrict__ k_pool,
                       const KV* __restrict__ v_pool, const uint32_t* __restrict__ meta, int seqs,
                       int row_seq, int row_end, int table_field, int num_heads, int num_kv_heads,
                       int block_size, int window, float scale, int part_len,
                       const float* __restrict__ sinks, int has_sinks, Q* __restrict__ out,
                       float* __restrict__ part_ml, float* __restrict__ part_acc) {
    constexpr int HD = EPL * 32;
    const int row = blockIdx.x, part = blockIdx.z, parts = gridDim.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kv_dim = num_kv_heads * HD, per_kv = num_heads / num_kv_heads;
    // More than MAX_GROUP query heads per KV head take several blocks.
    const int subgroups = (per_kv + MAX_GROUP - 1) / MAX_GROUP;
    const int kvh = blockIdx.y / subgroups, first = (blockIdx.y % subgroups) * MAX_GROUP;
    const int group = min(MAX_GROUP, per_kv - first);
    const int head0 = kvh * per_kv + first;

    const uint32_t* seq = meta + seqs + SEQ_FIELDS * meta[row_seq + row];
    const int pos = (int)seq[2] + row - (int)seq[0];
    const uint32_t* table = meta + seq[table_field];
    const int lo = window > 0 ? max(0, pos + 1 - window) : 0;
    const int from = max(lo, part * part_len);
    const int to = min((int)meta[row_end + row], (part + 1) * part_len);

    // This row's query heads, pre-scaled.
    float q[MAX_GROUP][EPL];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        if (g < group) {
            const Q* src = qkv + (size_t)row * qkv_stride + (head0 + g) * HD + lane * EPL;
#pragma unroll
            for (int e = 0; e < EPL; e++) q[g][e] = to_f32(src[e]) * scale;
        }
    }
    float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][EPL];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[g][e] = 0.f;
    }

    for (int j = from + warp; j < to; j += WARPS) {
        const size_t slot = (size_t)table[j / block_size] * block_size + j % block_size;
        const size_t at = slot * kv_dim + kvh * HD + lane * EPL;
        float k[EPL], v[EPL];
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            k[e] = to_f32(k_pool[at + e]);
            v[e] = to_f32(v_pool[at + e]);
        }
#pragma unroll
        for (int g = 0; g < MAX_GROUP; g++) {
            if (g < group) {
                float dot = 0.f;
#pragma unroll
                for (int e = 0; e < EPL; e++) dot += q[g][e] * k[e];
                dot = warp_sum(dot);
                const float m_new = fmaxf(m[g], dot);
                const float keep = __expf(m[g] - m_new), p = __expf(dot - m_new);
                l[g] = l[g] * keep + p;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[g][e] = acc[g][e] * keep + p * v[e];
                m[g] = m_new;
            }
        }
    }

    // Merge the warps, one query head at a time through shared memory.
    __shared__ float s_ml[WARPS][2];
    __shared__ float s_acc[WARPS][HD];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        if (g >= group) break;
        if (lane == 0) {
            s_ml[warp][0] = m[g];
            s_ml[warp][1] = l[g];
        }
#pragma unroll
        for (int e = 0; e < EPL; e++) s_acc[warp][lane * EPL + e] = acc[g][e];
        __syncthreads();
        const int head = head0 + g;
        const bool sink = has_sinks && parts == 1;
        float big = sink ? sinks[head] : -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; w++) big = fmaxf(big, s_ml[w][0]);
        float sum = sink ? __expf(sinks[head] - big) : 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            if (s_ml[w][0] > -INFINITY) sum += s_ml[w][1] * __expf(s_ml[w][0] - big);
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float x = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; w++)
                if (s_ml[w][0] > -INFINITY) x += s_acc[w][d] * __expf(s_ml[w][0] - big);
            if (parts == 1) {
                out[((size_t)row * num_heads + head) * HD + d] = from_f32<Q>(x / sum);
            } else {
                part_acc[(((size_t)row * num_heads + head) * parts + part) * HD + d] = x;
            }
        }
        if (parts > 1 && threadIdx.x == 0) {
            float* ml = part_ml + (((size_t)row * num_heads + head) * parts + part) * 2;
            ml[0] = big;
            ml[1] = sum;
        }
        __syncthreads();
    }
}

// Merges the parts of split rows. Launch shape: one block per (row, head),
// one thread per value of the head (head_dim <= 256 threads), each reading
// its column of every part: the parts' maxima and sums are few and cached.
template <typename Q>
__device__ void combine(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                        int parts, int head_dim, const float* __restrict__ sinks,
                        int has_sinks, Q* __restrict__ out) {
    const size_t rh = (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    const float* ml = part_ml + rh * parts * 2;
    const float sink = has_sinks ? sinks[blockIdx.y] : -INFINITY;
    float big = sink;
    for (int p = 0; p < parts; p++) big = fmaxf(big, ml[2 * p]);
    float sum = has_sinks ? __expf(sink - big) : 0.f, x = 0.f;
    for (int p = 0; p < parts; p++) {
        if (ml[2 * p] == -INFINITY) continue; // a part past the row's range
        const float w = __expf(ml[2 * p] - big);
        sum += ml[2 * p + 1] * w;
        x += part_acc[(rh * parts + p) * head_dim + threadIdx.x] * w;
    }
    out[rh * head_dim + threadIdx.x] = from_f32<Q>(x / sum);
}

#define ATTEND(NAME, Q, KV, EPL)                                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
        NAME(const Q* qkv, int qkv_stride, const KV* k_pool, const KV* v_pool,                \
             const uint32_t* meta, int seqs, int row_seq, int row_end, int table_field,       \
             int num_heads, int num_kv_heads, int block_size, int window, float scale,        \
             int part_len, const float* sinks, int has_sinks, Q* out, float* part_ml,         \
             float* part_acc) {                                                               \
        attend<Q, KV, EPL>(qkv, qkv_stride, k_pool, v_pool, meta, seqs, row_seq, row_end,     \
                           table_field, num_heads, num_kv_heads, block_size, window, scale,   \
                           part_len, sinks, has_sinks, out, part_ml, part_acc);               \
    }                                                                                         \
    WICK_KERNEL(NAME)

#define WRITE_KV(NAME, Q, KV)                                                                \
    extern "C" __global__ void NAME(const Q* qkv, int qkv_stride, int k_at, int v_at,        \
                                    int kv_dim, const uint32_t* meta, int slots, KV* k_pool, \
                                    KV* v_pool) {                                            \
        write_kv<Q, KV>(qkv, qkv_stride, k_at, v_at, kv_dim, meta, slots, k_pool, v_pool);   \
    }                                                                                        \
    WICK_KERNEL(NAME)

#define FOR_HEAD_DIMS(Q, KV, QN, KVN)                  \
    ATTEND(paged_attend_##QN##_##KVN##_32, Q, KV, 1)   \
    ATTEND(paged_attend_##QN##_##KVN##_64, Q, KV, 2)   \
    ATTEND(paged_attend_##QN##_##KVN##_96, Q, KV, 3)   \
    ATTEND(paged_attend_##QN##_##KVN##_128, Q, KV, 4)  \
    ATTEND(paged_attend_##QN##_##KVN##_256, Q, KV, 8)  \
    WRITE_KV(paged_write_##QN##_##KVN, Q, KV)

#define FOR_POOLS(Q, QN)                                    \
    FOR_HEAD_DIMS(Q, float, QN, f32)                        \
    FOR_HEAD_DIMS(Q, __half, QN, f16)                       \
    FOR_HEAD_DIMS(Q, __nv_bfloat16, QN, bf16)               \
    extern "C" __global__ void paged_combine_##QN(          \
        const float* part_ml, const float* part_acc, int parts, int head_dim,           \
        const float* sinks, int has_sinks, Q* out) {                                    \
        combine<Q>(part_ml, part_acc, parts, head_dim, sinks, has_sinks, out);          \
    }                                                                                   \
    WICK_KERNEL(paged_combine_##QN)

FOR_POOLS(float, f32)
FOR_POOLS(__half, f16)
FOR_POOLS(__nv_bfloat16, bf16)
