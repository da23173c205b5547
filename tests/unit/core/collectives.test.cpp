#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace hspmd;

TEST_CASE("names of collectives and algorithms round-trip") {
  for (uneven_algorithm a : {uneven_algorithm::automatic, uneven_algorithm::padded,
                             uneven_algorithm::grouped, uneven_algorithm::native})
    CHECK(parse_uneven_algorithm(name(a)) == a);
  CHECK_FALSE(parse_uneven_algorithm("ring").has_value());
  CHECK(name(collective::reduce_scatter_v) == "reduce_scatter_v");
  CHECK(has_algorithms(collective::all_gather_v));
  CHECK_FALSE(has_algorithms(collective::all_reduce));
}

TEST_CASE("cost terms of each algorithm (the worked example of collectives.hpp)") {
  const std::vector<std::size_t> counts{8000, 1000};
  const auto padded = terms_of(collective::all_gather_v, uneven_algorithm::padded, counts, 4);
  const auto native = terms_of(collective::all_gather_v, uneven_algorithm::native, counts, 4);
  const auto grouped = terms_of(collective::all_gather_v, uneven_algorithm::grouped, counts, 4);
  CHECK(padded.latency_terms == 1.0);
  CHECK(padded.bytes == 32000.0);
  CHECK(native.bytes == 32000.0);
  CHECK(grouped.latency_terms == 2.0);
  const std::vector<std::size_t> three{4, 0, 1};
  CHECK(terms_of(collective::reduce_scatter_v, uneven_algorithm::padded, three, 8).bytes == 64.0);
  CHECK(terms_of(collective::reduce_scatter_v, uneven_algorithm::native, three, 8).bytes == 40.0);
  CHECK(terms_of(collective::reduce_scatter_v, uneven_algorithm::grouped, three, 8).latency_terms ==
        2.0); // the empty shard costs no message
  const std::vector<std::size_t> buffer{100};
  CHECK(terms_of(collective::all_reduce, uneven_algorithm::native, buffer, 4).bytes == 400.0);
}

TEST_CASE("default costs from a link, and the choice automatic makes") {
  const auto m = collective_cost_model::from_link(8, 1e-5, 1e9);
  const std::vector<std::size_t> even(8, 1000);
  // Padding costs nothing extra on even counts; the tie goes to native.
  CHECK(m.choose(collective::all_gather_v, even, 4) == uneven_algorithm::native);
  // One non-empty shard of a few bytes: one broadcast (3 tree steps) beats 7 ring steps.
  std::vector<std::size_t> one_hot(8, 0);
  one_hot[3] = 4;
  CHECK(m.choose(collective::all_gather_v, one_hot, 4) == uneven_algorithm::grouped);
  // A large one-hot payload: padding to it would move 7x the data.
  one_hot[3] = 1 << 20;
  CHECK(m.estimate(collective::all_gather_v, uneven_algorithm::padded, one_hot, 4) >
        6.0 * m.estimate(collective::all_gather_v, uneven_algorithm::native, one_hot, 4));
  CHECK(m.estimate(collective::all_gather_v, uneven_algorithm::automatic, one_hot, 4) ==
        m.estimate(collective::all_gather_v, m.choose(collective::all_gather_v, one_hot, 4),
                   one_hot, 4));
  // All-reduce of B bytes over a ring: 2 (n-1)/n * B / bandwidth + 2 (n-1) latencies.
  const std::vector<std::size_t> buffer{250000};
  CHECK(m.estimate(collective::all_reduce, uneven_algorithm::native, buffer, 4) ==
        Approx(2.0 * 7.0 * 1e-5 + 2.0 * 7.0 / 8.0 * 1e6 / 1e9));
  CHECK_THROWS_AS(collective_cost_model::from_link(0, 1e-5, 1e9), plan_error);
  CHECK_THROWS_AS(collective_cost_model::from_link(2, 1e-5, 0.0), plan_error);
  // One rank: nothing to move.
  const auto solo = collective_cost_model::from_link(1, 1e-5, 1e9);
  const std::vector<std::size_t> one{1000};
  CHECK(solo.estimate(collective::all_gather_v, uneven_algorithm::automatic, one, 4) == 0.0);
}

TEST_CASE("fit_alpha_beta recovers the parameters and stays physical") {
  std::vector<alpha_beta_sample> samples;
  for (double bytes : {1e3, 1e4, 1e5, 1e6, 1e7})
    for (double a : {1.0, 3.0})
      samples.push_back({a, bytes, a * 4e-6 + bytes * 2e-10});
  const alpha_beta p = fit_alpha_beta(samples);
  CHECK(p.alpha == Approx(4e-6).epsilon(1e-9));
  CHECK(p.beta == Approx(2e-10).epsilon(1e-9));

  // Times that fall with size (noise) would need a negative beta: beta is clamped to 0.
  const std::vector<alpha_beta_sample> falling{{1, 1e3, 3e-6}, {1, 1e6, 2e-6}};
  const alpha_beta q = fit_alpha_beta(falling);
  CHECK(q.alpha > 0.0);
  CHECK(q.beta == 0.0);
  CHECK(fit_alpha_beta({}) == alpha_beta{});
}

TEST_CASE("cost curves: the piece covering the byte term applies") {
  auto m = collective_cost_model::from_link(2, 1e-6, 1e9);
  m.set(collective::reduce_scatter_v, uneven_algorithm::native,
        cost_curve{{1e6, {1e-6, 1e-9}}, {cost_piece{}.up_to_bytes, {1e-6, 1e-8}}});
  const std::vector<std::size_t> small{1000, 1000};       // x = 4000 B: first piece
  const std::vector<std::size_t> large{1000000, 1000000}; // x = 4 MB: second piece, 10x slower
  CHECK(m.estimate(collective::reduce_scatter_v, uneven_algorithm::native, small, 4) ==
        Approx(1e-6 + 4000 * 1e-9));
  CHECK(m.estimate(collective::reduce_scatter_v, uneven_algorithm::native, large, 4) ==
        Approx(1e-6 + 4e6 * 1e-8));
  // Where native's second piece is expensive, automatic moves to another algorithm.
  CHECK(m.choose(collective::reduce_scatter_v, small, 4) == uneven_algorithm::native);
  CHECK(m.choose(collective::reduce_scatter_v, large, 4) != uneven_algorithm::native);
  CHECK_THROWS_AS(m.set(collective::all_reduce, uneven_algorithm::native, cost_curve{}),
                  plan_error);
  CHECK_THROWS_AS(m.set(collective::all_reduce, uneven_algorithm::native, cost_curve{{10, {1, 1}}}),
                  plan_error); // the last piece must be unlimited
  CHECK_THROWS_AS(m.set(collective::all_reduce, uneven_algorithm::native,
                        cost_curve{{10, {1, 1}}, {5, {1, 1}}, {cost_piece{}.up_to_bytes, {1, 1}}}),
                  plan_error); // not ascending
  CHECK_THROWS_AS(m.set(collective::all_reduce, uneven_algorithm::native, alpha_beta{-1, 0}),
                  plan_error);
}

TEST_CASE("fit_cost_curve: one piece per pair of neighbouring sizes") {
  // A time that is linear below 1 MB and 4x steeper above it, like a protocol switch.
  const auto t = [](double x) {
    return x <= 1e6 ? 2e-6 + x * 1e-10 : 2e-6 + 1e6 * 1e-10 + (x - 1e6) * 4e-10;
  };
  std::vector<std::vector<alpha_beta_sample>> by_size;
  for (double x : {1e4, 1e5, 1e6, 1e7, 1e8})
    by_size.push_back({{1.0, x, t(x)}});
  const cost_curve curve = fit_cost_curve(by_size);
  REQUIRE(curve.size() == 4);
  CHECK(curve[0].up_to_bytes == 1e5);
  CHECK(curve[2].up_to_bytes == 1e7);
  CHECK_FALSE(std::isfinite(curve[3].up_to_bytes));
  auto m = collective_cost_model::from_link(2, 1e-6, 1e9);
  m.set(collective::all_reduce, uneven_algorithm::native, curve);
  for (double x : {1e4, 5e4, 1e5, 1e6, 1e7, 1e8}) {
    const alpha_beta& p = m.params(collective::all_reduce, uneven_algorithm::native, x);
    CAPTURE(x);
    CHECK(p.alpha + x * p.beta == Approx(t(x)).epsilon(1e-6)); // exact at the measured sizes
  }
  CHECK(fit_cost_curve({}).size() == 1);
}
