// The plan cache: a second synthesis of the same graph on the same cluster reads the stored
// plan; a cluster whose numbers changed keeps the stored program and re-solves its ratios only
// (from the stored basis); another shape synthesizes again.
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/plan_cache.hpp>

#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

using namespace hspmd;
using namespace hspmd::synth;

namespace {
std::filesystem::path fresh_dir() {
  auto d = std::filesystem::temp_directory_path() /
           ("hspmd-plan-cache-" + std::to_string(std::random_device{}()));
  std::filesystem::remove_all(d);
  return d;
}
graph::graph small_bert() {
  models::model_options o;
  o.layers = 1;
  o.hidden = 32;
  o.ffn = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 64;
  return models::trace_model<float>("bert", o, 12);
}
} // namespace

TEST_CASE("plan cache: miss, hit, ratios re-solved for new numbers, a new shape synthesized") {
  const auto dir = fresh_dir();
  const auto g = small_bert();
  const cluster c = test::make_cluster({3e10, 1e10}, 1e9);
  const plan fresh = synthesize(g, c, {}, "bert");

  const auto first = synthesize_cached(g, c, {}, "bert", dir);
  CHECK(first.outcome == cache_outcome::miss);
  CHECK(first.p.hash() == fresh.hash());
  REQUIRE(std::filesystem::exists(first.file));

  const auto second = synthesize_cached(g, c, {}, "bert", dir);
  CHECK(second.outcome == cache_outcome::hit);
  CHECK(second.p.hash() == fresh.hash());
  CHECK(second.file == first.file);

  // 10 % faster second device: same program, new ratios, from the stored basis.
  const cluster faster = test::make_cluster({3e10, 1.1e10}, 1e9);
  const auto third = synthesize_cached(g, faster, {}, "bert", dir);
  CHECK(third.outcome == cache_outcome::resolved);
  CHECK(third.warm);
  CHECK(third.p.cluster_fingerprint == fingerprint(faster));
  REQUIRE(third.p.steps.size() == first.p.steps.size());
  for (std::size_t i = 0; i < third.p.steps.size(); ++i)
    CHECK(third.p.steps[i].rule.out == first.p.steps[i].rule.out);
  CHECK(third.p.ratios[0][1] > first.p.ratios[0][1]); // the faster device gets more
  // The re-solved ratios are the LP optimum for this program on the new cluster: the same as
  // re-solving it from scratch.
  const cost_model m(g, faster, segment_map(g, segment_policy::one));
  const ratio_solution cold = solve_ratios(ratio_problem_of(first.p, m, first.p.ratios));
  REQUIRE(cold.status == lp::status::optimal);
  CHECK(third.p.step_time == Approx(cold.step_time).epsilon(1e-6));
  // and the entry now holds the new numbers: a hit.
  CHECK(synthesize_cached(g, faster, {}, "bert", dir).outcome == cache_outcome::hit);

  // Another shape (three devices) is another entry.
  const cluster three = test::make_cluster({3e10, 1e10, 1e10}, 1e9);
  const auto other = synthesize_cached(g, three, {}, "bert", dir);
  CHECK(other.outcome == cache_outcome::miss);
  CHECK(other.file != first.file);

  // A damaged entry is a miss, and is replaced.
  std::ofstream(first.file) << "{ not json";
  CHECK(synthesize_cached(g, c, {}, "bert", dir).outcome == cache_outcome::miss);
  CHECK(synthesize_cached(g, c, {}, "bert", dir).outcome == cache_outcome::hit);

  // No directory, or a measured profile: no cache.
  CHECK(synthesize_cached(g, c, {}, "bert", {}).outcome == cache_outcome::uncached);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the ratio LP of a BERT plan on mixed-8 solves (its collapsed form reported "
          "unbounded), so the cache re-solves it for new numbers") {
  models::model_options o; // one of the sizes whose collapsed LP was unbounded
  o.layers = 1;
  o.hidden = 512;
  o.heads = 8;
  o.seq = 64;
  o.vocab = 8000;
  const auto g = models::trace_model<float>("bert", o, 32);
  const cluster c = load_cluster(std::string(HSPMD_SOURCE_DIR) + "/clusters/mixed-8.json");
  const auto dir = fresh_dir();
  const auto first = synthesize_cached(g, c, {}, "bert", dir);
  CHECK(first.outcome == cache_outcome::miss);
  const cost_model m(g, c, segment_map(g, segment_policy::one));
  const ratio_solution sol = solve_ratios(ratio_problem_of(first.p, m, first.p.ratios));
  CHECK(sol.status == lp::status::optimal);
  cluster faster = c;
  faster.devices.back().speed *= 1.1;
  CHECK(synthesize_cached(g, faster, {}, "bert", dir).outcome == cache_outcome::resolved);
  std::filesystem::remove_all(dir);
}
