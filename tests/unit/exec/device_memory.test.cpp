// The hardware-free parts of the CUDA backend, run on the host: the stream-ordered caching
// allocator over a counting host memory, and the row-major to column-major GEMM mapping that the
// cuBLAS calls use, against a row-major reference.
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/caching_allocator.hpp>
#include <hspmd/exec/column_major_gemm.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/mlp.hpp>
#include <hspmd/train/engine.hpp>

#include "../../support/host_compute.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace hspmd;

namespace {

// Host memory with a capacity, counting what it hands out; "streams" are ints.
struct counting_memory {
  using stream = int;
  counting_memory() = default;
  explicit counting_memory(std::size_t cap) : capacity(cap) {}
  std::size_t capacity = std::size_t{1} << 30;
  std::size_t in_use = 0;
  std::size_t allocations = 0;
  std::size_t frees = 0;
  std::size_t synchronizations = 0;
  std::map<void*, std::size_t>* blocks = nullptr; // shared with the test to check sizes

  void* allocate(std::size_t bytes, int /*stream*/) {
    if (in_use + bytes > capacity)
      return nullptr;
    void* p = std::malloc(bytes);
    in_use += bytes;
    ++allocations;
    if (blocks != nullptr)
      (*blocks)[p] = bytes;
    return p;
  }
  void deallocate(void* p, std::size_t bytes) {
    if (blocks != nullptr) {
      REQUIRE(blocks->count(p) == 1);
      CHECK(blocks->at(p) == bytes); // returned with the size it was allocated with
      blocks->erase(p);
    }
    in_use -= bytes;
    ++frees;
    std::free(p);
  }
  void synchronize() { ++synchronizations; }
  [[nodiscard]] int device() const { return 3; }
};
static_assert(exec::raw_memory<counting_memory>);

using pool_type = exec::caching_allocator<counting_memory>;

} // namespace

TEST_CASE("caching_allocator rounds sizes into 512-byte and 2 MiB classes") {
  CHECK(pool_type::rounded(0) == 0);
  CHECK(pool_type::rounded(1) == 512);
  CHECK(pool_type::rounded(512) == 512);
  CHECK(pool_type::rounded(513) == 1024);
  CHECK(pool_type::rounded(std::size_t{1} << 20) == std::size_t{1} << 20);
  CHECK(pool_type::rounded((std::size_t{1} << 20) + 1) == std::size_t{2} << 20);
  CHECK(pool_type::rounded((std::size_t{5} << 20) + 7) == std::size_t{6} << 20);
  // Rounding that would overflow gives no size, and such a request a clear error.
  CHECK(pool_type::rounded(std::numeric_limits<std::size_t>::max()) == 0);
  pool_type pool{counting_memory{}};
  CHECK_THROWS_WITH(pool.allocate(std::numeric_limits<std::size_t>::max() - 5, 0),
                    Catch::Contains("larger than memory"));
  CHECK_THROWS_WITH((exec::pooled_buffer<double, pool_type>(
                        pool, std::numeric_limits<std::size_t>::max() / 4, 0)),
                    Catch::Contains("overflow a byte count"));
  CHECK(pool.raw().allocations == 0);
}

TEST_CASE("caching_allocator reuses a freed block on the same stream without the device") {
  std::map<void*, std::size_t> blocks;
  counting_memory raw;
  raw.blocks = &blocks;
  pool_type pool{raw};
  void* a = pool.allocate(1000, 0);
  REQUIRE(a != nullptr);
  CHECK(pool.raw().allocations == 1);
  CHECK(pool.stats().allocated_bytes == 1024);
  CHECK(pool.stats().reserved_bytes == 1024);
  pool.deallocate(a);
  CHECK(pool.stats().allocated_bytes == 0);
  CHECK(pool.stats().reserved_bytes == 1024);
  CHECK(pool.cached_bytes() == 1024);

  void* b = pool.allocate(900, 0); // same class
  CHECK(b == a);
  CHECK(pool.raw().allocations == 1);
  CHECK(pool.stats().cache_hits == 1);

  // Another stream never gets it: it would need an event to be safe.
  void* c = pool.allocate(900, 1);
  CHECK(c != a);
  CHECK(pool.raw().allocations == 2);

  // A much smaller request does not take a large cached block (no more than 1.5x).
  pool.deallocate(b);
  void* d = pool.allocate(256, 0);
  CHECK(d != a);
  CHECK(pool.raw().allocations == 3);
  // ... but one up to 1.5x smaller does, counted at the block's own size.
  void* e = pool.allocate(700, 0); // rounds to 1024: the cached 1024 block
  CHECK(e == a);
  CHECK(pool.stats().allocated_bytes == 1024 + 1024 + 512);

  pool.deallocate(c);
  pool.deallocate(d);
  pool.deallocate(e);
  pool.deallocate(nullptr); // ignored
  CHECK(pool.stats().allocated_bytes == 0);
  CHECK(pool.stats().peak_allocated_bytes == 1024 + 1024 + 512);
  CHECK(pool.stats().peak_reserved_bytes == 1024 + 1024 + 512);

  pool.release_cached();
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.raw().in_use == 0);
  CHECK(pool.raw().frees == 3);
  CHECK(pool.raw().synchronizations == 1); // blocks go back only once the device is idle
  CHECK(blocks.empty());
}

TEST_CASE("caching_allocator releases its cache and retries when the device is full") {
  counting_memory raw;
  raw.capacity = std::size_t{7} << 20;
  pool_type pool{raw};
  void* big = pool.allocate(std::size_t{6} << 20, 0);
  REQUIRE(big != nullptr);
  pool.deallocate(big); // cached, still held from the device
  CHECK(pool.raw().in_use == std::size_t{6} << 20);
  // 2 MiB does not fit beside the cached 6 MiB, and the 6 MiB block is more than 1.5x too big
  // to serve it: the cache goes back to the device and the request is retried.
  void* p = pool.allocate(std::size_t{2} << 20, 0);
  REQUIRE(p != nullptr);
  CHECK(pool.stats().cache_releases == 1);
  CHECK(pool.raw().synchronizations == 1);
  CHECK(pool.stats().reserved_bytes == std::size_t{2} << 20);
  CHECK(pool.raw().in_use == std::size_t{2} << 20);

  // More than the device has left: a device_error naming the device, the request and what is
  // held.
  try {
    (void)pool.allocate(std::size_t{5} << 20, 0);
    FAIL("expected a device_error");
  } catch (const device_error& e) {
    CHECK(e.device() == 3);
    const std::string what = e.what();
    CHECK(what.find("device 3: allocate") == 0);
    CHECK(what.find("out of memory for 6.0 MiB") != std::string::npos);
    CHECK(what.find("2.0 MiB in use by hspmd, 2.0 MiB reserved") != std::string::npos);
    CHECK(what.find("batch") != std::string::npos);
  }
  pool.deallocate(p);
  CHECK(pool.allocate(0, 0) == nullptr);
}

TEST_CASE("caching_allocator books stay exact under a random training-like workload") {
  std::map<void*, std::size_t> blocks;
  counting_memory raw;
  raw.blocks = &blocks;
  raw.capacity = std::size_t{128} << 20; // 24 blocks of at most 4 MiB fit
  std::mt19937 rng(7);
  {
    pool_type pool{raw};
    // Each "step" allocates the same sizes on two streams and frees them in another order,
    // like an executor's activations and a communication stream's buckets.
    std::vector<std::size_t> sizes;
    std::uniform_int_distribution<std::size_t> size_of(1, std::size_t{3} << 20);
    for (int i = 0; i < 24; ++i)
      sizes.push_back(size_of(rng));
    std::size_t device_calls_after_first_step = 0;
    for (int step = 0; step < 6; ++step) {
      std::vector<std::pair<void*, std::size_t>> live;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        void* p = pool.allocate(sizes[i], static_cast<int>(i % 2));
        live.emplace_back(p, sizes[i]);
      }
      std::set<void*> distinct;
      for (const auto& [p, n] : live)
        distinct.insert(p);
      CHECK(distinct.size() == live.size()); // no block handed out twice
      std::shuffle(live.begin(), live.end(), rng);
      for (const auto& [p, n] : live)
        pool.deallocate(p);
      const auto s = pool.stats();
      CHECK(s.allocated_bytes == 0);
      CHECK(s.reserved_bytes == pool.raw().in_use);
      CHECK(s.reserved_bytes <= raw.capacity);
      if (step == 0)
        device_calls_after_first_step = s.device_allocations;
      else // the same sizes every step: served from the cache
        CHECK(s.device_allocations == device_calls_after_first_step);
    }
    CHECK(pool.stats().cache_hits == 5 * sizes.size());
  } // the destructor returns the cache
  CHECK(blocks.empty());
}

TEST_CASE("pooled_buffer returns its block when destroyed or moved over") {
  pool_type pool{counting_memory{}};
  {
    exec::pooled_buffer<float, pool_type> a(pool, 100, 0);
    CHECK(a.size() == 100);
    CHECK(a.data() != nullptr);
    CHECK(pool.stats().allocated_bytes == 512);
    exec::pooled_buffer<float, pool_type> b(pool, 1000, 0);
    CHECK(pool.stats().allocated_bytes == 512 + 4096);
    b = std::move(a); // b's old block goes back, a's moves in
    CHECK(pool.stats().allocated_bytes == 512);
    CHECK(a.empty()); // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    CHECK(b.size() == 100);
    exec::pooled_buffer<float, pool_type> c(std::move(b));
    CHECK(c.size() == 100);
    exec::pooled_buffer<float, pool_type> none;
    CHECK(none.data() == nullptr);
  }
  CHECK(pool.stats().allocated_bytes == 0);
  CHECK(pool.cached_bytes() == 512 + 4096);
}

namespace {

// cuBLAS's contract: column-major, C(i, j) at c[i + j * ldc], op applied to the stored matrix.
template <class T>
void column_major_reference(const exec::column_major_gemm<T>& g, T alpha, T beta, T* c,
                            std::size_t ldc) {
  auto at = [](const T* p, std::size_t ld, exec::transpose t, std::size_t i, std::size_t j) {
    return t == exec::transpose::no ? p[i + j * ld] : p[j + i * ld];
  };
  for (std::size_t j = 0; j < g.n; ++j)
    for (std::size_t i = 0; i < g.m; ++i) {
      T sum{};
      for (std::size_t l = 0; l < g.k; ++l)
        sum += at(g.first, g.ld_first, g.op_first, i, l) *
               at(g.second, g.ld_second, g.op_second, l, j);
      c[i + j * ldc] = alpha * sum + beta * c[i + j * ldc];
    }
}

// The row-major contract of exec::gemm.
template <class T>
void row_major_reference(exec::transpose ta, exec::transpose tb, std::size_t m, std::size_t n,
                         std::size_t k, T alpha, const T* a, std::size_t lda, const T* b,
                         std::size_t ldb, T beta, T* c, std::size_t ldc) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      T sum{};
      for (std::size_t l = 0; l < k; ++l)
        sum += (ta == exec::transpose::no ? a[i * lda + l] : a[l * lda + i]) *
               (tb == exec::transpose::no ? b[l * ldb + j] : b[j * ldb + l]);
      c[i * ldc + j] = alpha * sum + beta * c[i * ldc + j];
    }
}

} // namespace

TEST_CASE("as_column_major computes the row-major GEMM for every transpose and padded strides") {
  using exec::transpose;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  for (const transpose ta : {transpose::no, transpose::yes})
    for (const transpose tb : {transpose::no, transpose::yes})
      for (const auto [m, n, k] :
           {std::array<std::size_t, 3>{2, 3, 4}, {5, 1, 3}, {1, 7, 2}, {4, 4, 1}, {3, 5, 0}}) {
        // Leading dimensions wider than the rows, as sub-blocks of larger matrices are.
        const std::size_t lda = (ta == transpose::no ? k : m) + 2;
        const std::size_t ldb = (tb == transpose::no ? n : k) + 1;
        const std::size_t ldc = n + 3;
        const std::size_t batch = 3;
        const std::size_t rows_a = ta == transpose::no ? m : k;
        const std::size_t rows_b = tb == transpose::no ? k : n;
        const std::size_t stride_a = rows_a * lda + 1;
        const std::size_t stride_b = rows_b * ldb + 2;
        const std::size_t stride_c = m * ldc;
        std::vector<double> a(batch * stride_a), b(batch * stride_b), c(batch * stride_c);
        for (auto* v : {&a, &b, &c})
          for (double& x : *v)
            x = u(rng);
        std::vector<double> want = c;
        std::vector<double> got = c;
        for (std::size_t i = 0; i < batch; ++i) {
          row_major_reference(ta, tb, m, n, k, 0.5, a.data() + i * stride_a, lda,
                              b.data() + i * stride_b, ldb, -1.5, want.data() + i * stride_c, ldc);
          const auto g = exec::as_column_major(ta, tb, m, n, k, a.data(), lda, stride_a, b.data(),
                                               ldb, stride_b);
          CHECK(g.m == n);
          CHECK(g.n == m);
          exec::column_major_gemm<double> gi = g;
          gi.first += i * g.stride_first;
          gi.second += i * g.stride_second;
          column_major_reference(gi, 0.5, -1.5, got.data() + i * stride_c, ldc);
        }
        for (std::size_t i = 0; i < got.size(); ++i)
          REQUIRE(got[i] == Approx(want[i]).margin(1e-12));
      }
}

namespace {

// Host memory from a caching allocator of limited capacity: a device that runs out.
class limited_backend : public test::host_compute<limited_backend> {
public:
  using pool = exec::caching_allocator<counting_memory>;
  template <class T>
  using buffer = exec::pooled_buffer<T, pool>;
  static constexpr bool host_memory = false; // the device paths: staging, chunked reductions

  limited_backend() : limited_backend(std::size_t{1} << 30) {}
  explicit limited_backend(std::size_t capacity)
      : pool_(std::make_unique<pool>(counting_memory{capacity})) {}
  [[nodiscard]] std::string_view name() const { return "limited host memory"; }
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t n) {
    buffer<T> b(*pool_, n, 0);
    std::fill_n(b.data(), n, T{});
    return b;
  }
  [[nodiscard]] test::no_guard guard() const { return {}; }
  [[nodiscard]] exec::memory_stats memory() const { return pool_->stats(); }

private:
  std::unique_ptr<pool> pool_; // stable for the buffers while the backend moves
};
static_assert(exec::backend<limited_backend>);

// BERT-tiny (dropout on), batch 4 of 16 tokens, vocabulary 50.
graph::graph bert_tiny() {
  models::bert_config cfg;
  cfg.layers = 2;
  cfg.hidden = 32;
  cfg.heads = 2;
  cfg.ffn = 64;
  cfg.seq = 16;
  cfg.vocab = 50;
  return models::trace_bert_lm<float>(cfg, 4);
}

} // namespace

TEST_CASE("a device out of memory is reported with the graph node being allocated") {
  models::mlp_config cfg;
  cfg.inputs = 256;
  cfg.hidden = {1024};
  cfg.classes = 10;
  const graph::graph g = models::trace_mlp<float>(cfg, 64);
  // Enough for the first nodes, not for fc0's 256 x 1024 weight's gradient as well.
  try {
    exec::executor<float, limited_backend> ex(g, 1, {}, limited_backend{std::size_t{1} << 20});
    FAIL("expected a device_error");
  } catch (const device_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("device 3: allocate: out of memory for") == 0);
    CHECK(what.find("for the value of graph node \"fc0.weight\" (256, 1024)") != std::string::npos);
    CHECK(what.find("(lower the batch") != std::string::npos);
  }
  // With room, the same graph trains on it.
  exec::executor<float, limited_backend> ex(g, 1);
  std::vector<float> x(64 * 256, 0.5F);
  std::vector<std::int64_t> y(64, 3);
  ex.set_input("x", std::span<const float>(x));
  ex.set_input("labels", std::span<const std::int64_t>(y));
  CHECK(std::isfinite(ex.forward()));
  ex.backward();
  CHECK(ex.reuse_gradient_buffers() > 0);
}

TEST_CASE("buffers shared before the executor first runs are never allocated on their own") {
  // BERT-tiny on the counting device: construction allocates the parameters (values and
  // gradients) and the token ids only; the intermediate gradients shared by
  // reuse_gradient_buffers are never allocated one by one, so the step's peak stays below what
  // every value and gradient with a buffer of its own would take.
  const graph::graph g = bert_tiny();
  std::size_t fixed = 0; // what construction allocates: parameters (value and gradient), ids
  std::size_t later = 0; // every other value and gradient, each in a buffer of its own
  std::size_t grads = 0; // every gradient, the parameters' included
  // (the counting device hands out blocks of rounded sizes)
  const auto block = [](std::size_t bytes) { return limited_backend::pool::rounded(bytes); };
  for (const graph::node& n : g.nodes()) {
    const std::size_t floats = block(n.out.size() * sizeof(float));
    if (n.type == dtype::i64) {
      fixed += block(n.out.size() * sizeof(std::int64_t));
      continue;
    }
    grads += floats;
    if (n.kind == graph::op::parameter) {
      fixed += 2 * floats;
    } else if (n.kind == graph::op::input) {
      later += 2 * floats; // value and gradient
    } else {
      const bool view = n.kind == graph::op::reshape && g[n.inputs[0]].type == n.type;
      later += (view ? 1 : 2) * floats; // a reshape reads its input's buffer
    }
  }
  exec::executor<float, limited_backend> ex(g, 3);
  CHECK(ex.backend().memory().allocated_bytes == fixed);
  CHECK_THROWS_WITH(std::as_const(ex).grad(*g.loss()), Catch::Contains("is not allocated before"));
  const std::size_t gradient_bytes = ex.reuse_gradient_buffers(); // parameters' included
  std::vector<std::int64_t> ids(4 * 16, 7);
  ex.set_input("tokens", std::span<const std::int64_t>(ids));
  ex.set_input("targets", std::span<const std::int64_t>(ids));
  CHECK(std::isfinite(ex.forward()));
  ex.backward();
  const exec::memory_stats m = ex.backend().memory();
  const std::size_t all_own = fixed + later; // what construction used to allocate
  INFO("construction " << fixed << ", every buffer its own " << all_own << ", gradients " << grads
                       << " (shared: " << gradient_bytes << "), peak " << m.peak_allocated_bytes);
  REQUIRE(gradient_bytes < grads);
  CHECK(m.peak_allocated_bytes < all_own);
  CHECK(all_own - m.peak_allocated_bytes >= (grads - gradient_bytes) / 2);
  CHECK(std::isfinite(std::as_const(ex).grad(*g.loss())[0]));
}

TEST_CASE("training holds its device memory flat after the second step (cache hits only)") {
  // BERT-tiny with dropout, two micro-batches per step, clipping and Adam, through the trainer's
  // engine on a device backend whose buffers come from the caching allocator.
  const graph::graph g = bert_tiny();
  train::backend_engine<float, exec::adam, limited_backend> e(g, 3);
  exec::adam opt(1e-3);
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<std::int64_t> token(0, 49);
  std::vector<exec::memory_stats> after;
  for (std::size_t step = 0; step < 6; ++step) {
    for (std::size_t m = 0; m < 2; ++m) {
      std::vector<std::int64_t> ids(4 * 16);
      std::vector<std::int64_t> labels(4 * 16);
      for (auto& t : ids)
        t = token(rng);
      for (auto& t : labels)
        t = token(rng);
      e.set_step(step * 2 + m);
      e.set_input("tokens", ids);
      e.set_input("targets", labels);
      CHECK(std::isfinite(e.forward()));
      e.backward();
      e.accumulate(m, 2);
    }
    e.step(opt, exec::clip_scale(e.grad_norm(), 0.5));
    after.push_back(e.local().backend().memory());
  }
  for (std::size_t s = 2; s < after.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(after[s].reserved_bytes == after[1].reserved_bytes);
    CHECK(after[s].allocated_bytes == after[1].allocated_bytes);
    CHECK(after[s].device_allocations == after[1].device_allocations); // served from the cache
    CHECK(after[s].cache_hits > after[s - 1].cache_hits);
  }
  CHECK(after[1].reserved_bytes >= after[0].reserved_bytes); // Adam's moments and sums came in
}

namespace {

// A device that fails its k-th call from now on (guard() runs at the start of every call).
class faulty_backend : public test::host_compute<faulty_backend> {
public:
  template <class T>
  using buffer = std::vector<T>;
  static constexpr bool host_memory = false; // every access through a backend call

  [[nodiscard]] std::string_view name() const { return "faulty"; }
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t n) {
    return buffer<T>(n);
  }
  /// The k-th call from now throws (1: the next one).
  void fail_in(int k) { *left_ = k; }
  [[nodiscard]] test::no_guard guard() const {
    if (*left_ > 0 && --*left_ == 0)
      throw device_error(2, "cudaLaunchKernel", "cudaErrorIllegalAddress: an illegal memory access",
                         "run with CUDA_LAUNCH_BLOCKING=1 to see the kernel that caused it");
    return {};
  }

private:
  std::shared_ptr<int> left_ = std::make_shared<int>(0);
};
static_assert(exec::backend<faulty_backend>);

} // namespace

TEST_CASE("a device error names the graph node whose kernel saw it, forward or backward") {
  models::mlp_config cfg;
  cfg.inputs = 8;
  cfg.hidden = {16};
  cfg.classes = 4;
  const graph::graph g = models::trace_mlp<float>(cfg, 4);
  exec::executor<float, faulty_backend> ex(g, 1);
  std::vector<float> x(4 * 8, 0.5F);
  std::vector<std::int64_t> y(4, 3);
  ex.set_input("x", std::span<const float>(x));
  ex.set_input("labels", std::span<const std::int64_t>(y));
  const float loss = ex.forward();
  ex.backward();
  for (const bool backward : {false, true}) {
    try {
      if (backward) { // the gradients zeroed first (not a node's kernel), then the nodes
        ex.begin_backward();
        ex.backend().fail_in(1);
        for (auto i = static_cast<graph::node_id>(g.size()); i-- > 0;)
          ex.backward_node(i);
      } else {
        ex.backend().fail_in(1);
        (void)ex.forward();
      }
      FAIL("expected a device_error");
    } catch (const device_error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(e.device() == 2);
      CHECK(e.call() == "cudaLaunchKernel");
      CHECK(what.find("device 2: cudaLaunchKernel: cudaErrorIllegalAddress: an illegal memory "
                      "access in the ") == 0);
      CHECK(what.find(backward ? "in the backward of graph node \""
                               : "in the forward of graph node \"") != std::string::npos);
      CHECK(what.find("(run with CUDA_LAUNCH_BLOCKING=1") != std::string::npos);
    }
  }
  // The device recovers from a non-sticky error: the next forward gives the same loss.
  CHECK(ex.forward() == loss);
}
