// Execution model of the Metal emulator: a dispatchThreads grid run on one CPU
// thread, threadgroups in order, the threads of a group as cooperative fibers so
// that threadgroup_barrier, simdgroup collectives and threadgroup memory behave as
// on an Apple GPU. Float32 arithmetic runs with subnormals flushed to zero (inputs
// and results, as Apple GPUs do); loads and stores keep their bits.
#pragma once

// Standard headers first: the shim defines `thread`, `device` and `constant`
// as (empty) address-space macros. _GNU_SOURCE names the x86-64 fault context's
// error register (REG_ERR: was the faulting access a write?).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

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
  unsigned barrier_line = 0;  // source line of the barrier it waits at
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
  bool checked = false;  // report divergent barriers
  // A memory fault or integer trap inside the kernel jumps back to launch().
  sigjmp_buf jump;
  volatile sig_atomic_t armed = 0;
  pthread_t owner;
  uint64_t fault[3] = {0, 0, 0};  // signal, address, access (1 write, 2 read, 0 unknown)
  struct sigaction saved[3];
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

// ---- threadgroup arrays --------------------------------------------------------
namespace mpemu {
// Storage of one `threadgroup T name[...]` declaration (made once per kernel
// instantiation): its own mapping, the data ending at a guard page (rounded up to
// 16 bytes), so running past the end faults. Recorded to name it in the report.
struct TgArray {
  const char* name;
  uintptr_t lo, hi;  // data start, end of the guard page
  size_t elem, count;  // element size, elements (all dimensions flattened)
};
constexpr int kMaxTgArrays = 256;
inline TgArray g_tg[kMaxTgArrays];
inline int g_tg_count = 0;

inline void* tg_alloc(size_t bytes, size_t elem, const char* name) {
  const size_t page = 4096, padded = (bytes + 15) & ~size_t(15);
  const size_t data = (padded + page - 1) & ~(page - 1);
  void* m = mmap(nullptr, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return std::calloc(1, padded);  // unguarded, still usable
  char* base = static_cast<char*>(m);
  mprotect(base + data, page, PROT_NONE);
  char* p = base + data - padded;
  if (g_tg_count < kMaxTgArrays)
    g_tg[g_tg_count++] = TgArray{name, uintptr_t(p), uintptr_t(base + data + page), elem, bytes / elem};
  return p;
}

// "threadgroup array 'buf' at element K (valid: 0..N-1)" (flat index) for an
// address in or just after one; 0 when the address belongs to none.
inline int tg_describe(uint64_t addr, char* out, int n) {
  for (int i = 0; i < g_tg_count; ++i) {
    const TgArray& t = g_tg[i];
    if (addr < t.lo || addr >= t.hi) continue;
    std::snprintf(out, n, "threadgroup array '%s' at element %llu (valid: 0..%llu)", t.name,
                  (unsigned long long)((addr - t.lo) / t.elem),
                  (unsigned long long)(t.count - 1));
    return 1;
  }
  return 0;
}
}  // namespace mpemu

// ---- barriers ---------------------------------------------------------------
namespace metal {
enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8, mem_object_data = 16 };
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return mem_flags(uint(a) | uint(b));
}

// The call's source line tells barriers apart (divergence check).
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none,
                                unsigned line = __builtin_LINE()) {
  mpemu::Runtime& r = mpemu::rt();
  if (r.fibers) r.fiber->barrier_line = line;
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
};

}  // namespace mpemu

namespace mpemu {
// The value type of a collective's argument: a swizzle (v.xy) travels as the
// vector it denotes.
template <class T>
struct val {
  using type = T;
};
template <class T, int N, int... I>
struct val<metal::swz<T, N, I...>> {
  using type = metal::vec<T, int(sizeof...(I))>;
};
template <class T>
using val_t = typename val<T>::type;

// A reduction over the lanes l with (l & ~keep) == (self & ~keep) that are
// active: keep = 31 is the whole simdgroup, keep = 3 the quad. A tree (strides
// 16, 8, 4, 2, 1): every lane gets the same result, combined in a fixed order so
// results are reproducible.
template <class T, class F>
T group_reduce(const Exchange<T>& e, uint keep, F f) {
  const uint base = e.self & ~keep;
  T acc[kSimdWidth];
  bool has[kSimdWidth];
  for (uint l = 0; l <= keep; ++l) {
    has[l] = e.active(base + l);
    if (has[l]) acc[l] = e.lane(base + l);
  }
  for (uint d = (keep + 1) / 2; d >= 1; d /= 2)
    for (uint l = 0; l < d; ++l) {
      if (!has[l + d]) continue;
      acc[l] = has[l] ? f(acc[l], acc[l + d]) : acc[l + d];
      has[l] = true;
    }
  return has[0] ? acc[0] : e.own;
}
template <class T, class F>
T group_prefix(const Exchange<T>& e, uint keep, F f, T identity, bool inclusive) {
  T acc = identity;
  for (uint l = e.self & ~keep; l < e.self; ++l)
    if (e.active(l)) acc = f(acc, e.lane(l));
  return inclusive ? f(acc, e.own) : acc;
}
}  // namespace mpemu

namespace metal {
// simd_* act on the 32 lanes of a simdgroup, quad_* on groups of 4 lanes.
#define MPEMU_REDUCE(NAME, KEEP, EXPR)                                         \
  template <class X, class T = mpemu::val_t<X>>                                \
  inline T NAME(X x) {                                                         \
    return mpemu::group_reduce(mpemu::Exchange<T>(T(x), #NAME), KEEP,          \
                               [](T a, T b) { return T(EXPR); });              \
  }
#define MPEMU_REDUCE_BOTH(NAME, EXPR) \
  MPEMU_REDUCE(simd_##NAME, 31u, EXPR) MPEMU_REDUCE(quad_##NAME, 3u, EXPR)
MPEMU_REDUCE_BOTH(sum, a + b)
MPEMU_REDUCE_BOTH(product, a * b)
MPEMU_REDUCE_BOTH(max, metal::max(a, b))
MPEMU_REDUCE_BOTH(min, metal::min(a, b))
MPEMU_REDUCE_BOTH(and, a & b)
MPEMU_REDUCE_BOTH(or, a | b)
MPEMU_REDUCE_BOTH(xor, a ^ b)
#undef MPEMU_REDUCE_BOTH
#undef MPEMU_REDUCE

#define MPEMU_PREFIX(NAME, KEEP, EXPR, ID, INCL)                               \
  template <class X, class T = mpemu::val_t<X>>                                \
  inline T NAME(X x) {                                                         \
    return mpemu::group_prefix(mpemu::Exchange<T>(T(x), #NAME), KEEP,          \
                               [](T a, T b) { return T(EXPR); }, T(ID), INCL); \
  }
#define MPEMU_PREFIX_BOTH(KIND, EXPR, ID, INCL)                                \
  MPEMU_PREFIX(simd_prefix_##KIND, 31u, EXPR, ID, INCL)                        \
  MPEMU_PREFIX(quad_prefix_##KIND, 3u, EXPR, ID, INCL)
MPEMU_PREFIX_BOTH(exclusive_sum, a + b, 0, false)
MPEMU_PREFIX_BOTH(inclusive_sum, a + b, 0, true)
MPEMU_PREFIX_BOTH(exclusive_product, a * b, 1, false)
MPEMU_PREFIX_BOTH(inclusive_product, a * b, 1, true)
#undef MPEMU_PREFIX_BOTH
#undef MPEMU_PREFIX

// Shuffles. `src(e, self)` names the source lane; a source that is outside
// the group or inactive leaves the lane its own value. WIDTH is 32 (simd_)
// or 4 (quad_); lane arguments index within the group.
#define MPEMU_SHUFFLE(NAME, WIDTH, SRC)                                        \
  template <class X, class T = mpemu::val_t<X>>                                \
  inline T NAME(X x, ushort arg) {                                             \
    mpemu::Exchange<T> e(T(x), #NAME);                                         \
    const uint w = WIDTH, base = e.self & ~(w - 1), i = e.self & (w - 1);      \
    (void)i;                                                                   \
    const long src = long(SRC);                                                \
    return (src < 0 || src >= long(w)) ? e.own : e.lane(base + uint(src));     \
  }
#define MPEMU_SHUFFLE_BOTH(NAME, SRC)                                          \
  MPEMU_SHUFFLE(simd_##NAME, 32u, SRC) MPEMU_SHUFFLE(quad_##NAME, 4u, SRC)
MPEMU_SHUFFLE_BOTH(shuffle, arg)
MPEMU_SHUFFLE_BOTH(broadcast, arg)
MPEMU_SHUFFLE_BOTH(shuffle_down, long(i) + arg)
MPEMU_SHUFFLE_BOTH(shuffle_up, long(i) - arg)
MPEMU_SHUFFLE_BOTH(shuffle_xor, i ^ arg)
MPEMU_SHUFFLE_BOTH(shuffle_rotate_down, (i + arg) % w)
MPEMU_SHUFFLE_BOTH(shuffle_rotate_up, (i + w - arg % w) % w)
#undef MPEMU_SHUFFLE_BOTH
#undef MPEMU_SHUFFLE

// Lane i of each `modulo`-lane segment takes data from lane i + delta (down)
// or i - delta (up) of its segment, and filling_data from the wrapped lane
// where that falls outside the segment.
#define MPEMU_FILL(NAME, WIDTH, DOWN)                                          \
  template <class X, class Y, class T = mpemu::val_t<X>>                       \
  inline T NAME(X data, Y fill, ushort delta, ushort modulo = WIDTH) {         \
    mpemu::Exchange<T> d(T(data), #NAME);                                      \
    mpemu::Exchange<T> f(T(fill), #NAME);                                      \
    const uint m = modulo ? modulo : WIDTH;                                    \
    const uint group = d.self & ~(WIDTH - 1u), i = d.self & (WIDTH - 1u);      \
    const uint seg = group + i / m * m, j = i % m;                             \
    if (DOWN)                                                                  \
      return j + delta < m ? d.lane(seg + j + delta) : f.lane(seg + j + delta - m); \
    return j >= delta ? d.lane(seg + j - delta) : f.lane(seg + j + m - delta); \
  }
MPEMU_FILL(simd_shuffle_and_fill_down, 32u, true)
MPEMU_FILL(simd_shuffle_and_fill_up, 32u, false)
MPEMU_FILL(quad_shuffle_and_fill_down, 4u, true)
MPEMU_FILL(quad_shuffle_and_fill_up, 4u, false)
#undef MPEMU_FILL

template <class X, class T = mpemu::val_t<X>>
inline T simd_broadcast_first(X x) {
  mpemu::Exchange<T> e(T(x), "simd_broadcast_first");
  return e.ok && e.mask ? e.lane(__builtin_ctz(e.mask)) : e.own;
}

// simd_ballot / simd_active_threads_mask: one bit per lane (bit l = lane l).
struct simd_vote {
  typedef uint64_t vote_t;
  explicit constexpr simd_vote(vote_t v = 0, vote_t active = ~vote_t(0)) : v_(v), active_(active) {}
  explicit constexpr operator vote_t() const { return v_; }
  constexpr bool all() const { return (v_ & active_) == active_; }
  constexpr bool any() const { return v_ != 0; }

 private:
  vote_t v_, active_;
};
inline simd_vote simd_ballot(bool x) {
  mpemu::Exchange<int> e(int(x), "simd_ballot");
  simd_vote::vote_t v = 0;
  for (uint l = 0; l < mpemu::kSimdWidth; ++l)
    if (e.active(l) && e.lane(l)) v |= simd_vote::vote_t(1) << l;
  return simd_vote(v, e.mask);
}
inline simd_vote simd_active_threads_mask() {
  mpemu::Exchange<int> e(1, "simd_active_threads_mask");
  return simd_vote(e.mask, e.mask);
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
inline bool quad_all(bool x) {
  mpemu::Exchange<int> e(int(x), "quad_all");
  for (uint l = e.self & ~3u; l < (e.self & ~3u) + 4; ++l)
    if (e.active(l) && !e.lane(l)) return false;
  return true;
}
inline bool quad_any(bool x) {
  mpemu::Exchange<int> e(int(x), "quad_any");
  for (uint l = e.self & ~3u; l < (e.self & ~3u) + 4; ++l)
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

// ---- simdgroup_matrix (8x8) ---------------------------------------------------
// Every lane holds the whole matrix; lane l owns the two elements that Apple's
// layout gives it (row fm, columns fn and fn + 1, as MLX's steel MMA fragments
// use them), which thread_elements() exposes. The collective functions first
// gather each lane's owned pair, so writes through thread_elements() take effect
// as on the GPU.
template <class T, int Cols, int Rows>
struct alignas(16) simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "the emulator has 8x8 simdgroup matrices only");
  T e[8][8];  // [row][column]

  simdgroup_matrix() = default;
  // MSL: a diagonal matrix with `dval` on the diagonal.
  explicit simdgroup_matrix(T dval) {
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) e[r][c] = r == c ? dval : T(0);
  }
  static void owned(uint lane, int& row, int& col) {
    const uint q = lane / 4;
    row = int((q & 4) + (lane / 2) % 4);
    col = int((q & 2) * 2 + (lane % 2) * 2);
  }
  vec<T, 2>& thread_elements() {
    int r, c;
    owned(mpemu::attrs().thread_index_in_simdgroup, r, c);
    return *reinterpret_cast<vec<T, 2>*>(&e[r][c]);
  }
  const vec<T, 2>& thread_elements() const {
    return const_cast<simdgroup_matrix*>(this)->thread_elements();
  }
  // Collective: every lane ends up with every lane's owned elements.
  simdgroup_matrix gathered(const char* what) const {
    mpemu::Exchange<vec<T, 2>> x(thread_elements(), what);
    simdgroup_matrix m = *this;
    for (uint l = 0; l < mpemu::kSimdWidth; ++l) {
      if (!x.active(l)) continue;
      int r, c;
      owned(l, r, c);
      vec<T, 2> p = x.lane(l);
      m.e[r][c] = p.x;
      m.e[r][c + 1] = p.y;
    }
    return m;
  }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat16_t, 8, 8> simdgroup_bfloat8x8;

template <class T, int C, int R>
inline simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, C, R> m;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) m.e[r][c] = value;
  return m;
}

// Element (r, c) is src[(origin.y + r) * elements_per_row + origin.x + c]
// (origin = (column, row)); transposed, the block at origin is read as its
// transpose.
template <class T, int C, int R, class U>
inline void simdgroup_load(simdgroup_matrix<T, C, R>& d, const U* src,
                           ulong elements_per_row = C, ulong2 origin = ulong2(0),
                           bool transpose = false) {
  static_assert(std::is_same<std::remove_cv_t<U>, T>::value, "simdgroup_load: element types differ");
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) {
      const ulong row = origin.y + ulong(transpose ? c : r), col = origin.x + ulong(transpose ? r : c);
      d.e[r][c] = src[row * elements_per_row + col];
    }
}
template <class T, int C, int R, class U>
inline void simdgroup_store(const simdgroup_matrix<T, C, R>& a, U* dst,
                            ulong elements_per_row = C, ulong2 origin = ulong2(0),
                            bool transpose = false) {
  static_assert(std::is_same<U, T>::value, "simdgroup_store: element types differ");
  const simdgroup_matrix<T, C, R> m = a.gathered("simdgroup_store");
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) {
      const ulong row = origin.y + ulong(transpose ? c : r), col = origin.x + ulong(transpose ? r : c);
      dst[row * elements_per_row + col] = m.e[r][c];
    }
}
// d = a * b + c, each element a float32 fma chain over k = 0..7 started from c
// and rounded once to d's type. (Apple does not document the hardware's order
// or intermediate precision.)
template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d,
                                          const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b,
                                          const simdgroup_matrix<TC, 8, 8>& c) {
  const auto A = a.gathered("simdgroup_multiply_accumulate");
  const auto B = b.gathered("simdgroup_multiply_accumulate");
  const auto C = c.gathered("simdgroup_multiply_accumulate");
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 8; ++col) {
      float acc = float(C.e[r][col]);
      for (int k = 0; k < 8; ++k) acc = __builtin_fmaf(float(A.e[r][k]), float(B.e[k][col]), acc);
      d.e[r][col] = TD(acc);
    }
}
template <class TD, class TA, class TB>
inline void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d,
                               const simdgroup_matrix<TA, 8, 8>& a,
                               const simdgroup_matrix<TB, 8, 8>& b) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<TD, 8, 8>(TD(0)));
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
  // Each stack sits above an inaccessible page, so a thread whose locals
  // overflow its stack faults (and is reported) instead of overwriting the
  // next fiber's stack.
  const size_t page = 4096, slot = stack + page;
  if (r.stack_count < n || r.stack_size != stack) {
    if (r.stacks) munmap(r.stacks, (r.stack_size + page) * r.stack_count);
    void* m = mmap(nullptr, slot * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r.stacks = m == MAP_FAILED ? nullptr : static_cast<char*>(m);
    if (!r.stacks) {
      r.stack_count = 0;
      fail("cannot map fiber stacks");
      return;
    }
    for (uint i = 0; i < n; ++i) mprotect(r.stacks + slot * i, page, PROT_NONE);
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
    ctx_init(f.ctx, r.stacks + slot * i + page, stack - (i % 64) * 64, fiber_entry);
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
    int waiting = -1;  // a fiber at a barrier
    for (uint i = 0; i < n && waiting < 0; ++i)
      if (r.pool[i].state == State::Barrier) waiting = int(i);
    if (waiting < 0) return;  // all done
    if (r.checked) {
      // Metal requires every thread of the group to reach the same barrier.
      const Fiber& w = r.pool[waiting];
      for (uint i = 0; i < n; ++i) {
        const Fiber& f = r.pool[i];
        if (f.state == State::Barrier && f.barrier_line == w.barrier_line) continue;
        char msg[300];
        const uint3 a = w.attrs.thread_position_in_threadgroup, b = f.attrs.thread_position_in_threadgroup;
        std::snprintf(msg, sizeof msg,
                      "divergent threadgroup_barrier in threadgroup (%u,%u,%u): thread (%u,%u,%u) "
                      "waits at the barrier on @line %u while thread (%u,%u,%u) %s",
                      w.attrs.threadgroup_position_in_grid.x, w.attrs.threadgroup_position_in_grid.y,
                      w.attrs.threadgroup_position_in_grid.z, a.x, a.y, a.z, w.barrier_line,
                      b.x, b.y, b.z, f.state == State::Done ? "has returned without reaching it"
                                                             : "waits at another barrier");
        if (f.state == State::Barrier)
          std::snprintf(msg + std::strlen(msg), sizeof msg - std::strlen(msg), " (@line %u)", f.barrier_line);
        fail(msg);
        return;
      }
    }
    // A barrier completes once every thread still running has reached it
    // (threads that returned early do not hold it up).
    for (uint i = 0; i < n; ++i)
      if (r.pool[i].state == State::Barrier) r.pool[i].state = State::Runnable;
  }
}

// A fault inside the kernel (a stray access hits a guard page around a
// buffer, an integer division traps) returns to launch() instead of killing
// the process; a fault on another thread goes to the handler saved before.
constexpr int kSignals[3] = {SIGSEGV, SIGBUS, SIGFPE};

// Reads past a buffer outside checked mode. A GPU returns whatever memory holds
// there, and kernels rely on it (they read past the end, then select the value
// away), so such a read must not stop the launch. The launcher registers each
// buffer's whole mapping (kernel.py); a read that faults in one of its guard pages
// makes that page readable and filled with all-ones bytes (NaN for floats, -1 for
// integers: a kernel that multiplies the value by zero instead of selecting it
// shows NaN), and the access repeats. The page stays read-only: a write still
// faults. Per buffer the first such read (address and thread) is recorded for the
// launcher's warning. Writes, and reads of anything else, fault as before.
struct PoisonRange { uint64_t lo, hi; };
constexpr int kMaxPoison = 64;
inline PoisonRange g_poison[kMaxPoison];
inline int g_poison_count = 0;
inline uint64_t* g_poison_hits = nullptr;  // per range: count, address, thread x, y, z

inline bool poison_read(uintptr_t addr) {
  for (int i = 0; i < g_poison_count; ++i) {
    if (addr < g_poison[i].lo || addr >= g_poison[i].hi) continue;
    const uintptr_t page = addr & ~uintptr_t(4095);
    if (mprotect(reinterpret_cast<void*>(page), 4096, PROT_READ | PROT_WRITE) != 0) return false;
    std::memset(reinterpret_cast<void*>(page), 0xFF, 4096);
    mprotect(reinterpret_cast<void*>(page), 4096, PROT_READ);
    uint64_t* h = g_poison_hits + 5 * i;
    if (h[0]++ == 0) {
      const Attrs* a = rt().attrs;
      h[1] = addr;
      if (a) {
        h[2] = a->thread_position_in_grid.x;
        h[3] = a->thread_position_in_grid.y;
        h[4] = a->thread_position_in_grid.z;
      }
    }
    return true;
  }
  return false;
}

inline void on_fault(int sig, siginfo_t* info, void* uctx) {
  Runtime& r = rt();
  if (!r.armed || !pthread_equal(pthread_self(), r.owner)) {
    for (int i = 0; i < 3; ++i)
      if (kSignals[i] == sig) sigaction(sig, &r.saved[i], nullptr);
    return;  // the access repeats and meets the previous handler
  }
  r.fault[0] = uint64_t(sig);
  r.fault[1] = uint64_t(reinterpret_cast<uintptr_t>(info->si_addr));
  r.fault[2] = 0;
#if defined(__x86_64__) && defined(REG_ERR)
  r.fault[2] = (static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 2;
#endif
  if (sig == SIGSEGV && r.fault[2] == 2 && poison_read(uintptr_t(r.fault[1])))
    return;  // the read repeats and now finds the poison
  r.armed = 0;
  siglongjmp(r.jump, 1);
}

// dims: grid xyz, threadgroup xyz (already clamped to the grid, as MLX does).
// Returns 0, 1 (error message in err) or 2 (fault: fault_out = signal,
// address, access (0 unknown, 1 write, 2 read), thread position in grid xyz,
// threadgroup xyz).
inline int launch(ThreadFn fn, void** buffers, const uint32_t* dims, int use_fibers,
                  int checked, char* err, int errlen, uint64_t* fault_out) {
  // Concurrent launches of one library take turns (pthread: no C++ runtime).
  static pthread_mutex_t serial = PTHREAD_MUTEX_INITIALIZER;
  struct Hold {
    Hold() { pthread_mutex_lock(&serial); }
    ~Hold() { pthread_mutex_unlock(&serial); }
  } hold;
  Runtime& r = rt();
  r.error[0] = 0;
  r.fibers = use_fibers != 0;
  r.checked = checked != 0;
  dispatch() = Dispatch{fn, buffers};
  const uint3 grid(dims[0], dims[1], dims[2]), tg(dims[3], dims[4], dims[5]);
  const uint3 groups(ceil_div(grid.x, tg.x), ceil_div(grid.y, tg.y), ceil_div(grid.z, tg.z));
  FloatEnv fenv;
  static Attrs single;
  if (r.fibers && r.pool_size < tg.x * tg.y * tg.z) {
    std::free(r.pool);
    r.pool_size = tg.x * tg.y * tg.z;
    r.pool = static_cast<Fiber*>(std::malloc(sizeof(Fiber) * r.pool_size));
    for (size_t i = 0; i < r.pool_size; ++i) new (&r.pool[i]) Fiber();
  }
  // The handler runs on its own stack: a fiber's stack may be the thing that
  // overflowed.
  static char* altstack = static_cast<char*>(std::malloc(1 << 16));
  stack_t ss{}, old_ss{};
  ss.ss_sp = altstack;
  ss.ss_size = 1 << 16;
  sigaltstack(&ss, &old_ss);
  struct sigaction sa{};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &r.saved[i]);
  r.owner = pthread_self();
  int status = 0;
  if (sigsetjmp(r.jump, 1)) {
    const Attrs& a = r.attrs ? *r.attrs : single;
    const uint64_t info[8] = {r.fault[0], r.fault[1], r.fault[2],
                              a.thread_position_in_grid.x, a.thread_position_in_grid.y,
                              a.thread_position_in_grid.z, a.threadgroup_position_in_grid.x,
                              a.threadgroup_position_in_grid.y};
    std::memcpy(fault_out, info, sizeof info);
    status = 2;
  } else {
    r.armed = 1;
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
    r.armed = 0;
  }
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &r.saved[i], nullptr);
  sigaltstack(&old_ss, nullptr);
  r.attrs = nullptr;
  r.fiber = nullptr;
  if (status == 0 && r.error[0]) {
    std::snprintf(err, errlen, "%s", r.error);
    status = 1;
  }
  return status;
}

}  // namespace mpemu
