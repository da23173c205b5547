// The cluster file's bf16_speed and the cost model of a mixed-precision run: a device with a
// faster 16-bit GEMM rate gets its GEMM-class ops priced at that rate (matmul, linear, batched
// matmul, conv2d), everything else at `speed`; so a bf16 plan gives such a device a larger share
// than the float plan does. A bad rate is named with its field.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <catch2/catch.hpp>

#include <string>

using namespace hspmd;

namespace {

// Two devices of equal float speed; d1 has 16-bit GEMMs `ratio` times faster.
std::string two_devices(const std::string& bf16_field) {
  return R"({"version": 1, "name": "t", "links": {"intra_node": {"bandwidth": 1e12, "latency": 1e-6}},
             "devices": [{"name": "d0", "kind": "a", "speed": 1e12, "memory": "16 GiB"},
                         {"name": "d1", "kind": "b", "speed": 1e12, "memory": "16 GiB")" +
         bf16_field + "}]}";
}

} // namespace

TEST_CASE("bf16_speed is read, written back, and optional") {
  const cluster c = parse_cluster(two_devices(R"(, "bf16_speed": 4e12)"), "t.json");
  CHECK(c.devices[0].bf16_speed == 0.0);
  CHECK(c.devices[1].bf16_speed == 4e12);
  CHECK(c.devices[1].gemm_speed(true) == 4e12);
  CHECK(c.devices[1].gemm_speed(false) == 1e12);
  CHECK(c.devices[0].gemm_speed(true) == 1e12); // no 16-bit rate: its float speed
  const cluster again = parse_cluster(to_json(c).dump(), "again.json");
  CHECK(again == c);
  CHECK(fingerprint(again) == fingerprint(c));
  // A cluster without the field keeps the fingerprint it had before the field existed.
  CHECK_FALSE(to_json(parse_cluster(two_devices(""), "t.json")).dump().find("bf16") !=
              std::string::npos);
  for (const char* bad :
       {R"(, "bf16_speed": 0)", R"(, "bf16_speed": -1)", R"(, "bf16_speed": "fast")"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_cluster(two_devices(bad), "t.json"),
                      Catch::Contains("t.json: field devices[1].bf16_speed"));
  }
}

TEST_CASE("a 16-bit run prices GEMMs at the devices' bf16 rates") {
  models::model_options o;
  o.layers = 2;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 200;
  const graph::graph g = models::trace_model<float>("bert", o, 8);
  const cluster c = parse_cluster(two_devices(R"(, "bf16_speed": 4e12)"), "t.json");
  const synth::segment_map seg(g, synth::segment_policy::one);
  // Replicated rules: each device does all of every op, at its own rate.
  const synth::cost_model f32(g, c, seg);
  const synth::cost_model bf16(g, c, seg, std::nullopt, dtype::bf16);
  std::size_t gemms = 0, others = 0;
  for (graph::node_id i = 0; i < g.size(); ++i) {
    const graph::node& n = g[i];
    if (n.kind == graph::op::input || n.kind == graph::op::parameter)
      continue;
    const graph::rule r = graph::replicated_rule(n.inputs.size());
    const auto a = f32.compute(i, r);
    const auto b = bf16.compute(i, r);
    INFO(n.name << " (" << graph::name(n.kind) << ")");
    CHECK(a[0].constant == b[0].constant); // d0 has no 16-bit rate
    if (synth::cost_model::is_gemm(n.kind) && a[1].constant > 0.0) {
      ++gemms;
      CHECK(b[1].constant == Approx(a[1].constant / 4.0));
    } else {
      ++others;
      CHECK(b[1].constant == a[1].constant);
    }
  }
  CHECK(gemms >= 8);
  CHECK(others >= 8);
}

TEST_CASE("a bf16 plan gives the device with fast 16-bit GEMMs a larger share") {
  // (DP-CP's ratios follow `speed` by definition; the synthesizer's LP follows the prices.)
  models::model_options o;
  o.layers = 2;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 200;
  const graph::graph g = models::trace_model<float>("bert", o, 16);
  const cluster c = parse_cluster(two_devices(R"(, "bf16_speed": 4e12)"), "t.json");
  synth::synth_options so;
  const auto f32 = synth::synthesize(g, c, so, "bert");
  so.gemm_type = dtype::bf16;
  const auto bf16 = synth::synthesize(g, c, so, "bert");
  CHECK(f32.ratios[0][1] == Approx(0.5).margin(0.02));
  CHECK(bf16.ratios[0][1] > 0.6);
  CHECK(bf16.step_time < f32.step_time);
}

TEST_CASE("a profile measured in bf16 is not sped up twice") {
  // d0 (bf16 4x) was measured in a bf16 run: its GEMMs took the measured time, not a quarter of
  // it; d1 (no 16-bit rate) takes 4x as long for them; other ops as measured on both.
  models::model_options o;
  o.layers = 1;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 200;
  const graph::graph g = models::trace_model<float>("bert", o, 8);
  const cluster c = parse_cluster(
      R"({"version": 1, "name": "t", "links": {"intra_node": {"bandwidth": 1e12, "latency": 1e-6}},
          "devices": [{"name": "d0", "kind": "a", "speed": 1e12, "bf16_speed": 4e12, "memory": "16 GiB"},
                      {"name": "d1", "kind": "b", "speed": 1e12, "memory": "16 GiB"}]})",
      "t.json");
  synth::compute_profile p;
  p.seconds.assign(g.size(), 1e-3);
  p.speed = 1e12;
  p.gemm_speed = c.devices[0].gemm_speed(true);
  const synth::cost_model m(g, c, synth::segment_map(g, synth::segment_policy::one), p,
                            dtype::bf16);
  std::size_t gemms = 0;
  for (graph::node_id i = 0; i < g.size(); ++i) {
    const graph::node& n = g[i];
    if (n.kind == graph::op::input || n.kind == graph::op::parameter)
      continue;
    INFO(n.name);
    const auto t = m.compute(i, graph::replicated_rule(n.inputs.size()));
    CHECK(t[0].constant == Approx(1e-3));
    if (synth::cost_model::is_gemm(n.kind)) {
      ++gemms;
      CHECK(t[1].constant == Approx(4e-3));
    } else {
      CHECK(t[1].constant == Approx(1e-3));
    }
  }
  CHECK(gemms >= 4);
}
