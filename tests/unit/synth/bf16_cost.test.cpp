// A device's rates beyond `speed` in the cluster file and the cost model.
// bf16_speed, a mixed-precision run: a device with a faster 16-bit GEMM rate gets its GEMM-class
// ops priced at that rate (matmul, linear, batched matmul, conv2d), everything else at `speed`;
// so a bf16 plan gives such a device a larger share than the float plan does.
// Class rates (hspmd-profile measures them): every op is priced at its class's rate on each
// device (GEMM, elementwise, softmax, optimizer), with or without a measured profile, and the LP
// gives a device the share its rates for this model's mix of ops earn it.
// A bad rate is named with its field.
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

// A small BERT (hidden 64, 2 heads, sequence 16, vocabulary 200).
graph::graph small_bert(std::size_t batch, std::size_t layers = 2) {
  models::model_options o;
  o.layers = layers;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 200;
  return models::trace_model<float>("bert", o, batch);
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
  const graph::graph g = small_bert(8);
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
  const graph::graph g = small_bert(16);
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
  const graph::graph g = small_bert(8, 1);
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

namespace {

// Two devices of equal `speed`: d0 fast at GEMMs and slow at everything else, d1 the reverse.
std::string two_rated_devices(const std::string& d0_rates, const std::string& d1_rates) {
  return R"({"version": 1, "name": "t", "links": {"intra_node": {"bandwidth": 1e12, "latency": 1e-6}},
             "devices": [{"name": "d0", "kind": "a", "speed": 1e11, "memory": "16 GiB")" +
         d0_rates + R"(},
                         {"name": "d1", "kind": "b", "speed": 1e11, "memory": "16 GiB")" +
         d1_rates + "}]}";
}
const std::string fast_gemm =
    R"(, "rates": {"gemm": 4e11, "elementwise": 1e9, "softmax": 2e9, "optimizer": 3e9})";
const std::string fast_memory =
    R"(, "rates": {"gemm": 1e11, "elementwise": 8e9, "softmax": 6e9, "optimizer": 5e9})";

} // namespace

TEST_CASE("class rates are read, written back, and all or nothing") {
  const cluster c = parse_cluster(two_rated_devices(fast_gemm, fast_memory), "t.json");
  CHECK(c.devices[0].has_rates());
  CHECK(c.devices[0].rate(op_class::gemm) == 4e11);
  CHECK(c.devices[0].rate(op_class::elementwise) == 1e9);
  CHECK(c.devices[1].rate(op_class::softmax) == 6e9);
  CHECK(c.devices[1].rate(op_class::optimizer) == 5e9);
  const cluster again = parse_cluster(to_json(c).dump(), "again.json");
  CHECK(again == c);
  CHECK(fingerprint(again) == fingerprint(c));
  // A changed rate changes the fingerprint (a cached plan's ratios are re-solved).
  cluster slower = c;
  slower.devices[1].rates[1] /= 2.0;
  CHECK(fingerprint(slower) != fingerprint(c));
  // Without rates every class runs at `speed`, and the canonical form has no "rates".
  const cluster plain = parse_cluster(two_rated_devices("", ""), "t.json");
  CHECK_FALSE(plain.devices[0].has_rates());
  CHECK(plain.devices[0].rate(op_class::softmax) == 1e11);
  CHECK(to_json(plain).dump().find("rates") == std::string::npos);

  const std::pair<std::string, std::string> bad[] = {
      {R"(, "rates": {"gemm": 4e11, "elementwise": 1e9, "softmax": 2e9})",
       "t.json: field devices[0].rates.optimizer: missing"},
      {R"(, "rates": {"gemm": 4e11, "elementwise": 1e9, "softmax": 2e9, "optimiser": 3e9})",
       "t.json: field devices[0].rates.optimiser: unknown key (expected one of gemm, elementwise, "
       "softmax, optimizer; did you mean \"optimizer\"?)"},
      {R"(, "rates": {"gemm": -1, "elementwise": 1e9, "softmax": 2e9, "optimizer": 3e9})",
       "t.json: field devices[0].rates.gemm: must be > 0"},
      {R"(, "rates": [1, 2, 3, 4])", "t.json: field devices[0].rates: is an array"},
  };
  for (const auto& [field, message] : bad) {
    INFO(field);
    CHECK_THROWS_WITH(parse_cluster(two_rated_devices(field, fast_memory), "t.json"),
                      Catch::StartsWith(message));
  }
  CHECK_THROWS_WITH(parse_cluster(two_rated_devices(fast_gemm, ""), "t.json"),
                    "t.json: field devices: device d1 has no class rates and device d0 has "
                    "(expected give \"rates\" for every device (hspmd-profile --merge measures "
                    "them) or for none)");
}

TEST_CASE("class rates price each op at its class's rate on each device") {
  const graph::graph g = small_bert(8);
  const cluster c = parse_cluster(two_rated_devices(fast_gemm, fast_memory), "t.json");
  const synth::cost_model m(g, c, synth::segment_map(g, synth::segment_policy::one));
  REQUIRE(m.class_rates());
  std::array<std::size_t, op_class_count> seen{};
  for (graph::node_id i = 0; i < g.size(); ++i) {
    const graph::node& n = g[i];
    if (n.kind == graph::op::input || n.kind == graph::op::parameter)
      continue;
    const graph::node_cost nc = graph::cost_of(g, i);
    const double flops = nc.forward_flops + nc.backward_flops;
    if (flops == 0.0)
      continue;
    const op_class k = synth::op_class_of(n.kind);
    ++seen[static_cast<std::size_t>(k)];
    const auto t = m.compute(i, graph::replicated_rule(n.inputs.size()));
    INFO(n.name << " (" << graph::name(n.kind) << ")");
    CHECK(t[0].constant == Approx(flops / c.devices[0].rate(k)));
    CHECK(t[1].constant == Approx(flops / c.devices[1].rate(k)));
  }
  CHECK(seen[static_cast<std::size_t>(op_class::gemm)] >= 8);
  CHECK(seen[static_cast<std::size_t>(op_class::elementwise)] >= 8);
  CHECK(seen[static_cast<std::size_t>(op_class::softmax)] >= 2);
  // The optimizer's update of a replicated parameter, at the optimizer rate.
  const graph::node_id w = g.parameters().front();
  synth::transfer load;
  load.kind = synth::transfer_kind::load;
  load.tensor = w;
  load.to = placement_of<replicated>;
  const auto u = m.transfer_compute(load);
  const double elems = static_cast<double>(g[w].out.size());
  CHECK(u[0].constant == Approx(synth::optimizer_flops_per_element * elems / 3e9));
  CHECK(u[1].constant == Approx(synth::optimizer_flops_per_element * elems / 5e9));
}

TEST_CASE("a profile converts its seconds at the measured device's class rates") {
  // d0 measured every node at 1 ms: on d1 a GEMM takes 4x as long (its GEMM rate is a quarter
  // of d0's), an elementwise op an eighth (8x d0's rate).
  const graph::graph g = small_bert(8);
  const cluster c = parse_cluster(two_rated_devices(fast_gemm, fast_memory), "t.json");
  synth::compute_profile p;
  p.seconds.assign(g.size(), 1e-3);
  p.speed = c.devices[0].speed;
  p.rates = c.devices[0].rates;
  p.optimizer_seconds_per_element = 1e-9;
  const synth::cost_model m(g, c, synth::segment_map(g, synth::segment_policy::one), p);
  REQUIRE(m.class_rates());
  for (graph::node_id i = 0; i < g.size(); ++i) {
    const graph::node& n = g[i];
    if (n.kind == graph::op::input || n.kind == graph::op::parameter)
      continue;
    INFO(n.name);
    const auto k = static_cast<std::size_t>(synth::op_class_of(n.kind));
    const auto t = m.compute(i, graph::replicated_rule(n.inputs.size()));
    CHECK(t[0].constant == Approx(1e-3));
    CHECK(t[1].constant == Approx(1e-3 * c.devices[0].rates[k] / c.devices[1].rates[k]));
  }
  // A profile without the measured device's rates prices by `speed` alone (equal here).
  p.rates = {};
  const synth::cost_model plain(g, c, synth::segment_map(g, synth::segment_policy::one), p);
  CHECK_FALSE(plain.class_rates());
  const auto last = static_cast<graph::node_id>(g.size() - 1);
  const auto t = plain.compute(last, graph::replicated_rule(g[last].inputs.size()));
  CHECK(t[0].constant == Approx(t[1].constant));
}

TEST_CASE("the LP gives a device the share its class rates earn for the model's mix of ops") {
  // Equal speeds: without class rates the devices split the batch evenly. With them, a BERT step
  // is mostly GEMM at this size, so d0 (4x d1's GEMM rate) takes the larger share.
  const graph::graph g = small_bert(16);
  synth::synth_options so;
  const auto plain =
      synth::synthesize(g, parse_cluster(two_rated_devices("", ""), "t.json"), so, "bert");
  const cluster c = parse_cluster(two_rated_devices(fast_gemm, fast_memory), "t.json");
  const auto rated = synth::synthesize(g, c, so, "bert");
  CHECK(plain.ratios[0][0] == Approx(0.5).margin(0.02));
  INFO("ratios " << rated.ratios[0][0] << " " << rated.ratios[0][1]);
  // Which way it goes depends on the mix; what the LP must do is price it: compare with the
  // model's own totals per class on each device.
  double t0 = 0.0;
  double t1 = 0.0;
  for (graph::node_id i = 0; i < g.size(); ++i) {
    const graph::node_cost nc = graph::cost_of(g, i);
    const op_class k = synth::op_class_of(g[i].kind);
    t0 += (nc.forward_flops + nc.backward_flops) / c.devices[0].rate(k);
    t1 += (nc.forward_flops + nc.backward_flops) / c.devices[1].rate(k);
  }
  if (t0 < t1)
    CHECK(rated.ratios[0][0] > 0.55);
  else
    CHECK(rated.ratios[0][1] > 0.55);
}
