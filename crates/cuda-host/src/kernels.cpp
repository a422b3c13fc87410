// wick's CUDA kernels for the host: each `.cu` file as nvcc sees it, after
// wick_cuda.h, inside an unnamed namespace (see `__shared__` there). Their
// `WICK_KERNEL` lines register every entry point with the emulator.
#include "wick_cuda.h"

#include <vector>

namespace {
struct Kernel {
    const char* name;
    wick_cuda::Thunk thunk;
};

// A function's static: the registrations below run before `main`, in an
// order no rule fixes.
std::vector<Kernel>& kernels() {
    static std::vector<Kernel> all;
    return all;
}
}  // namespace

void wick_cuda::register_kernel(const char* name, Thunk thunk) {
    kernels().push_back({name, thunk});
}

wick_cuda::Thunk wick_cuda::find_kernel(const char* name) {
    for (const Kernel& k : kernels())
        if (strcmp(k.name, name) == 0) return k.thunk;
    return nullptr;
}

namespace {
#include "../../../src/attention/paged_attention.cu"
#include "../../../src/sampling/argmax.cu"
#include "selftest.cu"
}  // namespace
