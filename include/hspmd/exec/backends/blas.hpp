#pragma once
// Which BLAS runs the host GEMMs, with which kernel set, and how fast: known at start-up, and
// never a generic fallback on a CPU with wider vectors.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: at load it picks one kernel set ("core") from
// the CPU's vendor, family and model. A virtual machine that reports its CPU generically gets
// the 128-bit SSE3 kernels (Prescott) even where the CPU has AVX-512 — a GEMM 4-5x slower. The
// first GEMM (or blas::status()) therefore compares the kernel set that runs with the widest
// vectors the CPU and the OS support (cpuid, XCR0 through __builtin_cpu_supports) and, where
// OpenBLAS chose narrower ones by itself (or, on AMD Zen 4, AVX-512 sets that run slower there
// than its AVX2 ones: preferred_core), selects the matching set through OpenBLAS's own
// re-initialisation entry points (gotoblas_dynamic_quit / gotoblas_dynamic_init, which read
// OPENBLAS_CORETYPE). Nothing is linked against them: they are looked up at run time, so any
// CBLAS links, and one without them is reported as it is.
//
//   HSPMD_BLAS_CORE=auto (default)  the widest kernels the CPU has, when OpenBLAS chose narrower
//   HSPMD_BLAS_CORE=keep            whatever OpenBLAS chose
//   HSPMD_BLAS_CORE=<name>          that kernel set (Haswell, SkylakeX, ...), e.g. to compare
//   OPENBLAS_CORETYPE=<name>        OpenBLAS's own choice by hand: kept, with a warning and the
//                                   fix when it is narrower than the CPU's vectors
//
// blas::describe() is the start-up line: the library, its kernel set and why, its threads and
// a measured single-precision GEMM rate (the peak MFU is reported against).

#include <hspmd/core/error.hpp>

#include <cblas.h>
#if defined(__linux__)
#include <dlfcn.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

extern "C" void openblas_set_num_threads(int num_threads); // OpenBLAS extension

namespace hspmd::exec::blas {

/// The vector features that decide which GEMM kernels a CPU can run (and its OS enables).
struct cpu_features {
  bool amd = false;
  bool avx = false;
  bool avx2_fma = false;    // AVX2 and FMA3
  bool avx512 = false;      // F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
  bool avx512_bf16 = false; // and BF16: Cooper Lake and newer, AMD Zen 4 and newer
  bool amd_zen4 = false;    // AMD family 19h with AVX-512 (Zen 4), see preferred_core
};

/// This CPU's features.
[[nodiscard]] inline cpu_features detect_cpu() {
  cpu_features f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.amd = __builtin_cpu_is("amd");
  f.avx = __builtin_cpu_supports("avx");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#if defined(__clang__) || __GNUC__ >= 12
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  f.amd_zen4 = f.amd && f.avx512 && __builtin_cpu_is("amdfam19h");
#endif
  return f;
}

namespace detail {
/// ASCII lower case: kernel-set names compare case-insensitively, as OpenBLAS reads them.
[[nodiscard]] inline std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& ch : r)
    ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  return r;
}
} // namespace detail

/// How wide the vectors of a kernel set are: 0 SSE (or unknown), 1 AVX, 2 AVX2 + FMA, 3 AVX-512.
[[nodiscard]] inline int tier(std::string_view core) {
  const std::string c = detail::lower(core);
  if (c == "skylakex" || c == "cooperlake" || c == "sapphirerapids")
    return 3;
  if (c == "haswell" || c == "zen")
    return 2;
  if (c == "sandybridge" || c == "bulldozer" || c == "piledriver" || c == "steamroller" ||
      c == "excavator")
    return 1;
  return 0;
}

/// The widest-vector OpenBLAS kernel set for these features ("" when SSE is all it has).
[[nodiscard]] inline std::string widest_core(const cpu_features& f) {
  if (f.avx512)
    return f.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (f.avx2_fma)
    return f.amd ? "Zen" : "Haswell";
  if (f.avx)
    return "Sandybridge";
  return {};
}

/// The kernel set hspmd runs on this CPU: the widest, except on AMD Zen 4, whose AVX-512 units
/// are 256 bits wide inside: there OpenBLAS 0.3.21's AVX2 Haswell kernels beat its AVX-512 ones
/// (the Cooperlake set it chooses by itself) by 5-10 % on every GEMM shape of BERT-small, and a
/// BERT-small step by 5 % (docs/benchmarks.md, measured alternating).
[[nodiscard]] inline std::string preferred_core(const cpu_features& f) {
  return f.amd_zen4 ? "Haswell" : widest_core(f);
}

[[nodiscard]] inline const char* vectors_text(int t) {
  switch (t) {
  case 3:
    return "AVX-512";
  case 2:
    return "AVX2";
  case 1:
    return "AVX";
  default:
    return "SSE";
  }
}

/// What to do about the kernel set that runs.
struct decision {
  std::string target;  // the kernel set to switch to; empty: keep the one that runs
  std::string warning; // for the user (a slower set kept because they asked for it), with the fix
  std::string reason;  // why the kernel set that will run runs
};

/// The rule, apart from the machine: `current` the kernel set OpenBLAS runs, `f` the CPU,
/// `coretype_env` OPENBLAS_CORETYPE (nullptr when unset), `hspmd_env` HSPMD_BLAS_CORE,
/// `can_switch` whether the library has the re-initialisation entry points.
[[nodiscard]] inline decision decide(std::string_view current, const cpu_features& f,
                                     const char* coretype_env, const char* hspmd_env,
                                     bool can_switch) {
  decision d;
  const std::string best = preferred_core(f);
  const int have = tier(current);
  const int could = best.empty() ? 0 : tier(best);
  const std::string mode = hspmd_env == nullptr || *hspmd_env == '\0' ? "auto" : hspmd_env;
  const std::string cur(current);
  if (mode != "auto" && mode != "keep") { // a kernel set by name
    d.target = mode;
    d.reason = "HSPMD_BLAS_CORE=" + mode;
    if (!can_switch) {
      d.target.clear();
      d.warning = "HSPMD_BLAS_CORE=" + mode +
                  " cannot be applied: this BLAS has no run-time kernel selection (OpenBLAS "
                  "built with DYNAMIC_ARCH has); unset it";
      d.reason = "the library's own";
    } else if (tier(mode) < could)
      d.warning = "HSPMD_BLAS_CORE=" + mode + " runs " + vectors_text(tier(mode)) +
                  " kernels where " + best + "'s " + vectors_text(could) +
                  " kernels run: unset HSPMD_BLAS_CORE (hspmd then runs " + best + ")";
    return d;
  }
  if (coretype_env != nullptr && *coretype_env != '\0') {
    d.reason = std::string("OPENBLAS_CORETYPE=") + coretype_env;
    if (have < could)
      d.warning = std::string("OPENBLAS_CORETYPE=") + coretype_env + " runs " + cur + "'s " +
                  vectors_text(have) + " kernels where " + best + "'s " + vectors_text(could) +
                  " kernels run, a GEMM several times slower: unset OPENBLAS_CORETYPE (hspmd "
                  "then runs " +
                  best + ") or set it to " + best;
    return d;
  }
  if (mode == "keep") {
    d.reason = "OpenBLAS's choice, kept by HSPMD_BLAS_CORE=keep";
    if (have < could)
      d.warning = "HSPMD_BLAS_CORE=keep keeps " + cur + "'s " + vectors_text(have) +
                  " kernels where " + best + "'s " + vectors_text(could) +
                  " kernels run, a GEMM several times slower: unset HSPMD_BLAS_CORE";
    return d;
  }
  if (have < could && can_switch) {
    d.target = best;
    d.reason = "hspmd's choice: OpenBLAS took " + (cur.empty() ? std::string("?") : cur) + " (" +
               vectors_text(have) + ") on a CPU with " + vectors_text(could);
    return d;
  }
  if (f.amd_zen4 && have == 3 && can_switch) { // see preferred_core
    d.target = best;
    d.reason = "hspmd's choice: OpenBLAS took " + cur + "; on AMD Zen 4 its " + best +
               " kernels are faster";
    return d;
  }
  d.reason = "OpenBLAS's choice";
  if (have < could && !cur.empty())
    d.warning = cur + "'s " + std::string(vectors_text(have)) + " kernels run on a CPU with " +
                vectors_text(could) +
                " and this BLAS cannot change them at run time: set OPENBLAS_CORETYPE=" + best +
                " before the program starts";
  return d;
}

/// What runs the host GEMMs.
struct info {
  std::string library;      // "OpenBLAS 0.3.21" (or "CBLAS" when it does not say)
  std::string core;         // the kernel set that runs ("" when the library does not say)
  std::string reason;       // why that kernel set
  std::string warning;      // non-empty: something slower than the CPU allows, and the fix
  std::string cpu;          // the CPU's widest vectors, e.g. "AVX-512 + BF16"
  int threads = 1;          // BLAS threads per process
  double sgemm_flops = 0.0; // measured FLOP/s of a 512^3 single-precision GEMM (0: not yet)
};

namespace detail {

template <class F>
[[nodiscard]] F symbol(const char* name) {
#if defined(__linux__)
  return reinterpret_cast<F>(::dlsym(RTLD_DEFAULT, name));
#else
  (void)name;
  return nullptr;
#endif
}

[[nodiscard]] inline std::string library_text(std::string_view config) {
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." -> "OpenBLAS 0.3.21"
  std::size_t cut = config.find(' ');
  if (cut != std::string_view::npos)
    cut = config.find(' ', cut + 1);
  return std::string(config.substr(0, cut));
}

[[nodiscard]] inline bool table_exists(const std::string& core) {
  std::string upper = "gotoblas_";
  for (char ch : core)
    upper += static_cast<char>(ch >= 'a' && ch <= 'z' ? ch - 'a' + 'A' : ch);
  return symbol<void*>(upper.c_str()) != nullptr;
}

struct state {
  std::mutex m;
  bool ready = false;
  info i;
};
[[nodiscard]] inline state& global() {
  static state s;
  return s;
}

inline void set_threads(info& i) {
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr)
    openblas_set_num_threads(1); // one rank per core: BLAS threads would compete with ranks
  if (auto get = symbol<int (*)()>("openblas_get_num_threads"))
    i.threads = get();
}

// Switches OpenBLAS to `core` (a set it was built with); true when it now runs it.
[[nodiscard]] inline bool switch_core(const std::string& core) {
  auto quit = symbol<void (*)()>("gotoblas_dynamic_quit");
  auto init = symbol<void (*)()>("gotoblas_dynamic_init");
  auto name = symbol<char* (*)()>("openblas_get_corename");
  if (quit == nullptr || init == nullptr || name == nullptr || !table_exists(core))
    return false;
  const char* old = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1); // what gotoblas_dynamic_init reads
  quit();
  init();
  if (old != nullptr)
    ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    ::unsetenv("OPENBLAS_CORETYPE");
  return lower(name()) == lower(core);
}

inline void initialise(info& i) {
  const cpu_features f = detect_cpu();
  const std::string best = widest_core(f);
  i.cpu = vectors_text(best.empty() ? 0 : tier(best));
  if (f.avx512_bf16)
    i.cpu += " + BF16";
  if (f.amd_zen4)
    i.cpu += ", AMD Zen 4";
  auto config = symbol<char* (*)()>("openblas_get_config");
  auto name = symbol<char* (*)()>("openblas_get_corename");
  i.library = config != nullptr ? library_text(config()) : "CBLAS";
  const bool can_switch = symbol<void (*)()>("gotoblas_dynamic_init") != nullptr &&
                          symbol<void (*)()>("gotoblas_dynamic_quit") != nullptr && name != nullptr;
  i.core = name != nullptr ? name() : "";
  const decision d = decide(i.core, f, std::getenv("OPENBLAS_CORETYPE"),
                            std::getenv("HSPMD_BLAS_CORE"), can_switch);
  i.reason = d.reason;
  i.warning = d.warning;
  if (!d.target.empty() && lower(d.target) != lower(i.core)) {
    const std::string before = i.core;
    if (!table_exists(d.target))
      i.warning = "this OpenBLAS has no kernel set " + d.target + " (kept " + before +
                  "): give HSPMD_BLAS_CORE one of Haswell, Zen, SkylakeX, Cooperlake, ...";
    else if (switch_core(d.target))
      i.core = name();
    else
      i.warning = "could not select OpenBLAS kernels " + d.target + " (kept " + before +
                  "): set OPENBLAS_CORETYPE=" + d.target + " before the program starts";
  }
  set_threads(i);
}

} // namespace detail

/// Makes sure the BLAS runs its widest kernels and one thread per process (once; cheap after).
inline const info& ensure() {
  auto& s = detail::global();
  std::lock_guard lock(s.m);
  if (!s.ready) {
    detail::initialise(s.i);
    s.ready = true;
  }
  return s.i;
}

/// FLOP/s of a single-precision GEMM of n^3 through this BLAS (best of `repeats`, after a warm-up).
[[nodiscard]] inline double measure_sgemm(int n = 512, int repeats = 3) {
  (void)ensure();
  std::vector<float> a(static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
  std::vector<float> b(a.size());
  std::vector<float> c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = 1.0F / static_cast<float>(i % 7 + 1);
    b[i] = 1.0F / static_cast<float>(i % 5 + 1);
  }
  const auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0F, a.data(), n, b.data(), n,
                0.0F, c.data(), n);
  };
  run();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n) * n * n / std::max(best, 1e-9);
}

/// ensure(), with the GEMM rate measured once (a few milliseconds).
inline const info& status() {
  (void)ensure();
  auto& s = detail::global();
  {
    std::lock_guard lock(s.m);
    if (s.i.sgemm_flops > 0.0)
      return s.i;
  }
  const double rate = measure_sgemm();
  std::lock_guard lock(s.m);
  s.i.sgemm_flops = rate;
  return s.i;
}

/// "BLAS: OpenBLAS 0.3.21, kernels Cooperlake (OpenBLAS's choice; CPU AVX-512 + BF16), 1 thread,
/// sgemm 512^3 at 98.2 GFLOP/s" (with the rate when it was measured).
[[nodiscard]] inline std::string describe(const info& i) {
  std::string s = "BLAS: " + i.library + ", kernels " + (i.core.empty() ? "?" : i.core) + " (" +
                  i.reason + "; CPU " + i.cpu + "), " + std::to_string(i.threads) + " thread" +
                  (i.threads == 1 ? "" : "s");
  if (i.sgemm_flops > 0.0) {
    char rate[64];
    std::snprintf(rate, sizeof rate, ", sgemm 512^3 at %.1f GFLOP/s", i.sgemm_flops / 1e9);
    s += rate;
  }
  return s;
}

} // namespace hspmd::exec::blas
