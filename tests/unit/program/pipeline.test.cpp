// Pipeline schedules (program/pipeline.hpp): every schedule is a schedule (each pass once, in
// dependency order, no deadlock) for every pipeline depth and micro-batch count tried; 1F1B and
// interleaved 1F1B have their theoretical bubbles under uniform stage times; 1F1B holds at most
// p micro-batches on the first device while GPipe holds all m; the zero-bubble schedule holds no
// more than 1F1B's peak and idles a third of its time (ZB-H1); wrong schedules are refused naming
// what is wrong.
#include <hspmd/program/pipeline.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

using namespace hspmd;
using program::pass;
using program::schedule_kind;

namespace {

// (p - 1) / (v m + p - 1): the bubble of 1F1B (v = 1) and interleaved 1F1B with equal stages.
double theory_bubble(std::size_t p, std::size_t m, std::size_t v) {
  const auto pd = static_cast<double>(p);
  return (pd - 1.0) / (static_cast<double>(v * m) + pd - 1.0);
}

// Stage times: forward f, backward b (its weight-gradient share w), a boundary transfer, slowdowns.
program::stage_costs costs(double f, double b, double w = 0.5, double transfer = 0.0,
                           std::vector<double> slowdown = {}) {
  program::stage_costs c;
  c.forward = f;
  c.backward = b;
  c.weight_share = w;
  c.transfer = transfer;
  c.slowdown = std::move(slowdown);
  return c;
}

} // namespace

TEST_CASE("pipeline schedules: every kind is a schedule for every depth and micro-batch count") {
  for (std::size_t p = 1; p <= 5; ++p)
    for (std::size_t m = 1; m <= 9; ++m) {
      CAPTURE(p, m);
      for (const auto k :
           {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble}) {
        const auto s = program::make_schedule(k, p, m);
        CAPTURE(program::name(k));
        REQUIRE_NOTHROW(program::check(s));
      }
      if (m % p == 0)
        for (std::size_t v = 2; v <= 3; ++v) {
          const auto s = program::make_schedule(schedule_kind::interleaved, p, m, v);
          CAPTURE(v);
          REQUIRE_NOTHROW(program::check(s));
        }
    }
}

TEST_CASE("pipeline schedules: 1F1B's order and its bubble (p - 1) / (m + p - 1)") {
  const auto s = program::make_schedule(schedule_kind::one_f_one_b, 4, 8);
  CHECK(program::text(s, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(program::text(s, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  for (std::size_t p = 2; p <= 5; ++p)
    for (std::size_t m = p; m <= 12; m += 3) {
      CAPTURE(p, m);
      const auto one = program::simulate(program::make_schedule(schedule_kind::one_f_one_b, p, m),
                                         costs(1.0, 2.0));
      CHECK(one.bubble == Approx(theory_bubble(p, m, 1)).margin(1e-12));
      CHECK(one.step == Approx(3.0 * static_cast<double>(m + p - 1)));
      const auto gpipe =
          program::simulate(program::make_schedule(schedule_kind::gpipe, p, m), costs(1.0, 2.0));
      CHECK(gpipe.bubble == Approx(theory_bubble(p, m, 1)).margin(1e-12));
    }
}

TEST_CASE("pipeline schedules: interleaved 1F1B's bubble (p - 1) / (v m + p - 1)") {
  for (std::size_t p = 2; p <= 4; ++p)
    for (std::size_t v = 2; v <= 3; ++v)
      for (std::size_t m = p; m <= 3 * p; m += p) {
        CAPTURE(p, v, m);
        const auto t = program::simulate(
            program::make_schedule(schedule_kind::interleaved, p, m, v), costs(1.0, 2.0));
        CHECK(t.bubble == Approx(theory_bubble(p, m, v)).margin(1e-12));
        // fewer idle device-seconds than 1F1B on the same pipeline
        const auto one = program::simulate(program::make_schedule(schedule_kind::one_f_one_b, p, m),
                                           costs(1.0, 2.0));
        CHECK(t.step < one.step);
      }
}

TEST_CASE("pipeline schedules: micro-batches in flight -- 1F1B at most p, GPipe all m") {
  for (std::size_t m : {4UL, 8UL, 16UL}) {
    CAPTURE(m);
    const auto one = program::simulate(program::make_schedule(schedule_kind::one_f_one_b, 4, m));
    const auto gpipe = program::simulate(program::make_schedule(schedule_kind::gpipe, 4, m));
    const auto zb = program::simulate(program::make_schedule(schedule_kind::zero_bubble, 4, m));
    for (std::size_t d = 0; d < 4; ++d) {
      CAPTURE(d);
      CHECK(one.peak_inflight[d] == std::min<std::size_t>(4 - d, m));
      CHECK(gpipe.peak_inflight[d] == m);
      CHECK(zb.peak_inflight[d] <= one.peak_inflight[0]);
      // what the executor allocates slots by counts the same (a split backward's slot is
      // held until its weight part)
      for (const auto kind :
           {schedule_kind::one_f_one_b, schedule_kind::gpipe, schedule_kind::zero_bubble}) {
        const auto s = program::make_schedule(kind, 4, m);
        CHECK(program::in_flight_per_chunk(s, d).at(0) == program::simulate(s).peak_inflight[d]);
      }
    }
  }
}

TEST_CASE("pipeline schedules: zero bubble idles a third of 1F1B's time with equal F, B and W") {
  for (std::size_t p = 2; p <= 5; ++p)
    for (std::size_t m : {p, 2 * p, 4 * p}) {
      CAPTURE(p, m);
      const program::stage_costs equal = costs(1.0, 2.0, 0.5);
      const auto zb =
          program::simulate(program::make_schedule(schedule_kind::zero_bubble, p, m), equal);
      const auto one =
          program::simulate(program::make_schedule(schedule_kind::one_f_one_b, p, m), equal);
      CHECK(zb.step < one.step);
      // ZB-H1's theory: a device idles (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W)
      const double idle_zb = zb.bubble * zb.step, idle_one = one.bubble * one.step;
      CHECK(idle_zb == Approx(idle_one / 3.0));
      CHECK(idle_zb == Approx(static_cast<double>(p - 1)));
      if (p == 4 && m == 8)
        CHECK(program::text(program::make_schedule(schedule_kind::zero_bubble, p, m), 3) ==
              "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7");
      // the weight gradients come split from the input gradients, each after its own
      const auto s = program::make_schedule(schedule_kind::zero_bubble, p, m);
      for (std::size_t d = 0; d < p; ++d) {
        std::size_t weights = 0;
        for (const auto& op : s.order[d])
          weights += op.what == pass::backward_weight ? 1 : 0;
        CHECK(weights == m);
      }
    }
}

TEST_CASE("pipeline schedules: a slower device and boundary transfers stretch the step") {
  const auto s = program::make_schedule(schedule_kind::one_f_one_b, 2, 8);
  const auto even = program::simulate(s, costs(1.0, 2.0));
  const auto slow = program::simulate(s, costs(1.0, 2.0, 0.5, 0.0, {1.0, 2.0}));
  const auto sent = program::simulate(s, costs(1.0, 2.0, 0.5, 0.5));
  CHECK(slow.step > even.step);
  // the slower device is the bottleneck: 8 micro-batches of 2 x 3 units, plus the warm-up
  CHECK(slow.step >= 8 * 6.0);
  CHECK(slow.busy[1] == Approx(2.0 * slow.busy[0]));
  CHECK(sent.step > even.step);
}

TEST_CASE("pipeline schedules: wrong ones are refused naming what is wrong") {
  auto s = program::make_schedule(schedule_kind::one_f_one_b, 2, 2);
  SECTION("a deadlock") {
    // device 0 waits at B0 for device 1, which waits at F1 for device 0
    s.order[0] = {{pass::forward, 0, 0},
                  {pass::backward, 0, 0},
                  {pass::forward, 1, 0},
                  {pass::backward, 1, 0}};
    s.order[1] = {{pass::forward, 0, 0},
                  {pass::forward, 1, 0},
                  {pass::backward, 0, 0},
                  {pass::backward, 1, 0}};
    CHECK_THROWS_WITH(program::check(s), Catch::Contains("deadlocks") &&
                                             Catch::Contains("device 0 at B0") &&
                                             Catch::Contains("device 1 at F1"));
  }
  SECTION("a pass twice, one missing") {
    s.order[0][1] = s.order[0][0];
    CHECK_THROWS_WITH(program::check(s), Catch::Contains("device 0 runs F0 twice"));
  }
  SECTION("a backward before its forward") {
    std::swap(s.order[1][0], s.order[1][1]);
    CHECK_THROWS_WITH(program::check(s), Catch::Contains("device 1 runs B0 before its forward"));
  }
  SECTION("bounds") {
    CHECK_THROWS_WITH(program::make_schedule(schedule_kind::interleaved, 4, 6, 2),
                      Catch::Contains("multiple of the pipeline's devices (4)"));
    CHECK_THROWS_WITH(program::make_schedule(schedule_kind::interleaved, 2, 4, 1),
                      Catch::Contains("at least 2 chunks"));
    CHECK_THROWS_WITH(program::make_schedule(schedule_kind::gpipe, 2, 0),
                      Catch::Contains("at least one device and one micro-batch"));
    CHECK_THROWS_WITH(program::parse_schedule("1F1B"),
                      Catch::Contains("schedule '1F1B': not one of gpipe, 1f1b, interleaved, zb"));
    CHECK(program::parse_schedule("zb") == schedule_kind::zero_bubble);
  }
}
