// Runs a kernel of the host build: every block of the grid in turn, each
// of its threads a fiber on the calling OS thread.
//
// Strict rather than kind, so that a kernel that works here works on a GPU:
// - Between two barriers, the scheduler picks the next thread to run at
//   random (seeded per launch and block) and runs it until it waits at a
//   barrier or a warp function, or ends. A thread that reads another's
//   shared-memory write without a barrier between them sees it or not
//   depending on the order; blocks run in a seeded random order too.
// - `__shared__` memory is filled with 0xff bytes (NaN as f32, all ones as
//   an integer) before each block.
// - A warp function waits for every lane its mask names, and fails the
//   launch if one of them has ended, waits at a barrier, is not in the
//   block, or meets it at another statement or with another mask. A lane
//   that reads a lane outside the mask gets the poison value.
// - `__syncthreads` waits for every thread of the block, at one statement;
//   if no thread can run and they are not all there, the launch fails and
//   says where each thread waits.
//
// Fibers are made with `makecontext` once per launch and switched with
// `_setjmp` / `_longjmp` (`swapcontext` costs a system call per switch for
// the signal mask, ten times the rest). A fiber that waits picks the next
// one itself; only when none can run does control go back to `run_block`,
// to release a barrier, end the block, or report the threads stuck. A
// fiber ends a block parked in `fiber_main`'s loop, and the next block
// resumes it there.

// glibc's checked longjmp refuses to jump to another stack.
#undef _FORTIFY_SOURCE
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "wick_cuda.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// The linker's bounds of the `__shared__` section (see wick_cuda.h).
extern "C" char __start_wick_shared[] __attribute__((weak));
extern "C" char __stop_wick_shared[] __attribute__((weak));

namespace {

using wick_cuda::Site;
using wick_cuda::Warp;

bool same(Site a, Site b) {
    return a.line == b.line && (a.file == b.file || strcmp(a.file, b.file) == 0);
}

enum class State { Ready, Barrier, Warp, Exited };

struct Fiber {
    jmp_buf jb;
    bool started = false;
    State state = State::Ready;
    uint3 idx{};
    // Where it waits (the statement of a barrier or a warp function), and,
    // at a warp function, what it asked for.
    Site site{"", 0};
    unsigned mask = 0;
    Warp op = Warp::Sync;
    int arg = 0, width = 0;
    uint32_t in = 0, out = 0;
};

constexpr uint32_t POISON = 0xffffffffu;
constexpr size_t STACK = 256 << 10;

// splitmix64: a few lines, and any seed gives a good sequence.
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    size_t below(size_t n) { return (size_t)(((unsigned __int128)next() * n) >> 64); }
};

struct Launch {
    wick_cuda::Thunk thunk;
    void** args;
    unsigned threads;
    std::vector<Fiber> fibers;
    std::vector<ucontext_t> starts;  // each fiber's first entry
    // Per warp, the lanes waiting at a warp function.
    std::vector<uint32_t> at_warp;
    std::vector<unsigned> ready;
    Rng rng;
    jmp_buf sched;
    Fiber* current = nullptr;
    std::string error;
};

// The launch in progress. Launches take turns (`launching`): the
// `__shared__` arrays are statics, one copy for the process.
Launch* L = nullptr;
std::mutex launching;

std::string format(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// Runs a ready fiber, picked at random, or returns to `run_block` if
// none is. Never returns.
[[noreturn]] void run_next() {
    Launch& l = *L;
    if (l.ready.empty()) _longjmp(l.sched, 1);
    const size_t k = l.rng.below(l.ready.size());
    const unsigned t = l.ready[k];
    l.ready[k] = l.ready.back();
    l.ready.pop_back();
    Fiber& f = l.fibers[t];
    l.current = &f;
    threadIdx = f.idx;
    if (f.started) _longjmp(f.jb, 1);
    f.started = true;
    setcontext(&l.starts[t]);
    __builtin_unreachable();
}

// Lets other fibers run until this one is resumed.
void park(Fiber* f) {
    if (!_setjmp(f->jb)) run_next();
}

// Ends the launch with `msg`: nothing resumes the fiber.
[[noreturn]] void fail(const std::string& msg) {
    if (L->error.empty()) L->error = msg;
    if (!_setjmp(L->current->jb)) _longjmp(L->sched, 1);
    __builtin_unreachable();
}

unsigned tid_of(const Fiber* f) { return (unsigned)(f - L->fibers.data()); }

void fiber_main() {
    for (;;) {
        L->thunk(L->args);
        L->current->state = State::Exited;
        park(L->current);
    }
}

const char* op_name(Warp op) {
    switch (op) {
        case Warp::Idx: return "__shfl_sync";
        case Warp::Up: return "__shfl_up_sync";
        case Warp::Down: return "__shfl_down_sync";
        case Warp::Xor: return "__shfl_xor_sync";
        case Warp::Sync: return "__syncwarp";
        case Warp::Ballot: return "__ballot_sync";
    }
    return "a warp function";
}

// `file:line`, the file without its directories.
std::string at(Site s) {
    const char* name = strrchr(s.file, '/');
    return format("%s:%d", name ? name + 1 : s.file, s.line);
}

std::string mismatch(const Fiber& a, const Fiber& b) {
    return format("threads %u and %u of one warp meet at different warp functions: %s "
                  "(mask 0x%08x, ",
                  tid_of(&a), tid_of(&b), op_name(a.op), a.mask) +
           at(a.site) + format(") and %s (mask 0x%08x, ", op_name(b.op), b.mask) + at(b.site) +
           ")";
}

// Why a thread waiting at a warp function cannot go on, where a lane its
// mask names has ended, waits at a barrier, or waits elsewhere; "" if none.
std::string stuck_warp(const Launch& l) {
    for (const Fiber& f : l.fibers) {
        if (f.state != State::Warp) continue;
        const unsigned tid = tid_of(&f), base = tid - tid % 32;
        for (unsigned m = f.mask; m; m &= m - 1) {
            const Fiber& g = l.fibers[base + __builtin_ctz(m)];
            const char* where = g.state == State::Exited    ? "has ended"
                                : g.state == State::Barrier ? "waits at __syncthreads"
                                                            : nullptr;
            if (where != nullptr)
                return format("thread %u waits at %s (mask 0x%08x) for thread %u, which %s", tid,
                              op_name(f.op), f.mask, tid_of(&g), where);
            if (g.state == State::Warp && (g.mask != f.mask || !same(g.site, f.site)))
                return mismatch(f, g);
        }
    }
    return "";
}

// Where each thread is, as runs of consecutive threads in the same place.
std::string describe(const Launch& l) {
    auto where = [&](const Fiber& f) -> std::string {
        switch (f.state) {
            case State::Ready: return "ready";
            case State::Exited: return "ended";
            case State::Barrier: return "at __syncthreads (" + at(f.site) + ")";
            case State::Warp:
                return format("at %s (mask 0x%08x, ", op_name(f.op), f.mask) + at(f.site) + ")";
        }
        return "";
    };
    std::string out;
    for (unsigned t = 0; t < l.threads;) {
        const std::string w = where(l.fibers[t]);
        unsigned u = t + 1;
        while (u < l.threads && where(l.fibers[u]) == w) u++;
        if (!out.empty()) out += "; ";
        out += u - t == 1 ? format("thread %u ", t) : format("threads %u-%u ", t, u - 1);
        out += w;
        t = u;
    }
    return out;
}

// Runs the block in `blockIdx`; false (with `l.error`) if it failed.
bool run_block(Launch& l) {
    if (__start_wick_shared != nullptr)
        memset(__start_wick_shared, 0xff, (size_t)(__stop_wick_shared - __start_wick_shared));
    l.ready.clear();
    l.at_warp.assign((l.threads + 31) / 32, 0);
    for (unsigned t = 0; t < l.threads; t++) {
        l.fibers[t].state = State::Ready;
        l.ready.push_back(t);
    }
    for (;;) {
        if (!_setjmp(l.sched)) run_next();
        if (!l.error.empty()) return false;
        // Nobody can run: the block is done, or at a barrier, or stuck.
        unsigned ended = 0, waiting = 0;
        bool one_site = true;
        for (const Fiber& f : l.fibers) {
            if (f.state == State::Exited) ended++;
            if (f.state != State::Barrier) continue;
            one_site = one_site && (waiting == 0 || same(f.site, l.fibers[0].site));
            waiting++;
        }
        if (ended == l.threads) return true;
        if (waiting == l.threads && one_site) {
            for (unsigned t = 0; t < l.threads; t++) {
                l.fibers[t].state = State::Ready;
                l.ready.push_back(t);
            }
            continue;
        }
        const std::string why = stuck_warp(l);
        l.error = "no thread can go on: " + (why.empty() ? describe(l) : why + "; " + describe(l));
        return false;
    }
}

}  // namespace

void wick_cuda::barrier(Site site) {
    Fiber* f = L->current;
    f->state = State::Barrier;
    f->site = site;
    park(f);
}

uint32_t wick_cuda::warp_op(Site site, unsigned mask, uint32_t value, Warp op, int arg,
                            int width) {
    Launch& l = *L;
    Fiber* f = l.current;
    const unsigned tid = tid_of(f), lane = tid % 32, base = tid - lane;
    if (!(mask >> lane & 1))
        fail(format("thread %u calls %s with mask 0x%08x, which leaves out its own lane %u",
                    tid, op_name(op), mask, lane));
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(format("thread %u calls %s with width %d", tid, op_name(op), width));
    const unsigned lanes = l.threads - base < 32 ? l.threads - base : 32;
    if (lanes < 32 && (mask >> lanes) != 0)
        fail(format("thread %u calls %s with mask 0x%08x, but its warp has %u lanes", tid,
                    op_name(op), mask, lanes));
    f->state = State::Warp;
    f->site = site;
    f->mask = mask;
    f->op = op;
    f->arg = arg;
    f->width = width;
    f->in = value;
    uint32_t& waiting = l.at_warp[tid / 32];
    waiting |= 1u << lane;
    // The last of the lanes the mask names to arrive does the exchange for
    // all of them; the others wait (a lane that never comes leaves them
    // stuck, which `run_block` reports).
    if ((waiting & mask) == mask) {
        uint32_t ballot = 0;
        for (unsigned m = mask; m; m &= m - 1) {
            const Fiber& g = l.fibers[base + __builtin_ctz(m)];
            if (!same(g.site, site) || g.mask != mask || g.op != op || g.width != width)
                fail(mismatch(*f, g));
            if (g.in != 0) ballot |= 1u << __builtin_ctz(m);
        }
        waiting &= ~mask;
        for (unsigned m = mask; m; m &= m - 1) {
            const unsigned j = __builtin_ctz(m);
            Fiber& g = l.fibers[base + j];
            const unsigned first = j & ~(unsigned)(width - 1), end = first + width;
            unsigned src = j;
            switch (op) {
                case Warp::Idx: src = first + ((unsigned)arg & (width - 1)); break;
                case Warp::Up: src = j - first >= (unsigned)arg ? j - arg : j; break;
                case Warp::Down: src = j + arg < end ? j + arg : j; break;
                case Warp::Xor: src = (j ^ (unsigned)arg) & 31; src = src < end ? src : j; break;
                case Warp::Sync:
                case Warp::Ballot: break;
            }
            if (op == Warp::Sync) g.out = 0;
            else if (op == Warp::Ballot) g.out = ballot;
            else g.out = (mask >> src & 1) ? l.fibers[base + src].in : POISON;
            g.state = State::Ready;
            l.ready.push_back(base + j);
        }
    }
    park(f);
    return f->out;
}

extern "C" int wick_cuda_host_launch(const char* name, const uint32_t grid[3],
                                     const uint32_t block[3], uint64_t seed, void** args,
                                     char* err, size_t err_len) {
    auto refuse = [&](const std::string& msg) {
        snprintf(err, err_len, "%s", msg.c_str());
        return 1;
    };
    const wick_cuda::Thunk thunk = wick_cuda::find_kernel(name);
    if (thunk == nullptr) return refuse(format("the host build has no kernel %s", name));
    const uint64_t threads = (uint64_t)block[0] * block[1] * block[2];
    const uint64_t blocks = (uint64_t)grid[0] * grid[1] * grid[2];
    if (threads == 0 || threads > 1024)
        return refuse(format("%s: %llu threads a block (CUDA allows 1 to 1024)", name,
                             (unsigned long long)threads));
    if (blocks == 0 || grid[1] > 65535 || grid[2] > 65535)
        return refuse(format("%s: grid (%u, %u, %u) is not a valid CUDA grid", name, grid[0],
                             grid[1], grid[2]));

    std::lock_guard<std::mutex> lock(launching);
    Launch l;
    l.thunk = thunk;
    l.args = args;
    l.threads = (unsigned)threads;
    l.fibers.resize(threads);
    l.starts.resize(threads);
    // One mapping for every fiber's stack, each above a guard page.
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), per = STACK + page;
    char* stacks = (char*)mmap(nullptr, per * threads, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) return refuse(format("%s: no memory for fiber stacks", name));
    for (unsigned t = 0; t < threads; t++) {
        Fiber& f = l.fibers[t];
        f.idx = {t % block[0], t / block[0] % block[1], t / (block[0] * block[1])};
        mprotect(stacks + t * per, page, PROT_NONE);
        ucontext_t& uc = l.starts[t];
        getcontext(&uc);
        uc.uc_stack.ss_sp = stacks + t * per + page;
        uc.uc_stack.ss_size = STACK;
        uc.uc_link = nullptr;
        makecontext(&uc, fiber_main, 0);
    }
    L = &l;
    blockDim = {block[0], block[1], block[2]};
    gridDim = {grid[0], grid[1], grid[2]};
    std::vector<uint64_t> order(blocks);
    for (uint64_t b = 0; b < blocks; b++) order[b] = b;
    Rng shuffle{seed};
    for (uint64_t b = blocks; b > 1; b--) std::swap(order[b - 1], order[shuffle.below(b)]);
    int status = 0;
    for (uint64_t b : order) {
        blockIdx = {(unsigned)(b % grid[0]), (unsigned)(b / grid[0] % grid[1]),
                    (unsigned)(b / ((uint64_t)grid[0] * grid[1]))};
        l.rng = Rng{seed ^ (b + 1) * 0xd1342543de82ef95ull};
        if (!run_block(l)) {
            status = refuse(format("%s, block (%u, %u, %u) of (%u, %u, %u), seed %llu: ", name,
                                   blockIdx.x, blockIdx.y, blockIdx.z, grid[0], grid[1], grid[2],
                                   (unsigned long long)seed) +
                            l.error);
            break;
        }
    }
    L = nullptr;
    munmap(stacks, per * threads);
    return status;
}
