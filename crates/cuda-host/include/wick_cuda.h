// What a CUDA kernel of wick's sees, on the CPU: the host build compiles
// the same `.cu` sources with the host C++ compiler against this header,
// and `emulator.cpp` runs them (see there for how, and docs/architecture.md).
//
// Each CUDA thread of a block is a fiber on the launching OS thread. The
// built-in indices are plain globals that the emulator sets before resuming
// a fiber; every call that can switch fibers (`__syncthreads`, the warp
// functions) is an out-of-line call, so the compiler reloads them after it.
// `__shared__` arrays are statics in one linker section, which the emulator
// poisons before each block; blocks run one at a time, so each has it alone.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cstddef>
#include <utility>

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};

extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
// Static, in the section the emulator poisons. A `.cu` file is compiled
// inside an unnamed namespace (`kernels.cpp`), which keeps its templates'
// statics out of COMDAT groups: GCC will not mix those with plain statics in
// one named section.
#define __shared__ static __attribute__((section("wick_shared")))

// -- Barriers and warp functions (emulator.cpp) ---------------------------
// Each is a macro that passes its source line: the emulator requires the
// threads meeting at one to be at the same statement, and the compiler may
// copy a statement into several places in the machine code.

namespace wick_cuda {

struct Site {
    const char* file;
    int line;
};

enum class Warp : int { Idx, Up, Down, Xor, Sync, Ballot };

void barrier(Site site);

// A rendezvous of the lanes in `mask` of the calling thread's warp at one
// statement: each lane gives `value`, and gets what `op` and `arg` select.
uint32_t warp_op(Site site, unsigned mask, uint32_t value, Warp op, int arg, int width);

template <typename T>
__forceinline__ T shfl(Site site, unsigned mask, T value, Warp op, int arg, int width = 32) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "a shuffle moves 4 or 8 bytes");
    uint32_t words[sizeof(T) / 4];
    memcpy(words, &value, sizeof(T));
    for (auto& w : words) w = warp_op(site, mask, w, op, arg, width);
    memcpy(&value, words, sizeof(T));
    return value;
}

__forceinline__ void syncwarp(Site site, unsigned mask = 0xffffffffu) {
    warp_op(site, mask, 0, Warp::Sync, 0, 32);
}

__forceinline__ unsigned ballot(Site site, unsigned mask, int predicate) {
    return warp_op(site, mask, predicate != 0, Warp::Ballot, 0, 32);
}

}  // namespace wick_cuda

#define WICK_SITE (wick_cuda::Site{__FILE__, __LINE__})
#define __syncthreads() wick_cuda::barrier(WICK_SITE)
#define __shfl_sync(mask, v, ...) wick_cuda::shfl(WICK_SITE, mask, v, wick_cuda::Warp::Idx, __VA_ARGS__)
#define __shfl_up_sync(mask, v, ...) wick_cuda::shfl(WICK_SITE, mask, v, wick_cuda::Warp::Up, __VA_ARGS__)
#define __shfl_down_sync(mask, v, ...) \
    wick_cuda::shfl(WICK_SITE, mask, v, wick_cuda::Warp::Down, __VA_ARGS__)
#define __shfl_xor_sync(mask, v, ...) wick_cuda::shfl(WICK_SITE, mask, v, wick_cuda::Warp::Xor, __VA_ARGS__)
#define __syncwarp(...) wick_cuda::syncwarp(WICK_SITE, ##__VA_ARGS__)
#define __ballot_sync(mask, predicate) wick_cuda::ballot(WICK_SITE, mask, predicate)
#define __any_sync(mask, predicate) (wick_cuda::ballot(WICK_SITE, mask, predicate) != 0)
#define __all_sync(mask, predicate) (wick_cuda::ballot(WICK_SITE, mask, predicate) == (unsigned)(mask))

// -- Atomics ---------------------------------------------------------------
// Fibers switch only at barriers and warp functions, and blocks run one at
// a time, so a read-modify-write is atomic as written.

template <typename T>
__forceinline__ T atomicAdd(T* at, T v) {
    const T old = *at;
    *at = old + v;
    return old;
}
template <typename T>
__forceinline__ T atomicMax(T* at, T v) {
    const T old = *at;
    if (v > old) *at = v;
    return old;
}
template <typename T>
__forceinline__ T atomicMin(T* at, T v) {
    const T old = *at;
    if (v < old) *at = v;
    return old;
}

// -- Math ------------------------------------------------------------------
// The fast intrinsics compute the exact function here; the GPU's
// approximations stay within the tolerances the kernel tests allow.

__forceinline__ float __expf(float x) { return expf(x); }
__forceinline__ float __logf(float x) { return logf(x); }
__forceinline__ float __fdividef(float a, float b) { return a / b; }
__forceinline__ float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// Explicitly rounded operations (never contracted into an FMA by nvcc).
__forceinline__ float __fadd_rn(float a, float b) { return a + b; }
__forceinline__ float __fsub_rn(float a, float b) { return a - b; }
__forceinline__ float __fmul_rn(float a, float b) { return a * b; }
__forceinline__ float __fdiv_rn(float a, float b) { return a / b; }
__forceinline__ float __frcp_rn(float a) { return 1.0f / a; }
__forceinline__ int min(int a, int b) { return a < b ? a : b; }
__forceinline__ int max(int a, int b) { return a > b ? a : b; }
__forceinline__ unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
__forceinline__ unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
__forceinline__ long long min(long long a, long long b) { return a < b ? a : b; }
__forceinline__ long long max(long long a, long long b) { return a > b ? a : b; }

__forceinline__ unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
__forceinline__ float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// -- Half types --------------------------------------------------------------
// The bits, converted with round-to-nearest-even as CUDA's `__float2half`
// and `__float2bfloat16` do.

struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

__forceinline__ uint32_t wick_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
__forceinline__ float wick_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__forceinline__ float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.bits & 0x8000) << 16;
    const uint32_t exp = (h.bits >> 10) & 0x1f, man = h.bits & 0x3ff;
    if (exp == 0x1f) return wick_bits_f32(sign | 0x7f800000 | (man << 13));  // inf, NaN
    if (exp != 0) return wick_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    // Zero or subnormal: man * 2^-24, exact in f32.
    const float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

__forceinline__ __half __float2half(float f) {
    const uint32_t x = wick_f32_bits(f);
    const uint16_t sign = (x >> 16) & 0x8000;
    const uint32_t ax = x & 0x7fffffff;
    uint16_t h;
    if (ax > 0x7f800000) {
        h = 0x7fff;  // NaN, as CUDA writes it
    } else if (ax >= 0x477ff000) {
        h = 0x7c00;  // 65520 and above round to infinity
    } else if (ax >= 0x38800000) {
        // Normal: rebias the exponent, round the 13 dropped bits to even.
        const uint32_t r = ax - 0x38000000;
        h = (uint16_t)((r + 0xfff + ((r >> 13) & 1)) >> 13);
    } else {
        // Subnormal or zero: adding 0.5 leaves units of 2^-24 in the low
        // mantissa bits, rounded to even by the f32 addition itself.
        const float v = wick_bits_f32(ax) + 0.5f;
        h = (uint16_t)(wick_f32_bits(v) - 0x3f000000);
    }
    return __half{(uint16_t)(sign | h)};
}

__forceinline__ float __bfloat162float(__nv_bfloat16 b) {
    return wick_bits_f32((uint32_t)b.bits << 16);
}

__forceinline__ __nv_bfloat16 __float2bfloat16(float f) {
    const uint32_t x = wick_f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return __nv_bfloat16{0x7fff};
    return __nv_bfloat16{(uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16)};
}

__forceinline__ __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
__forceinline__ __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
    return __nv_bfloat16{bits};
}

// -- Entry points ------------------------------------------------------------
// `WICK_KERNEL(name)` after a `__global__` function registers it by name,
// with a thunk that takes its arguments as the driver API does: an array of
// pointers to each argument's value, in order.

namespace wick_cuda {

using Thunk = void (*)(void** args);

// Both in kernels.cpp, with the kernels: the launcher's call to
// `find_kernel` is what links that object, and its registrations, in.
void register_kernel(const char* name, Thunk thunk);
Thunk find_kernel(const char* name);  // null if there is none

template <typename F, F f>
struct Packed;
template <typename... A, void (*f)(A...)>
struct Packed<void (*)(A...), f> {
    static void call(void** args) { call_with(args, std::index_sequence_for<A...>{}); }
    template <size_t... I>
    static void call_with(void** args, std::index_sequence<I...>) {
        f(*static_cast<A*>(args[I])...);
    }
};

struct Registrar {
    Registrar(const char* name, Thunk thunk) { register_kernel(name, thunk); }
};

}  // namespace wick_cuda

#define WICK_KERNEL(name)                                      \
    static wick_cuda::Registrar wick_kernel_##name(#name,      \
        &wick_cuda::Packed<decltype(&name), &name>::call);
