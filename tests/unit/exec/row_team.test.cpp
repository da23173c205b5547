// Row kernels run by a team of threads per row, as a GPU runs them (exec/backends/
// device_launch.cuh: 16 threads a row, element j to thread j % 16, sums combined 8, 4, 2, 1
// apart), emulated here with 16 host threads and a barrier in place of the warp's shuffles. Every
// row functor must give what the serial team gives: a functor that let one thread read what
// another writes, or wrote a row's single result from several threads, or missed elements of
// the threads it does not own, fails here -- the races a device would have, found on the host.
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/kernels/normalization.hpp>
#include <hspmd/kernels/vocabulary.hpp>

#include <catch2/catch.hpp>

#include <barrier>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

using namespace hspmd;

namespace {

constexpr unsigned team_width = 16;
static_assert(team_width == exec::reduce_lanes);

struct team_exchange {
  std::barrier<> sync{team_width};
  float f[team_width] = {};
  double d[team_width] = {};
  template <class T>
  T* slots() {
    if constexpr (std::is_same_v<T, float>)
      return f;
    else
      return d;
  }
};

// One of 16 host threads sharing a row: the device's lane team with a barrier for the shuffles.
struct threaded_team {
  unsigned lane;
  team_exchange* x;

  template <class F>
  void for_each(std::size_t n, const F& f) const {
    for (std::size_t j = lane; j < n; j += team_width)
      f(j);
  }
  template <class T, class F>
  T sum(std::size_t n, const F& term) const {
    T acc{};
    for (std::size_t j = lane; j < n; j += team_width)
      acc += term(j);
    return combine<T>(acc, [](T a, T b) { return a + b; });
  }
  template <class T>
  T max(const T* p, std::size_t n) const {
    T acc = p[0];
    for (std::size_t j = lane; j < n; j += team_width)
      acc = p[j] > acc ? p[j] : acc;
    return combine<T>(acc, [](T a, T b) { return b > a ? b : a; });
  }
  [[nodiscard]] bool leader() const { return lane == 0; }
  [[nodiscard]] bool owns(std::size_t j) const { return j % team_width == lane; }

private:
  template <class T, class Op>
  T combine(T acc, Op op) const {
    T* s = x->slots<T>();
    s[lane] = acc;
    x->sync.arrive_and_wait();
    for (unsigned w = team_width / 2; w > 0; w /= 2) {
      if (lane < w) // reads s[lane + w] >= w, written in no later round
        s[lane] = op(s[lane], s[lane + w]);
      x->sync.arrive_and_wait();
    }
    const T result = s[0];
    x->sync.arrive_and_wait(); // nobody overwrites s before every thread has read it
    return result;
  }
};

// f(r, team) for every row, 16 threads each walking all rows together.
template <class F>
void run_threaded(std::size_t rows, const F& f) {
  team_exchange x;
  std::vector<std::thread> threads;
  for (unsigned lane = 0; lane < team_width; ++lane)
    threads.emplace_back([&, lane] {
      const threaded_team team{lane, &x};
      for (std::size_t r = 0; r < rows; ++r)
        f(r, team);
    });
  for (auto& t : threads)
    t.join();
}

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed, double lo = -3, double hi = 3) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (T& e : v)
    e = static_cast<T>(u(rng));
  return v;
}

// Runs make(outputs) serially and threaded on copies of `outputs` (the buffers the functor
// writes, starting from the same values) and compares them.
template <class T, class Make>
void same_on_a_team(std::size_t rows, std::vector<std::vector<T>> outputs, Make make) {
  auto serial = outputs;
  auto threaded = outputs;
  exec::host_backend host;
  exec::for_each_row(host, rows, make(serial));
  run_threaded(rows, make(threaded));
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (std::size_t b = 0; b < outputs.size(); ++b)
    for (std::size_t i = 0; i < outputs[b].size(); ++i) {
      const double want = serial[b][i];
      const double got = threaded[b][i];
      INFO("output " << b << " element " << i);
      REQUIRE(std::abs(got - want) <= tol * (1 + std::abs(want)));
    }
}

template <class T>
void every_row_functor(std::size_t rows, std::size_t len) {
  using exec::vocab_span;
  const auto x = random_values<T>(rows * len, 1);
  const auto dy = random_values<T>(rows * len, 2);
  const auto gamma = random_values<T>(len, 3, 0.5, 1.5);
  const auto beta = random_values<T>(len, 4);
  const auto dx0 = random_values<T>(rows * len, 5); // gradients accumulate into what is there

  for (const bool causal : {false, true})
    same_on_a_team<T>(rows, {std::vector<T>(rows * len, T{7})}, [&](auto& out) {
      return exec::softmax_row<T, false>{x.data(), out[0].data(), len, causal, len, 0};
    });
  same_on_a_team<T>(rows, {std::vector<T>(rows * len)}, [&](auto& out) {
    return exec::softmax_row<T, true>{x.data(), out[0].data(), len, false, 1, 0};
  });
  std::vector<T> y(rows * len);
  exec::host_backend host;
  exec::for_each_row(host, rows, exec::softmax_row<T, false>{x.data(), y.data(), len, false, 1, 0});
  same_on_a_team<T>(rows, {dx0}, [&](auto& out) {
    return exec::softmax_row_backward<T, false>{y.data(), dy.data(), out[0].data(), len};
  });
  same_on_a_team<T>(rows, {dx0}, [&](auto& out) {
    return exec::softmax_row_backward<T, true>{y.data(), dy.data(), out[0].data(), len};
  });

  same_on_a_team<T>(rows, {std::vector<T>(rows * len), std::vector<T>(2 * rows)}, [&](auto& out) {
    return exec::layer_norm_row<T>{x.data(),      gamma.data(), beta.data(), out[0].data(),
                                   out[1].data(), len,          T(1e-5)};
  });
  std::vector<T> ln_saved(2 * rows), ln_y(rows * len);
  exec::for_each_row(host, rows,
                     exec::layer_norm_row<T>{x.data(), gamma.data(), beta.data(), ln_y.data(),
                                             ln_saved.data(), len, T(1e-5)});
  same_on_a_team<T>(rows, {dx0}, [&](auto& out) {
    return exec::layer_norm_row_backward<T>{x.data(),        gamma.data(),  dy.data(),
                                            ln_saved.data(), out[0].data(), len};
  });

  same_on_a_team<T>(rows, {std::vector<T>(rows * len), std::vector<T>(rows)}, [&](auto& out) {
    return exec::rms_norm_row<T>{x.data(),      gamma.data(), out[0].data(),
                                 out[1].data(), len,          T(1e-6)};
  });
  std::vector<T> rms_saved(rows), rms_y(rows * len);
  exec::for_each_row(
      host, rows,
      exec::rms_norm_row<T>{x.data(), gamma.data(), rms_y.data(), rms_saved.data(), len, T(1e-6)});
  same_on_a_team<T>(rows, {dx0}, [&](auto& out) {
    return exec::rms_norm_row_backward<T>{x.data(),         gamma.data(),  dy.data(),
                                          rms_saved.data(), out[0].data(), len};
  });

  // Cross-entropy's rows: maxima, sums of exponentials, and the logits' gradient with the
  // target's -g on a vocabulary piece [2, 2 + len) of a larger vocabulary.
  same_on_a_team<T>(rows, {std::vector<T>(rows)}, [&](auto& out) {
    return exec::row_max<T>{x.data(), out[0].data(), len};
  });
  std::vector<T> lse(rows);
  exec::for_each_row(host, rows, exec::row_max<T>{x.data(), lse.data(), len});
  same_on_a_team<T>(rows, {std::vector<T>(rows)}, [&](auto& out) {
    return exec::row_exp_sum<T>{x.data(), lse.data(), out[0].data(), len};
  });
  std::vector<std::int64_t> targets(rows);
  for (std::size_t r = 0; r < rows; ++r)
    targets[r] = static_cast<std::int64_t>((r * 5 + 1) % (len + 4)); // some outside the piece
  const std::vector<T> g{T(0.75)};
  same_on_a_team<T>(rows, {dx0}, [&](auto& out) {
    return exec::cross_entropy_backward<T>{x.data(),
                                           targets.data(),
                                           lse.data(),
                                           g.data(),
                                           out[0].data(),
                                           len,
                                           vocab_span{2, len, len + 4},
                                           T(0.5)};
  });
}

} // namespace

TEST_CASE("row kernels give the serial result when 16 threads share each row, as on a GPU") {
  // Rows shorter than the team (threads with no element), not a multiple of it, and several
  // times it.
  for (const std::size_t len :
       {std::size_t{5}, std::size_t{16}, std::size_t{37}, std::size_t{100}}) {
    INFO("row length " << len);
    every_row_functor<float>(6, len);
    every_row_functor<double>(3, len);
  }
}

TEST_CASE("the threaded team reduces in the serial team's order") {
  // 16 lanes, then pairs 8, 4, 2, 1 apart: the same additions in the same order, so sums of
  // values whose order matters come out identical, not just close.
  const auto v = random_values<float>(1000, 9, -1e4, 1e4);
  float serial = exec::serial_team{}.sum<float>(v.size(), [&](std::size_t j) { return v[j]; });
  std::vector<float> threaded(team_width);
  run_threaded(1, [&](std::size_t, const threaded_team& t) {
    threaded[t.lane] = t.sum<float>(v.size(), [&](std::size_t j) { return v[j]; });
  });
  for (float s : threaded)
    CHECK(s == serial);
}
