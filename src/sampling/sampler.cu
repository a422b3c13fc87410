// Sampling on a CUDA device: the twin of `sampler.rs`'s `Sampler::sample`,
// one row of logits per block, so that only the picked ids (and the
// logprobs asked for) come back to the host. It follows the host's steps
// and arithmetic: the grammar mask, logprobs of the masked logits, then
// `logit_bias`, the repetition, presence and frequency penalties and the
// `min_tokens` ban (each an explicitly rounded f32 operation, as Rust
// computes it), then greedy, or temperature, top-k, min-p and top-p over
// `fast_exp` weights (`vec_math.rs`'s polynomial, fused where Rust fuses
// it) and the exponential race of `race.rs`, keyed by the row's key and
// each token id. Sums are f64 here where the host sums f32 in another
// order, so a top-p boundary can differ only where the mass lands within
// rounding of a prefix sum.
//
// Launch shape: one block of exactly THREADS (1024) threads per row. Maps
// and reductions stride over the row, so consecutive threads read
// consecutive values; where order by id matters (ties at the top-k or
// top-p boundary) each thread takes a contiguous chunk and a block scan
// ranks the chunks. Top-k finds its threshold by a radix select (four
// passes of 8-bit digits, a 256-bin histogram in shared memory); top-p by
// bisection over the weights' bits (32 block sums). Each row's fields
// (`FIELDS` u32 words) and lists come from `sampling/device.rs`'s packing.

#include <math.h>
#include <stdint.h>

// The host build (crates/cuda-host) registers each entry point by name.
#ifndef WICK_KERNEL
#define WICK_KERNEL(name)
#endif

#define THREADS 1024
#define WARPS (THREADS / 32)
#define FULL 0xffffffffu
#define NONE 0xffffffffu
#define GREEDY_TEMPERATURE 1e-5f

// A row's fields, as `device.rs` packs them (f32 fields as their bits).
#define F_TEMPERATURE 0
#define F_TOP_K 1
#define F_TOP_P 2
#define F_MIN_P 3
#define F_REPETITION 4
#define F_PRESENCE 5
#define F_FREQUENCY 6
#define F_KEY_LO 7
#define F_KEY_HI 8
#define F_LOGPROBS 9  // top logprobs wanted, or NONE for no logprobs
#define F_BIAS 10     // offset and count of (id, bias) pairs
#define F_PENALTY 12  // offset and count of (id, in context, output count)
#define F_BANNED 14   // offset and count of ids
#define F_MASK 16     // offset of the allowed-ids bitset, or NONE
#define FIELDS 17

static_assert(WARPS == 32, "the reductions below read one partial per lane");

// Larger value, then lower id; NaN never wins.
__device__ __forceinline__ bool better(float av, uint32_t ai, float bv, uint32_t bi) {
    return av > bv || (av == bv && ai < bi);
}

// The (key, id) pair that beats every other thread's under `wins`, a
// strict order; every thread gets it.
template <typename K, typename W>
__device__ void block_pick(K& key, uint32_t& id, W wins) {
    __shared__ K keys[WARPS];
    __shared__ uint32_t ids[WARPS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int round = 0; round < 2; round++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const K ok = __shfl_xor_sync(FULL, key, o);
            const uint32_t oi = __shfl_xor_sync(FULL, id, o);
            if (wins(ok, oi, key, id)) {
                key = ok;
                id = oi;
            }
        }
        if (round == 1) break;
        if (lane == 0) {
            keys[warp] = key;
            ids[warp] = id;
        }
        __syncthreads();
        key = keys[lane];
        id = ids[lane];
    }
    __syncthreads();  // before the arrays' next use
}

// The block's sum; the same value, to the bit, in every thread (a
// butterfly adds the same pairs in every lane).
template <typename T>
__device__ T block_sum(T v) {
    __shared__ T partial[WARPS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = partial[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    __syncthreads();
    return v;
}

// The sum of `c` over the threads before this one.
__device__ uint32_t block_exclusive_scan(uint32_t c) {
    __shared__ uint32_t totals[WARPS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint32_t x = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(FULL, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) totals[warp] = x;
    __syncthreads();
    uint32_t before = 0;
    for (int w = 0; w < warp; w++) before += totals[w];
    __syncthreads();
    return before + x - c;
}

// The id of the `n`-th (from 1) lowest id `i < vocab` with `pred(i)`, or
// NONE if fewer match. Each thread counts a contiguous chunk of ids.
template <typename P>
__device__ uint32_t nth_matching(uint32_t vocab, uint32_t n, P pred) {
    __shared__ uint32_t found;
    const uint32_t per = (vocab + THREADS - 1) / THREADS;
    const uint32_t from = min(vocab, threadIdx.x * per), to = min(vocab, from + per);
    uint32_t c = 0;
    for (uint32_t i = from; i < to; i++) c += pred(i) ? 1 : 0;
    if (threadIdx.x == 0) found = NONE;
    const uint32_t before = block_exclusive_scan(c);  // its barriers order `found`
    if (before < n && n <= before + c) {
        uint32_t seen = before;
        for (uint32_t i = from; i < to; i++) {
            if (pred(i) && ++seen == n) {
                found = i;
                break;
            }
        }
    }
    __syncthreads();
    const uint32_t out = found;
    __syncthreads();
    return out;
}

// `vec_math.rs`'s `fast_exp`, operation for operation: e^x for x <= 0.
__device__ __forceinline__ float fast_exp(float x) {
    const float LN2_HI = 355.0f / 512.0f;
    const float LN2_LO = (float)(0.69314718055994530942 - 355.0 / 512.0);
    const float SHIFT = 12582912.0f;
    const float clamped = fminf(fmaxf(x, -87.0f), 0.0f);
    const float t = __fadd_rn(__fmul_rn(clamped, 1.44269504088896340736f), SHIFT);
    const float n = __fsub_rn(t, SHIFT);
    const float r = __fsub_rn(__fsub_rn(clamped, __fmul_rn(n, LN2_HI)), __fmul_rn(n, LN2_LO));
    float p = 1.0f / 5040.0f;
    const float c[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
#pragma unroll
    for (int j = 0; j < 7; j++) p = fmaf(p, r, c[j]);
    const uint32_t n_bits = __float_as_uint(t) - __float_as_uint(SHIFT);
    const float two_n = __uint_as_float((n_bits + 127u) << 23);
    return x < -87.0f ? 0.0f : __fmul_rn(p, two_n);
}

// `race.rs`'s hash of token `id` under `key`.
__device__ __forceinline__ uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

// A u32 whose order is the float's (NaN aside).
__device__ __forceinline__ uint32_t sortable(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The `k`-th largest of `values` in the order (value descending, id
// ascending), 0 < k < vocab: its value, through `value`, and its id, so
// that the k largest are those above the value and those equal to it up to
// that id.
__device__ uint32_t kth_largest(const float* values, uint32_t vocab, uint32_t k, float* value) {
    __shared__ uint32_t hist[256];
    __shared__ uint32_t digit_and_left[2];
    uint32_t prefix = 0, left = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += THREADS) hist[b] = 0;
        __syncthreads();
        const uint32_t high = shift == 24 ? 0 : 0xffffffffu << (shift + 8);
        for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) {
            const float v = values[i];
            if (v != v) continue;  // NaN
            const uint32_t s = sortable(v);
            if ((s & high) == prefix) atomicAdd(&hist[(s >> shift) & 0xff], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t d = 255, acc = 0;
            while (acc + hist[d] < left && d > 0) acc += hist[d--];
            digit_and_left[0] = d;
            digit_and_left[1] = left - acc;
        }
        __syncthreads();
        prefix |= digit_and_left[0] << shift;
        left = digit_and_left[1];
        __syncthreads();
    }
    // `prefix` is the k-th value's key; `left` of the values equal to it
    // belong to the k largest, the lowest ids first.
    const uint32_t key = prefix;
    const float v = __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
    *value = v;
    return nth_matching(vocab, left, [&](uint32_t i) { return values[i] == v; });
}

// Keeps the shortest prefix of `w` (non-negative weights, in the order
// weight descending, id ascending) whose sum reaches `mass`, zeroing the
// rest; keeps everything if the whole falls short.
__device__ void nucleus(float* w, uint32_t vocab, double mass) {
    auto mass_from = [&](uint32_t bits) {
        const float t = __uint_as_float(bits);
        double s = 0.0;
        for (uint32_t i = threadIdx.x; i < vocab; i += THREADS)
            if (w[i] >= t) s += w[i];
        return block_sum(s);
    };
    // Weights are at most 1: bits 0x3f800001 is above them all.
    uint32_t lo = 1, hi = 0x3f800001u;
    if (mass_from(lo) < mass) return;
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (mass_from(mid) >= mass) lo = mid;
        else hi = mid;
    }
    const float t = __uint_as_float(lo);
    const double above = mass_from(lo + 1);
    // How many of the weights equal to `t` the prefix takes, lowest ids
    // first.
    double need = ceil((mass - above) / (double)t);
    const uint32_t take = need < 1.0 ? 1u : (uint32_t)need;
    uint32_t cut = nth_matching(vocab, take, [&](uint32_t i) { return w[i] == t; });
    for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) {
        const bool keep = w[i] > t || (w[i] == t && (cut == NONE || i <= cut));
        if (!keep) w[i] = 0.0f;
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(THREADS)
    sample_rows(const float* __restrict__ logits, float* __restrict__ work, uint32_t vocab,
                const uint32_t* __restrict__ params, uint32_t max_top, uint32_t* __restrict__ ids,
                float* __restrict__ logprobs, uint32_t* __restrict__ top) {
    const uint32_t row = blockIdx.x;
    const uint32_t* p = params + (size_t)row * FIELDS;
    const float* raw = logits + (size_t)row * vocab;
    float* w = work + (size_t)row * vocab;
    const uint32_t mask_at = p[F_MASK];
    const auto best = [](float a, uint32_t ai, float b, uint32_t bi) { return better(a, ai, b, bi); };
    auto allowed = [&](uint32_t i) {
        return mask_at == NONE || (params[mask_at + i / 32] >> (i % 32) & 1);
    };

    // The grammar's mask, then the logprobs of what it leaves.
    for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) w[i] = allowed(i) ? raw[i] : -INFINITY;
    __syncthreads();
    const uint32_t n_top = p[F_LOGPROBS];
    float lse = NAN;
    if (n_top != NONE) {
        float m = -INFINITY;
        uint32_t mi = NONE;
        for (uint32_t i = threadIdx.x; i < vocab; i += THREADS)
            if (better(w[i], i, m, mi)) m = w[i], mi = i;
        block_pick(m, mi, best);
        if (isfinite(m)) {
            float s = 0.0f;
            for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) s += fast_exp(w[i] - m);
            lse = m + logf(block_sum(s));
        } else {
            lse = m;
        }
        // The most likely first: each the best below the one before.
        float pv = INFINITY;
        uint32_t pi = 0;
        for (uint32_t k = 0; k < max_top; k++) {
            float bv = -INFINITY;
            uint32_t bi = NONE;
            if (k < n_top) {
                for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) {
                    const float v = w[i];
                    const bool below = k == 0 || v < pv || (v == pv && i > pi);
                    if (below && better(v, i, bv, bi)) bv = v, bi = i;
                }
            }
            block_pick(bv, bi, best);
            if (threadIdx.x == 0) {
                top[((size_t)row * max_top + k) * 2] = bi;
                top[((size_t)row * max_top + k) * 2 + 1] = __float_as_uint(bv - lse);
            }
            pv = bv;
            pi = bi;
        }
    }

    // Bias, penalties, the min_tokens ban: each list's ids are distinct.
    const uint32_t* bias = params + p[F_BIAS];
    for (uint32_t j = threadIdx.x; j < p[F_BIAS + 1]; j += THREADS)
        if (bias[2 * j] < vocab) w[bias[2 * j]] = __fadd_rn(w[bias[2 * j]], __uint_as_float(bias[2 * j + 1]));
    __syncthreads();
    const float rep = __uint_as_float(p[F_REPETITION]);
    const float presence = __uint_as_float(p[F_PRESENCE]), frequency = __uint_as_float(p[F_FREQUENCY]);
    const uint32_t* pen = params + p[F_PENALTY];
    for (uint32_t j = threadIdx.x; j < p[F_PENALTY + 1]; j += THREADS) {
        const uint32_t id = pen[3 * j], in_context = pen[3 * j + 1], count = pen[3 * j + 2];
        if (id >= vocab) continue;
        float v = w[id];
        if (rep != 1.0f && in_context) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
        if ((presence != 0.0f || frequency != 0.0f) && count > 0)
            v = __fsub_rn(v, __fadd_rn(presence, __fmul_rn(frequency, (float)count)));
        w[id] = v;
    }
    __syncthreads();
    const uint32_t* banned = params + p[F_BANNED];
    for (uint32_t j = threadIdx.x; j < p[F_BANNED + 1]; j += THREADS)
        if (banned[j] < vocab) w[banned[j]] = -INFINITY;
    __syncthreads();

    // Greedy, or no finite logit left: the argmax.
    float max = -INFINITY;
    uint32_t pick = NONE;
    for (uint32_t i = threadIdx.x; i < vocab; i += THREADS)
        if (better(w[i], i, max, pick)) max = w[i], pick = i;
    block_pick(max, pick, best);
    if (pick == NONE) pick = 0;
    const float temperature = __uint_as_float(p[F_TEMPERATURE]);
    if (temperature >= GREEDY_TEMPERATURE && isfinite(max)) {
        const float inv_t = __frcp_rn(temperature);  // 1 / t, rounded as Rust's
        const uint32_t k = p[F_TOP_K];
        const float top_p = __uint_as_float(p[F_TOP_P]), min_p = __uint_as_float(p[F_MIN_P]);
        double total = 0.0;
        if (k > 0 && k < vocab) {
            float kv;
            const uint32_t cut = kth_largest(w, vocab, k, &kv);
            for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) {
                const bool in = w[i] > kv || (w[i] == kv && i <= cut);
                const float e = in ? fast_exp(__fmul_rn(__fsub_rn(w[i], max), inv_t)) : 0.0f;
                total += e;
                w[i] = e > 0.0f && e >= min_p ? e : 0.0f;
            }
        } else {
            for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) {
                const float e = fast_exp(__fmul_rn(__fsub_rn(w[i], max), inv_t));
                total += e;
                w[i] = e < min_p ? 0.0f : e;
            }
        }
        total = block_sum(total);
        if (top_p < 1.0f) nucleus(w, vocab, (double)top_p * total);
        // The race: the token whose exponential clock rings first.
        const uint64_t key = ((uint64_t)p[F_KEY_HI] << 32) | p[F_KEY_LO];
        double first = INFINITY;
        uint32_t winner = NONE;
        for (uint32_t i = threadIdx.x; i < vocab; i += THREADS) {
            if (!(w[i] > 0.0f)) continue;
            const uint32_t h = mix(mix(i ^ (uint32_t)key) ^ (uint32_t)(key >> 32));
            const double u = ((double)h + 0.5) / 4294967296.0;
            const double time = -log(u) / (double)w[i];
            if (time < first || (time == first && i < winner)) first = time, winner = i;
        }
        block_pick(first, winner, [](double a, uint32_t ai, double b, uint32_t bi) {
            return a < b || (a == b && ai < bi);
        });
        if (winner != NONE) pick = winner;
    }
    if (threadIdx.x == 0) {
        ids[row] = pick;
        logprobs[row] = n_top == NONE ? NAN : (allowed(pick) ? raw[pick] : -INFINITY) - lse;
    }
}
WICK_KERNEL(sample_rows)
