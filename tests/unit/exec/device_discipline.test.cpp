// Everything the executor and the optimizers do to a tensor goes through the backend: run on a
// backend whose memory the host cannot touch outside backend calls, as with a GPU, training
// gives what the host backend gives. The guarded backend keeps every buffer in pages of its own
// and leaves them PROT_NONE except while one of its calls runs, so a host read or write of a
// "device" buffer anywhere else (a loss read, a parameter initialized in place, an optimizer
// state on the host) ends the test with a segmentation fault at that line instead of passing
// silently where a GPU would have failed.
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/mlp.hpp>

#include "../../support/host_compute.hpp"

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

using namespace hspmd;

namespace {

// The pages of every live buffer, opened (read/write) only inside backend calls.
struct guarded_pages {
  std::vector<std::pair<void*, std::size_t>> regions;
  int depth = 0;
  std::size_t calls = 0;

  void protect(void* p, std::size_t bytes, bool open) const {
    REQUIRE(::mprotect(p, bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE) == 0);
  }
  void enter() {
    ++calls;
    if (depth++ == 0)
      for (const auto& [p, n] : regions)
        protect(p, n, true);
  }
  void leave() {
    if (--depth == 0)
      for (const auto& [p, n] : regions)
        protect(p, n, false);
  }
};

class guarded_backend : public test::host_compute<guarded_backend> {
public:
  template <class T>
  class buffer {
  public:
    buffer() = default;
    buffer(std::shared_ptr<guarded_pages> pages, std::size_t n) : pages_(std::move(pages)), n_(n) {
      if (n == 0)
        return;
      const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
      bytes_ = (n * sizeof(T) + page - 1) / page * page;
      void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      REQUIRE(p != MAP_FAILED); // zero-filled, like the host backend's buffers
      data_ = static_cast<T*>(p);
      pages_->regions.emplace_back(p, bytes_);
      if (pages_->depth == 0)
        pages_->protect(p, bytes_, false);
    }
    buffer(buffer&& o) noexcept
        : pages_(std::move(o.pages_)), data_(std::exchange(o.data_, nullptr)),
          n_(std::exchange(o.n_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
    buffer& operator=(buffer&& o) noexcept {
      if (this != &o) {
        release();
        pages_ = std::move(o.pages_);
        data_ = std::exchange(o.data_, nullptr);
        n_ = std::exchange(o.n_, 0);
        bytes_ = std::exchange(o.bytes_, 0);
      }
      return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() { release(); }

    [[nodiscard]] T* data() const noexcept { return data_; }
    [[nodiscard]] std::size_t size() const noexcept { return n_; }
    [[nodiscard]] T* begin() const noexcept { return data_; }
    [[nodiscard]] T* end() const noexcept { return data_ + n_; }

  private:
    void release() noexcept {
      if (data_ != nullptr) {
        auto& r = pages_->regions;
        r.erase(std::find(r.begin(), r.end(), std::pair<void*, std::size_t>{data_, bytes_}));
        ::munmap(data_, bytes_);
      }
      data_ = nullptr;
      n_ = bytes_ = 0;
    }
    std::shared_ptr<guarded_pages> pages_;
    T* data_ = nullptr;
    std::size_t n_ = 0;
    std::size_t bytes_ = 0;
  };

  [[nodiscard]] std::string_view name() const { return "guarded host memory"; }
  [[nodiscard]] std::size_t calls() const { return pages_->calls; }

  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t n) {
    return buffer<T>(pages_, n);
  }
  struct open {
    guarded_pages& p;
    explicit open(guarded_pages& pages) : p(pages) { p.enter(); }
    ~open() { p.leave(); }
    open(const open&) = delete;
    open& operator=(const open&) = delete;
  };
  /// Opens every buffer's pages for the duration of a call (host_compute wraps each in it).
  [[nodiscard]] open guard() { return open(*pages_); }

private:
  std::shared_ptr<guarded_pages> pages_ = std::make_shared<guarded_pages>();
};
static_assert(exec::backend<guarded_backend>);
static_assert(!exec::host_memory_v<guarded_backend>);
static_assert(exec::host_memory_v<exec::host_backend>);

// Trains `steps` Adam steps with clipping on both backends from the same seed and data; returns
// the losses and the final parameters of each.
template <class Feed>
void same_training(const graph::graph& g, Feed feed, int steps, double clip, bool exact) {
  exec::executor<float> host(g, 5);
  exec::executor<float, guarded_backend> guarded(g, 5);
  exec::adam host_opt(1e-2);
  exec::adam guarded_opt(1e-2);
  for (int s = 0; s < steps; ++s) {
    feed(host, s);
    feed(guarded, s);
    const float lh = host.forward();
    const float lg = guarded.forward();
    host.backward();
    guarded.backward();
    const double nh = exec::clip_grad_norm(host, clip);
    const double ng = exec::clip_grad_norm(guarded, clip);
    host_opt.step(host);
    guarded_opt.step(guarded);
    if (exact) {
      REQUIRE(lg == lh);
    } else {
      REQUIRE(lg == Approx(lh).epsilon(1e-5));
    }
    // The norm is reduced in another order off the host: equal to rounding.
    REQUIRE(ng == Approx(nh).epsilon(1e-12));
  }
  for (graph::node_id p : g.parameters()) {
    const std::vector<float> want(host.value(p).begin(), host.value(p).end());
    const std::vector<float> got = guarded.value_to_host(p);
    REQUIRE(got.size() == want.size());
    if (exact) {
      REQUIRE(got == want);
    } else {
      for (std::size_t i = 0; i < got.size(); ++i)
        REQUIRE(got[i] == Approx(want[i]).margin(1e-5));
    }
    const std::vector<float> grad = guarded.grad_to_host(p);
    REQUIRE(grad.size() == want.size());
  }
  CHECK(guarded.backend().calls() > 0);
}

} // namespace

TEST_CASE("an MLP trains through a backend whose memory the host cannot touch") {
  models::mlp_config cfg;
  cfg.inputs = 12;
  cfg.hidden = {16, 8};
  cfg.classes = 4;
  const graph::graph g = models::trace_mlp<float>(cfg, 6);
  std::normal_distribution<float> n01;
  std::vector<float> x(6 * 12);
  std::vector<std::int64_t> y(6);
  auto feed = [&](auto& ex, int step) {
    std::mt19937 r(static_cast<unsigned>(step));
    for (float& v : x)
      v = n01(r);
    for (auto& v : y)
      v = static_cast<std::int64_t>(r() % 4);
    ex.set_input("x", std::span<const float>(x));
    ex.set_input("labels", std::span<const std::int64_t>(y));
  };
  SECTION("without clipping: bit for bit") { same_training(g, feed, 3, 0.0, true); }
  SECTION("with clipping: to rounding") { same_training(g, feed, 3, 0.05, false); }
}

TEST_CASE("a BERT trains through a backend whose memory the host cannot touch") {
  models::bert_config cfg;
  cfg.layers = 1;
  cfg.hidden = 16;
  cfg.heads = 2;
  cfg.ffn = 32;
  cfg.vocab = 23;
  cfg.seq = 5;
  const graph::graph g = models::trace_bert_lm<float>(cfg, 3);
  std::vector<std::int64_t> ids(3 * 5), labels(3 * 5);
  auto feed = [&](auto& ex, int step) {
    std::mt19937 r(static_cast<unsigned>(step) + 100);
    for (auto& v : ids)
      v = static_cast<std::int64_t>(r() % 23);
    for (auto& v : labels)
      v = static_cast<std::int64_t>(r() % 23);
    ex.set_input("tokens", std::span<const std::int64_t>(ids));
    ex.set_input("targets", std::span<const std::int64_t>(labels));
  };
  same_training(g, feed, 2, 0.0, true);
}
