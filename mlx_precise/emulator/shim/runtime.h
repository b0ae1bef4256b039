// Execution model of the Metal emulator: a dispatchThreads grid run on one CPU
// thread, threadgroups in order, the threads of a group as cooperative fibers so
// that threadgroup_barrier, simdgroup collectives and threadgroup memory behave as
// on an Apple GPU. Float32 arithmetic runs with subnormals flushed to zero (inputs
// and results, as Apple GPUs do); loads and stores keep their bits.
#pragma once

// Standard headers first: the shim defines `thread`, `device` and `constant`
// as (empty) address-space macros.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <pthread.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "metal_types.h"

namespace mpemu {

// ---- fiber context switch ---------------------------------------------------
// A fiber switch saves the callee-saved registers on the old stack and restores
// them from the new one (System V x86-64 / AAPCS64). ucontext's swapcontext
// would do the same plus two signal-mask system calls per switch; elsewhere it
// is the fallback. The FP control register is not switched: every fiber runs in
// the launcher's flush-to-zero environment.
#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#define MPEMU_ASM_SWITCH 1
extern "C" void mpemu_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
__asm__(
    ".text\n.globl mpemu_switch\n.hidden mpemu_switch\n.type mpemu_switch,@function\n"
    "mpemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n.size mpemu_switch, .-mpemu_switch\n");
constexpr int kSavedWords = 6;  // then the return address
#else
__asm__(
    ".text\n.globl mpemu_switch\n.hidden mpemu_switch\n.type mpemu_switch,%function\n"
    "mpemu_switch:\n"
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n  str x9, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n  ret\n.size mpemu_switch, .-mpemu_switch\n");
#endif

struct Context {
  void* sp = nullptr;
};

inline void ctx_init(Context& c, char* stack, size_t size, void (*entry)()) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
#if defined(__x86_64__)
  // After `ret` pops `entry`, rsp must be 8 mod 16, as right after a call.
  *--sp = nullptr;  // fake return address of entry (it never returns)
  *--sp = reinterpret_cast<void*>(entry);
  for (int i = 0; i < kSavedWords; ++i) *--sp = nullptr;
#else
  sp -= 176 / sizeof(void*);
  std::memset(sp, 0, 176);
  sp[11] = reinterpret_cast<void*>(entry);  // x30 (lr) slot at offset 88
#endif
  c.sp = sp;
}

inline void ctx_switch(Context& from, Context& to) { mpemu_switch(&from.sp, to.sp); }

#else
}  // namespace mpemu
#include <ucontext.h>
namespace mpemu {
struct Context {
  ucontext_t uc;
};
inline void ctx_init(Context& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
inline void ctx_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

}  // namespace mpemu

namespace mpemu {

constexpr uint kSimdWidth = 32;

// The attribute values of one GPU thread ([[thread_position_in_grid]] etc.).
struct Attrs {
  uint3 thread_position_in_grid, thread_position_in_threadgroup,
      threadgroup_position_in_grid, threads_per_threadgroup,
      dispatch_threads_per_threadgroup, threadgroups_per_grid, threads_per_grid,
      grid_size, grid_origin;
  uint thread_index_in_threadgroup, thread_index_in_simdgroup,
      simdgroup_index_in_threadgroup, simdgroups_per_threadgroup,
      dispatch_simdgroups_per_threadgroup, threads_per_simdgroup,
      thread_execution_width, thread_index_in_quadgroup,
      quadgroup_index_in_threadgroup, quadgroups_per_threadgroup,
      dispatch_quadgroups_per_threadgroup;
};

enum class State { Runnable, Barrier, Simd, Done };

struct Fiber {
  Context ctx;
  Attrs attrs;
  State state = State::Runnable;
  unsigned simd_seq = 0;  // collectives done so far (parity selects a slot)
};

// Values exchanged by one simdgroup's collective; double-buffered by the
// collective's sequence parity so a fast lane cannot overwrite values a slow
// lane has yet to read.
struct SimdSlot {
  alignas(16) unsigned char value[2][kSimdWidth][32];
  uint32_t active[2];
};

struct Runtime {
  bool fibers = false;  // false: threads run to completion one after another
  Attrs* attrs = nullptr;  // the running thread's attributes
  Fiber* fiber = nullptr;  // the running fiber (fiber mode)
  Context scheduler;
  // Plain allocations (no std::vector / std::mutex): kernel libraries link no C++
  // runtime, which keeps the first build with zig's clang fast (no libc++ build).
  Fiber* pool = nullptr;
  size_t pool_size = 0;
  SimdSlot* slots = nullptr;
  size_t slot_count = 0;
  char* stacks = nullptr;
  size_t stack_size = 0, stack_count = 0;
  char error[512] = {0};
};

// One runtime per kernel library; launch() holds its mutex, so a plain global
// (no thread_local, whose access costs a call in a shared library) is safe.
inline Runtime g_runtime;
inline Runtime& rt() { return g_runtime; }

inline void fail(const char* msg) {
  Runtime& r = rt();
  if (!r.error[0]) std::snprintf(r.error, sizeof(r.error), "%s", msg);
}

inline const Attrs& attrs() { return *rt().attrs; }

// Suspend the running fiber in `s` and return to the scheduler.
inline bool suspend(State s, const char* what) {
  Runtime& r = rt();
  if (!r.fibers) {
    // The launcher runs fibers only when the source mentions barriers or simd
    // functions; reaching one otherwise means it was hidden from that scan.
    char msg[160];
    std::snprintf(msg, sizeof msg, "%s reached outside fiber mode", what);
    fail(msg);
    return false;
  }
  r.fiber->state = s;
  ctx_switch(r.fiber->ctx, r.scheduler);
  return true;
}

}  // namespace mpemu

// ---- barriers ---------------------------------------------------------------
namespace metal {
enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8, mem_object_data = 16 };
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return mem_flags(uint(a) | uint(b));
}

inline void threadgroup_barrier(mem_flags = mem_flags::mem_none) {
  mpemu::suspend(mpemu::State::Barrier, "threadgroup_barrier");
}
}  // namespace metal

namespace mpemu {

// One simdgroup collective: publish `v`, wait for the active lanes of the
// simdgroup, then read any lane's value with lane(i). `mask` holds the lanes
// that took part (Metal's collectives see only active threads).
template <typename T>
struct Exchange {
  const SimdSlot* slot = nullptr;
  int parity = 0;
  uint32_t mask = 0;
  uint self = 0;
  T own;
  bool ok = false;

  explicit Exchange(const T& v, const char* what) : own(v) {
    static_assert(sizeof(T) <= 32, "simd collective on a type wider than 32 bytes");
    Runtime& r = rt();
    self = r.attrs->thread_index_in_simdgroup;
    if (!r.fibers) {
      suspend(State::Simd, what);
      return;
    }
    SimdSlot& s = r.slots[r.attrs->simdgroup_index_in_threadgroup];
    parity = r.fiber->simd_seq++ & 1;
    std::memcpy(s.value[parity][self], &v, sizeof(T));
    if (!suspend(State::Simd, what)) return;
    slot = &s;
    mask = s.active[parity];
    ok = true;
  }
  bool active(uint l) const { return l < kSimdWidth && ((mask >> l) & 1u); }
  T lane(uint l) const {
    if (!ok || !active(l)) return own;
    T out;
    std::memcpy(&out, slot->value[parity][l], sizeof(T));
    return out;
  }
  // A tree over the active lanes (strides 16, 8, 4, 2, 1): every lane gets the
  // same result, combined in a fixed order so results are reproducible.
  template <typename F>
  T reduce(F f) const {
    T acc[kSimdWidth];
    bool has[kSimdWidth];
    for (uint l = 0; l < kSimdWidth; ++l) {
      has[l] = active(l);
      if (has[l]) acc[l] = lane(l);
    }
    for (uint d = kSimdWidth / 2; d >= 1; d /= 2)
      for (uint l = 0; l < d; ++l) {
        if (!has[l + d]) continue;
        acc[l] = has[l] ? f(acc[l], acc[l + d]) : acc[l + d];
        has[l] = true;
      }
    return has[0] ? acc[0] : own;
  }
  template <typename F>
  T prefix(F f, T identity, bool inclusive) const {
    T acc = identity;
    for (uint l = 0; l < self; ++l)
      if (active(l)) acc = f(acc, lane(l));
    return inclusive ? f(acc, own) : acc;
  }
};

}  // namespace mpemu

namespace metal {
#define MPEMU_SIMD_REDUCE(NAME, EXPR)                                   \
  template <typename T>                                                 \
  inline T NAME(T x) {                                                  \
    return mpemu::Exchange<T>(x, #NAME).reduce([](T a, T b) { return EXPR; }); \
  }
MPEMU_SIMD_REDUCE(simd_sum, a + b)
MPEMU_SIMD_REDUCE(simd_product, a * b)
MPEMU_SIMD_REDUCE(simd_max, metal::max(a, b))
MPEMU_SIMD_REDUCE(simd_min, metal::min(a, b))
MPEMU_SIMD_REDUCE(simd_and, a & b)
MPEMU_SIMD_REDUCE(simd_or, a | b)
MPEMU_SIMD_REDUCE(simd_xor, a ^ b)
#undef MPEMU_SIMD_REDUCE

template <typename T>
inline T simd_prefix_exclusive_sum(T x) {
  return mpemu::Exchange<T>(x, "simd_prefix_exclusive_sum").prefix([](T a, T b) { return a + b; }, T(0), false);
}
template <typename T>
inline T simd_prefix_inclusive_sum(T x) {
  return mpemu::Exchange<T>(x, "simd_prefix_inclusive_sum").prefix([](T a, T b) { return a + b; }, T(0), true);
}
template <typename T>
inline T simd_prefix_exclusive_product(T x) {
  return mpemu::Exchange<T>(x, "simd_prefix_exclusive_product").prefix([](T a, T b) { return a * b; }, T(1), false);
}
template <typename T>
inline T simd_prefix_inclusive_product(T x) {
  return mpemu::Exchange<T>(x, "simd_prefix_inclusive_product").prefix([](T a, T b) { return a * b; }, T(1), true);
}
template <typename T>
inline T simd_shuffle(T x, ushort lane) {
  return mpemu::Exchange<T>(x, "simd_shuffle").lane(lane);
}
template <typename T>
inline T simd_broadcast(T x, ushort lane) {
  return mpemu::Exchange<T>(x, "simd_broadcast").lane(lane);
}
// Lanes whose source falls outside the simdgroup keep their own value.
template <typename T>
inline T simd_shuffle_down(T x, ushort delta) {
  mpemu::Exchange<T> e(x, "simd_shuffle_down");
  return e.lane(e.self + delta);
}
template <typename T>
inline T simd_shuffle_up(T x, ushort delta) {
  mpemu::Exchange<T> e(x, "simd_shuffle_up");
  return delta > e.self ? x : e.lane(e.self - delta);
}
template <typename T>
inline T simd_shuffle_xor(T x, ushort mask) {
  mpemu::Exchange<T> e(x, "simd_shuffle_xor");
  return e.lane(e.self ^ mask);
}
template <typename T>
inline T simd_shuffle_rotate_down(T x, ushort delta) {
  mpemu::Exchange<T> e(x, "simd_shuffle_rotate_down");
  return e.lane((e.self + delta) % mpemu::kSimdWidth);
}
template <typename T>
inline T simd_shuffle_rotate_up(T x, ushort delta) {
  mpemu::Exchange<T> e(x, "simd_shuffle_rotate_up");
  return e.lane((e.self + mpemu::kSimdWidth - delta % mpemu::kSimdWidth) % mpemu::kSimdWidth);
}
template <typename T>
inline T simd_broadcast_first(T x) {
  mpemu::Exchange<T> e(x, "simd_broadcast_first");
  return e.ok && e.mask ? e.lane(__builtin_ctz(e.mask)) : x;
}
inline bool simd_all(bool x) {
  mpemu::Exchange<int> e(int(x), "simd_all");
  for (uint l = 0; l < mpemu::kSimdWidth; ++l)
    if (e.active(l) && !e.lane(l)) return false;
  return true;
}
inline bool simd_any(bool x) {
  mpemu::Exchange<int> e(int(x), "simd_any");
  for (uint l = 0; l < mpemu::kSimdWidth; ++l)
    if (e.active(l) && e.lane(l)) return true;
  return false;
}
inline bool simd_is_first() {
  mpemu::Exchange<int> e(1, "simd_is_first");
  return e.ok && e.mask && uint(__builtin_ctz(e.mask)) == e.self;
}
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none) {
  mpemu::Exchange<int> e(0, "simdgroup_barrier");
}
}  // namespace metal

// ---- the launcher -----------------------------------------------------------
namespace mpemu {

using ThreadFn = void (*)(void** buffers);

struct FloatEnv {
#if defined(__x86_64__)
  unsigned saved = _mm_getcsr();
  // FTZ (bit 15) flushes subnormal results, DAZ (bit 6) subnormal inputs.
  FloatEnv() { _mm_setcsr(saved | 0x8040u); }
  ~FloatEnv() { _mm_setcsr(saved); }
#elif defined(__aarch64__)
  uint64_t saved;
  // FPCR.FZ (bit 24) flushes subnormal inputs and results of float32/64.
  FloatEnv() {
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved));
    __asm__ volatile("msr fpcr, %0" ::"r"(saved | (1ull << 24)));
  }
  ~FloatEnv() { __asm__ volatile("msr fpcr, %0" ::"r"(saved)); }
#else
#error "the Metal emulator supports x86-64 and arm64 hosts"
#endif
};

struct Dispatch {
  ThreadFn fn;
  void** buffers;
};
inline Dispatch g_dispatch;
inline Dispatch& dispatch() { return g_dispatch; }

inline void fiber_entry() {
  Runtime& r = rt();
  dispatch().fn(dispatch().buffers);
  r.fiber->state = State::Done;
  ctx_switch(r.fiber->ctx, r.scheduler);
}

inline uint ceil_div(uint a, uint b) { return (a + b - 1) / b; }

// Fill the attributes of thread `local` (linear index) of group `g`.
inline void fill(Attrs& a, const uint3& grid, const uint3& tg, const uint3& g,
                 const uint3& actual, uint local) {
  uint3 p(local % actual.x, (local / actual.x) % actual.y, local / (actual.x * actual.y));
  a.thread_position_in_threadgroup = p;
  a.threadgroup_position_in_grid = g;
  a.thread_position_in_grid = uint3(g.x * tg.x + p.x, g.y * tg.y + p.y, g.z * tg.z + p.z);
  a.threads_per_threadgroup = actual;
  a.dispatch_threads_per_threadgroup = tg;
  a.threadgroups_per_grid = uint3(ceil_div(grid.x, tg.x), ceil_div(grid.y, tg.y), ceil_div(grid.z, tg.z));
  a.threads_per_grid = grid;
  a.grid_size = grid;
  a.grid_origin = uint3(0, 0, 0);
  uint n = actual.x * actual.y * actual.z, nd = tg.x * tg.y * tg.z;
  a.thread_index_in_threadgroup = local;
  a.thread_index_in_simdgroup = local % kSimdWidth;
  a.simdgroup_index_in_threadgroup = local / kSimdWidth;
  a.simdgroups_per_threadgroup = ceil_div(n, kSimdWidth);
  a.dispatch_simdgroups_per_threadgroup = ceil_div(nd, kSimdWidth);
  a.threads_per_simdgroup = kSimdWidth;
  a.thread_execution_width = kSimdWidth;
  a.thread_index_in_quadgroup = local % 4;
  a.quadgroup_index_in_threadgroup = local / 4;
  a.quadgroups_per_threadgroup = ceil_div(n, 4);
  a.dispatch_quadgroups_per_threadgroup = ceil_div(nd, 4);
}

// Run one threadgroup as fibers until every thread is done.
inline void run_group_fibers(Runtime& r, uint n) {
  const size_t stack = 256 * 1024;
  if (r.stack_count < n || r.stack_size != stack) {
    std::free(r.stacks);
    r.stacks = static_cast<char*>(std::malloc(stack * n));
    r.stack_size = stack;
    r.stack_count = n;
  }
  const size_t nslots = ceil_div(n, kSimdWidth);
  if (r.slot_count < nslots) {
    std::free(r.slots);
    r.slots = static_cast<SimdSlot*>(std::malloc(sizeof(SimdSlot) * nslots));
    r.slot_count = nslots;
  }
  std::memset(r.slots, 0, sizeof(SimdSlot) * nslots);
  for (uint i = 0; i < n; ++i) {
    Fiber& f = r.pool[i];
    f.state = State::Runnable;
    f.simd_seq = 0;
    // Stagger the stack tops so the fibers' hot frames do not all map to the
    // same cache sets.
    ctx_init(f.ctx, r.stacks + stack * i, stack - (i % 64) * 64, fiber_entry);
  }
  while (true) {
    for (uint i = 0; i < n; ++i) {
      Fiber& f = r.pool[i];
      if (f.state != State::Runnable) continue;
      r.fiber = &f;
      r.attrs = &f.attrs;
      ctx_switch(r.scheduler, f.ctx);
    }
    if (r.error[0]) return;
    // Every fiber is now done or waiting. Simdgroup collectives complete first:
    // their participants are the lanes waiting in one.
    bool released = false;
    for (uint s = 0; s < nslots; ++s) {
      uint32_t mask = 0;
      int parity = -1;
      for (uint l = 0; l < kSimdWidth && s * kSimdWidth + l < n; ++l) {
        Fiber& f = r.pool[s * kSimdWidth + l];
        if (f.state == State::Simd) {
          int p = (f.simd_seq - 1) & 1;
          if (parity >= 0 && p != parity) {
            fail("simdgroup lanes are waiting in different collectives (divergent simd functions)");
            return;
          }
          parity = p;
          mask |= 1u << l;
        }
      }
      if (mask) {
        r.slots[s].active[parity] = mask;
        for (uint l = 0; l < kSimdWidth; ++l)
          if ((mask >> l) & 1u) r.pool[s * kSimdWidth + l].state = State::Runnable;
        released = true;
      }
    }
    if (released) continue;
    bool any_barrier = false;
    for (uint i = 0; i < n; ++i) any_barrier |= r.pool[i].state == State::Barrier;
    if (!any_barrier) return;  // all done
    // A barrier completes once every thread still running has reached it
    // (threads that returned early do not hold it up).
    for (uint i = 0; i < n; ++i)
      if (r.pool[i].state == State::Barrier) r.pool[i].state = State::Runnable;
  }
}

// dims: grid xyz, threadgroup xyz (already clamped to the grid, as MLX does).
inline int launch(ThreadFn fn, void** buffers, const uint32_t* dims, int use_fibers,
                  char* err, int errlen) {
  // Concurrent launches of one library take turns (pthread: no C++ runtime).
  static pthread_mutex_t serial = PTHREAD_MUTEX_INITIALIZER;
  struct Hold {
    Hold() { pthread_mutex_lock(&serial); }
    ~Hold() { pthread_mutex_unlock(&serial); }
  } hold;
  Runtime& r = rt();
  r.error[0] = 0;
  r.fibers = use_fibers != 0;
  dispatch() = Dispatch{fn, buffers};
  const uint3 grid(dims[0], dims[1], dims[2]), tg(dims[3], dims[4], dims[5]);
  const uint3 groups(ceil_div(grid.x, tg.x), ceil_div(grid.y, tg.y), ceil_div(grid.z, tg.z));
  FloatEnv fenv;
  Attrs single;
  if (r.fibers && r.pool_size < tg.x * tg.y * tg.z) {
    std::free(r.pool);
    r.pool_size = tg.x * tg.y * tg.z;
    r.pool = static_cast<Fiber*>(std::malloc(sizeof(Fiber) * r.pool_size));
    for (size_t i = 0; i < r.pool_size; ++i) new (&r.pool[i]) Fiber();
  }
  for (uint gz = 0; gz < groups.z && !r.error[0]; ++gz)
    for (uint gy = 0; gy < groups.y && !r.error[0]; ++gy)
      for (uint gx = 0; gx < groups.x && !r.error[0]; ++gx) {
        const uint3 g(gx, gy, gz);
        // dispatchThreads: edge groups are cut to the grid (non-uniform groups).
        const uint3 actual(metal::min(tg.x, grid.x - gx * tg.x),
                           metal::min(tg.y, grid.y - gy * tg.y),
                           metal::min(tg.z, grid.z - gz * tg.z));
        const uint n = actual.x * actual.y * actual.z;
        if (r.fibers) {
          for (uint i = 0; i < n; ++i) fill(r.pool[i].attrs, grid, tg, g, actual, i);
          run_group_fibers(r, n);
        } else {
          r.attrs = &single;
          for (uint i = 0; i < n && !r.error[0]; ++i) {
            fill(single, grid, tg, g, actual, i);
            fn(buffers);
          }
        }
      }
  r.attrs = nullptr;
  r.fiber = nullptr;
  if (r.error[0]) {
    std::snprintf(err, errlen, "%s", r.error);
    return 1;
  }
  return 0;
}

}  // namespace mpemu
