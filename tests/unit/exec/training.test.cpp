// Optimizer arithmetic, clipping, and an MLP learning a synthetic task in 50 steps.
#include <hspmd/exec/optim.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/llama.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/train/trainer.hpp>

#include "../../support/training.hpp"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace hspmd;

namespace {
// loss = sum(w * c): the gradient of w is c, constant.
graph::graph linear_loss(std::size_t n) {
  nn::tracer t(dtype::f64, 1);
  const auto w = t.parameter<double>("w", extents<dynamic_extent>(n), nn::constant_init(1.0));
  const auto c = t.input<double, extents<dynamic_extent>>("c", n);
  t.set_loss(nn::sum(nn::mul(w, c)));
  return t.take();
}
} // namespace

TEST_CASE("SGD with momentum and Adam/AdamW update by their formulas") {
  const graph::graph g = linear_loss(2);
  exec::executor<double> ex(g);
  ex.set_input("c", std::vector<double>{2.0, -4.0});
  const auto w = ex.parameter("w");
  exec::sgd opt(0.1, 0.9, 0.0);
  for (int s = 0; s < 2; ++s) {
    ex.forward();
    ex.backward();
    opt.step(ex);
  }
  // v1 = g, w1 = 1 - 0.1 g; v2 = 0.9 g + g, w2 = w1 - 0.1 * 1.9 g = 1 - 0.29 g
  CHECK(ex.value(w)[0] == Approx(1.0 - 0.29 * 2.0));
  CHECK(ex.value(w)[1] == Approx(1.0 + 0.29 * 4.0));

  exec::executor<double> ex2(g);
  ex2.set_input("c", std::vector<double>{2.0, -4.0});
  exec::adam a(0.01, 0.9, 0.999, 1e-8, 0.1, true);
  ex2.forward();
  ex2.backward();
  a.step(ex2);
  // First Adam step moves each weight by lr * sign(g) (bias-corrected), AdamW also by lr*wd*w.
  CHECK(ex2.value(w)[0] == Approx(1.0 - 0.01 * 0.1 - 0.01));
  CHECK(ex2.value(w)[1] == Approx(1.0 - 0.01 * 0.1 + 0.01));
}

TEST_CASE("clipping by the global norm") {
  const graph::graph g = linear_loss(2);
  exec::executor<double> ex(g);
  ex.set_input("c", std::vector<double>{3.0, 4.0});
  ex.forward();
  ex.backward();
  CHECK(exec::clip_grad_norm(ex, 1.0) == Approx(5.0));
  const auto grad = ex.grad(ex.parameter("w"));
  CHECK(grad[0] == Approx(0.6));
  CHECK(grad[1] == Approx(0.8));
  CHECK(exec::clip_grad_norm(ex, 10.0) == Approx(1.0)); // below the limit: unchanged
  CHECK(grad[0] == Approx(0.6));
}

TEST_CASE("an MLP learns a teacher's labels: loss after 50 steps <= 0.8 x the first") {
  constexpr std::size_t batch = 32;
  nn::tracer t(dtype::f32, batch);
  auto x = t.input<float, extents<hspmd::batch, 16>>("x");
  auto labels = t.input<std::int64_t, extents<hspmd::batch>>("labels");
  nn::sequential mlp(nn::linear<float, 16, 64>{"fc1"}, nn::relu_layer{},
                     nn::linear<float, 64, 4>{"fc2"});
  t.set_loss(nn::cross_entropy(mlp(t, x), labels));
  const graph::graph g = t.take();
  // The task: class = argmax of a fixed random projection of x (learnable by the MLP).
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0F, 1.0F);
  std::vector<float> teacher(16 * 4);
  for (auto& v : teacher)
    v = nd(rng);
  std::ostringstream log;
  train::train_options o;
  o.batch = batch;
  o.steps = 50;
  o.seed = 3;
  o.lr = train::lr_schedule::constant(0.01);
  o.clip = 5.0;
  o.out = &log;
  train::trainer<float> tr(g, o);
  const auto losses = tr.fit([&](exec::batch_sink<float>& e, std::size_t) {
                          std::vector<float> xs(batch * 16);
                          std::vector<std::int64_t> ys(batch);
                          for (auto& v : xs)
                            v = nd(rng);
                          for (std::size_t b = 0; b < batch; ++b) {
                            std::size_t best = 0;
                            float best_v = -1e30F;
                            for (std::size_t c = 0; c < 4; ++c) {
                              float s = 0;
                              for (std::size_t i = 0; i < 16; ++i)
                                s += xs[b * 16 + i] * teacher[i * 4 + c];
                              if (s > best_v) {
                                best_v = s;
                                best = c;
                              }
                            }
                            ys[b] = static_cast<std::int64_t>(best);
                          }
                          e.set_input("x", xs);
                          e.set_input("labels", ys);
                        }).losses;
  REQUIRE(losses.size() == 50);
  const double first = losses.front();
  const double last = (losses[47] + losses[48] + losses[49]) / 3.0;
  CAPTURE(first, last);
  CHECK(last <= 0.8 * first);
  CHECK_THAT(log.str(), Catch::Contains("step    50/50"));
  CHECK_THAT(log.str(), Catch::Contains("ETA"));
  CHECK_THAT(log.str(), Catch::Contains("samples/s"));
  // What runs the GEMMs, and utilisation against its measured rate.
  CHECK_THAT(log.str(), Catch::Contains("BLAS: ") && Catch::Contains("kernels "));
  CHECK_THAT(log.str(), Catch::Contains("  MFU "));
  CHECK_THAT(log.str(), Catch::Contains("GFLOP/s, MFU ") && Catch::Contains("GFLOP/s peak"));
}

TEST_CASE("the metrics file has model FLOP/s and MFU per step, written as it goes, and a resumed "
          "run appends") {
  constexpr std::size_t batch = 8;
  nn::tracer t(dtype::f32, batch);
  auto x = t.input<float, extents<hspmd::batch, 16>>("x");
  auto labels = t.input<std::int64_t, extents<hspmd::batch>>("labels");
  nn::sequential mlp(nn::linear<float, 16, 32>{"fc1"}, nn::relu_layer{},
                     nn::linear<float, 32, 4>{"fc2"});
  t.set_loss(nn::cross_entropy(mlp(t, x), labels));
  const graph::graph g = t.take();
  const auto cost = graph::total_cost(g);
  const std::string path = "training_test_metrics.jsonl";
  const std::filesystem::path ck = "training_test_metrics_checkpoints";
  std::filesystem::remove_all(ck);
  { // a file left by an earlier run: a run that does not resume starts a new one
    std::ofstream old(path);
    old << "{\"step\": 1, \"loss\": 0}\n";
  }
  train::train_options o;
  o.batch = batch;
  o.steps = 3;
  o.accumulate = 2;
  o.metrics = path;
  o.out = nullptr;
  o.save_every = 3;
  o.checkpoint_dir = ck.string();
  const auto feed = [&](exec::batch_sink<float>& e, std::size_t i) {
    std::vector<float> xs(batch * 16, 0.1F * static_cast<float>(i % 3));
    std::vector<std::int64_t> ys(batch, static_cast<std::int64_t>(i % 4));
    e.set_input("x", xs);
    e.set_input("labels", ys);
  };
  const auto lines = [&] {
    std::vector<nlohmann::json> v;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      v.push_back(nlohmann::json::parse(line));
    return v;
  };
  {
    train::trainer<float> tr(g, o);
    std::size_t lines_seen_in_step = 0;
    tr.on_step = [&](const train::step_report& r) { // the step's line is on disk already
      lines_seen_in_step = lines().size();
      CHECK(lines_seen_in_step == r.step + 2); // the start record, then a line a step
    };
    (void)tr.fit(feed);
    CHECK(lines_seen_in_step == 4);
  }
  auto v = lines();
  REQUIRE(v.size() == 4);
  CHECK(v[0].at("event") == "start");
  CHECK(v[0].at("ranks") == 1);
  CHECK(v[0].at("resumed_from").is_null());
  std::size_t steps = 0;
  for (const auto& j : v) {
    CHECK(j.at("t").get<double>() > 1.7e9); // wall-clock seconds
    if (!j.contains("step"))
      continue;
    ++steps;
    const double seconds = j.at("seconds").get<double>();
    REQUIRE(seconds > 0.0);
    // Model FLOPs of a step: forward and backward of both micro-batches.
    CHECK(j.at("model_flops_per_s").get<double>() * seconds ==
          Approx(2.0 * (cost.forward_flops + cost.backward_flops)).epsilon(1e-9));
    CHECK(j.at("mfu").get<double>() > 0.0);
  }
  CHECK(steps == 3);
  // Resumed, the run appends: its start record names the step, then steps 4 and 5.
  o.steps = 5;
  o.resume = true;
  {
    train::trainer<float> tr(g, o);
    (void)tr.fit(feed);
  }
  v = lines();
  REQUIRE(v.size() == 7);
  CHECK(v[4].at("event") == "start");
  CHECK(v[4].at("resumed_from") == 3);
  CHECK(v[4].at("load_ms").get<double>() >= 0.0);
  CHECK(v[5].at("step") == 4);
  CHECK(v[6].at("step") == 5);
  CHECK(v[6].at("t").get<double>() >= v[3].at("t").get<double>());
  std::remove(path.c_str());
  std::filesystem::remove_all(ck);
}

TEST_CASE("profiling: time per op kind, only for kinds that ran, and a table") {
  const graph::graph g = linear_loss(4096);
  exec::executor<double> ex(g);
  ex.set_input("c", std::vector<double>(4096, 1.0));
  ex.forward(); // not profiled
  CHECK(ex.profile().empty());
  ex.set_profiling(true);
  for (int s = 0; s < 3; ++s) {
    ex.forward();
    ex.backward();
  }
  const auto& p = ex.profile();
  REQUIRE(p.size() == graph::op_count);
  const auto at = [&](graph::op o) { return p[static_cast<std::size_t>(o)]; };
  CHECK(at(graph::op::mul).forward > 0.0);
  CHECK(at(graph::op::mul).backward > 0.0);
  CHECK(at(graph::op::sum).forward > 0.0);
  CHECK(at(graph::op::linear).forward == 0.0);
  CHECK(at(graph::op::softmax).backward == 0.0);

  std::ostringstream table;
  exec::write_profile(table, ex, 3);
  const auto text = table.str();
  CHECK(text.find("mul") != std::string::npos);
  CHECK(text.find("sum") != std::string::npos);
  CHECK(text.find("graph total") != std::string::npos);
  CHECK(text.find("softmax") == std::string::npos); // kinds that never ran are not listed

  ex.set_profiling(true); // restarting clears the totals
  CHECK(ex.profile()[static_cast<std::size_t>(graph::op::mul)].forward == 0.0);
}

TEST_CASE("learning-rate schedules: constant, and linear warm-up then cosine to the floor") {
  const auto c = train::lr_schedule::constant(0.1);
  CHECK(c.at(0, 10) == 0.1);
  CHECK(c.at(9, 10) == 0.1);
  const auto s = train::lr_schedule::cosine(1.0, 4, 0.1);
  CHECK(s.at(0, 20) == Approx(0.2)); // warm-up: 1/5, 2/5, ... of the peak
  CHECK(s.at(3, 20) == Approx(0.8));
  CHECK(s.at(4, 20) == Approx(1.0)); // the peak, then down
  CHECK(s.at(19, 20) == Approx(0.1));
  for (std::size_t i = 5; i < 20; ++i)
    CHECK(s.at(i, 20) < s.at(i - 1, 20));
  CHECK(s.at(12, 20) == Approx(0.1 + 0.45 * (1.0 + std::cos(std::numbers::pi * 8.0 / 15.0))));
}

namespace {
// A classifier of 5 features into 3 classes, batch bound by the tracer.
void small_classifier(nn::tracer& t) {
  auto x = t.input<double, extents<hspmd::batch, 5>>("x");
  auto y = t.input<std::int64_t, extents<hspmd::batch>>("y");
  auto h = nn::tanh(nn::linear<double, 5, 8>{"fc1"}(t, x));
  t.set_loss(nn::cross_entropy(nn::linear<double, 8, 3>{"fc2"}(t, h), y));
}
// Sample k of a fixed stream: feature values and a label that depends on them.
void sample(std::size_t k, std::vector<double>& x, std::vector<std::int64_t>& y) {
  std::mt19937_64 rng(k + 17);
  std::normal_distribution<double> nd(0.0, 1.0);
  double s = 0.0;
  for (int f = 0; f < 5; ++f) {
    x.push_back(nd(rng));
    s += x.back() * (f + 1);
  }
  y.push_back(s > 1.0 ? 2 : s > -1.0 ? 1 : 0);
}
exec::feed_fn<double> samples(std::size_t batch) {
  return [batch](exec::batch_sink<double>& b, std::size_t index) {
    std::vector<double> x;
    std::vector<std::int64_t> y;
    for (std::size_t k = 0; k < batch; ++k)
      sample(index * batch + k, x, y);
    b.set_input("x", x);
    b.set_input("y", y);
  };
}
} // namespace

TEST_CASE("gradient accumulation over 3 micro-batches of 2 equals batches of 6 (mean loss)") {
  train::train_options o = test_support::quiet_training(3, 0.05, 0.0);
  o.batch = 6;
  train::trainer<double, exec::sgd> whole(small_classifier, o);
  const auto a = whole.fit(samples(6));
  o.batch = 2;
  o.accumulate = 3;
  train::trainer<double, exec::sgd> micro(small_classifier, o);
  const auto b = micro.fit(samples(2));
  REQUIRE(a.losses.size() == 3);
  for (std::size_t s = 0; s < 3; ++s)
    CHECK(b.losses[s] == Approx(a.losses[s]).epsilon(1e-12));
  for (const char* p : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
    const auto wa = whole.local().value(whole.local().parameter(p));
    const auto wb = micro.local().value(micro.local().parameter(p));
    for (std::size_t i = 0; i < wa.size(); ++i)
      CHECK(wb[i] == Approx(wa[i]).epsilon(1e-12));
  }
  CHECK(a.losses[2] < a.losses[0]); // and it learns
}

TEST_CASE("the loss is the mean over rows by default, a sum on request") {
  std::vector<double> x;
  std::vector<std::int64_t> y;
  for (std::size_t k = 0; k < 7; ++k)
    sample(k, x, y);
  double loss[2] = {};
  for (const auto r : {nn::reduction::mean, nn::reduction::sum}) {
    nn::tracer t(dtype::f64, 7);
    auto xs = t.input<double, extents<hspmd::batch, 5>>("x");
    auto ys = t.input<std::int64_t, extents<hspmd::batch>>("y");
    t.set_loss(nn::cross_entropy(nn::linear<double, 5, 3>{"fc"}(t, xs), ys, r));
    const graph::graph g = t.take(); // the executor keeps a reference
    exec::executor<double> ex(g, 2);
    ex.set_input("x", x);
    ex.set_input("y", y);
    loss[r == nn::reduction::sum ? 1 : 0] = ex.forward();
  }
  CHECK(loss[0] == Approx(loss[1] / 7.0).epsilon(1e-14));
}

TEST_CASE("evaluation: loss without backward, accuracy of the arg-max, perplexity") {
  train::train_options o = test_support::quiet_training(2, 0.05, 1.0);
  o.batch = 4;
  o.eval_batches = 2;
  train::trainer<double> tr(small_classifier, o);
  std::vector<train::eval_report> seen;
  tr.on_eval = [&](const train::eval_report& r) { seen.push_back(r); };
  const auto before = tr.local().value(tr.local().parameter("fc1.weight"))[0];
  const auto r = tr.evaluate(samples(4), 2);
  CHECK(tr.local().value(tr.local().parameter("fc1.weight"))[0] == before); // no update
  REQUIRE(seen.size() == 1);
  CHECK(r.loss > 0.0);
  CHECK(r.accuracy >= 0.0);
  CHECK(r.accuracy <= 1.0);
  CHECK(r.accuracy * 8.0 == Approx(std::round(r.accuracy * 8.0))); // whole rows of 8
  CHECK(std::isnan(r.perplexity));
  o.metric = train::eval_metric::perplexity;
  train::trainer<double> lm(small_classifier, o);
  const auto p = lm.evaluate(samples(4), 2);
  CHECK(p.perplexity == Approx(std::exp(p.loss)));
  std::vector<train::step_report> steps;
  lm.on_step = [&](const train::step_report& s) { steps.push_back(s); };
  const auto fit = lm.fit(samples(4), samples(4));
  CHECK(steps.size() == 2);
  CHECK(fit.evals.size() == 1); // after the last step
}

TEST_CASE("bad options: one line naming the value and the fix") {
  CHECK_THROWS_WITH(
      nn::tracer(dtype::f32, 0),
      "batch 0: a training step needs at least one sample (give a batch of 1 or more)");
  train::train_options o = test_support::quiet_training(2, 0.05, 1.0);
  o.plan = "synth";
  CHECK_THROWS_WITH(train::trainer<double>(small_classifier, o),
                    "plan synth: needs a cluster (one process has no plan) (give a cluster file, "
                    "or drop it)");
  o.plan.clear();
  o.accumulate = 0;
  CHECK_THROWS_WITH(train::trainer<double>(small_classifier, o),
                    Catch::StartsWith("accumulate 0: lies outside [1, 1e+06]"));
  o.accumulate = 1;
  CHECK_THROWS_WITH(train::trainer<double>([](nn::tracer&) {}, o),
                    Catch::Contains("model function: set no loss"));
}

TEST_CASE("a 5:3 slowdown shows as 1.67x, not 1.66x") {
  CHECK(train::detail::times_text(5.0 / 3.0) == "1.67x");
  CHECK(train::detail::times_text(2.0) == "2x");
  CHECK(train::detail::duration_text(3725.0) == "1:02:05");
  CHECK(train::detail::duration_text(65.4) == "1:05");
}

namespace {
// Every gradient buffer the executor can name, filled with NaN (what another gradient's
// leftovers could be in a shared buffer).
template <class B>
void poison_gradients(exec::executor<float, B>& ex) {
  for (graph::node_id i = 0; i < ex.graph().size(); ++i)
    if (ex.graph()[i].type != dtype::i64)
      std::ranges::fill(ex.gradient_storage(i), std::numeric_limits<float>::quiet_NaN());
}
// Feeds every input of the executors' graph the same values drawn from `seed`: token ids below
// 40, floats in [-1, 1).
template <class... Ex>
void feed_random_inputs(const graph::graph& g, unsigned seed, Ex&... ex) {
  std::mt19937 rng(seed);
  for (graph::node_id i = 0; i < g.size(); ++i) {
    const graph::node& n = g[i];
    if (n.kind != graph::op::input)
      continue;
    if (n.type == dtype::i64) {
      std::vector<std::int64_t> ids(n.out.size());
      for (auto& id : ids)
        id = static_cast<std::int64_t>(rng() % 40);
      (ex.set_input(n.name, std::span<const std::int64_t>(ids)), ...);
    } else {
      std::vector<float> v(n.out.size());
      for (auto& e : v)
        e = static_cast<float>(rng() % 100) / 50.0F - 1.0F;
      (ex.set_input(n.name, std::span<const float>(v)), ...);
    }
  }
}
// BERT with 2 layers of hidden 32 (2 heads, FFN 64), sequence 8, vocabulary 40.
models::bert_config tiny_bert() {
  models::bert_config bc;
  bc.layers = 2;
  bc.hidden = 32;
  bc.heads = 2;
  bc.ffn = 64;
  bc.seq = 8;
  bc.vocab = 40;
  return bc;
}
} // namespace

TEST_CASE("gradients stored by their first writer read nothing their buffers held before") {
  // A backward stores (rather than adds) a gradient where it writes it first and whole (a
  // GEMM's beta 0, a kernel's `assign`), and such buffers are not zeroed. With every gradient
  // buffer filled with NaN between two identical steps, the second step's gradients must come
  // out bit-identical to the first's: any gradient added into instead of stored, or stored only
  // in part, would carry the NaN. BERT (dropout, layer norm, GELU, softmax, permutes, tied
  // position add), Llama (RMS norm, rotary, SwiGLU), a node read twice by one op, with and
  // without shared gradient buffers and recomputation.
  const models::bert_config bc = tiny_bert();
  models::llama_config lc;
  lc.layers = 2;
  lc.hidden = 32;
  lc.heads = 2;
  lc.ffn = 48;
  lc.seq = 8;
  lc.vocab = 40;
  nn::tracer t(dtype::f32, 3);
  const auto x = t.input<float, extents<dynamic_extent, dynamic_extent>>("x", 4, 6);
  const auto w =
      t.parameter<float>("w", extents<dynamic_extent, dynamic_extent>(6, 6), nn::normal_init(0.3));
  const auto h = nn::functional::matmul(x, w);
  t.set_loss(nn::functional::sum(nn::functional::add(
      nn::functional::mul(h, h), nn::functional::gelu(h)))); // h read twice by one mul
  const std::vector<std::pair<std::string, graph::graph>> graphs = {
      {"bert", models::trace_bert_lm<float>(bc, 2)},
      {"llama", models::trace_llama_lm<float>(lc, 2)},
      {"squares", t.take()}};
  for (const auto& [name, g] : graphs)
    for (const bool shared : {false, true}) {
      INFO(name << (shared ? ", shared gradient buffers and recomputation" : ""));
      exec::executor<float> ex(g, 5);
      if (shared) {
        ex.reuse_gradient_buffers();
        ex.recompute(exec::scope_segments(g));
      }
      feed_random_inputs(g, 11, ex);
      std::vector<std::vector<float>> first;
      const auto step = [&] {
        ex.set_step(1);
        (void)ex.forward();
        ex.backward();
        std::vector<std::vector<float>> out;
        for (graph::node_id p : g.parameters())
          out.emplace_back(std::as_const(ex).grad(p).begin(), std::as_const(ex).grad(p).end());
        return out;
      };
      first = step();
      std::size_t stored = 0;
      for (graph::node_id i = 0; i < g.size(); ++i)
        stored += ex.gradient_stored_whole(i) ? 1U : 0U;
      CHECK(stored > g.size() / 2); // most gradients are stored, not zeroed and added
      poison_gradients(ex);
      const auto second = step();
      REQUIRE(second.size() == first.size());
      for (std::size_t p = 0; p < first.size(); ++p) {
        INFO("parameter " << g[g.parameters()[p]].name);
        CHECK(std::ranges::all_of(second[p], [](float v) { return std::isfinite(v); }));
        CHECK(second[p] == first[p]);
      }
    }
}

TEST_CASE("a reshape that stores its input's gradient hands it its own gradient's memory") {
  // With shared gradient buffers, a reshape's input whose gradient the reshape stores whole takes
  // the reshape's gradient memory (the same elements in the same order), and the reshape's
  // backward, a copy, does not run. The gradients must be bit-identical to an executor's with
  // buffers of their own.
  const models::bert_config bc = tiny_bert();
  // A graph whose reshaped node has another user before the reshape: the reshape is its last
  // user, stores its gradient, and the other user's backward adds into the shared memory after.
  nn::tracer t(dtype::f32, 3);
  const auto x = t.input<float, extents<dynamic_extent, dynamic_extent>>("x", 4, 6);
  const auto w =
      t.parameter<float>("w", extents<dynamic_extent, dynamic_extent>(6, 6), nn::normal_init(0.3));
  const auto h = nn::functional::matmul(x, w);
  const auto early = nn::functional::sum(nn::functional::gelu(h));
  const auto flat = nn::functional::reshape(h, extents<dynamic_extent>(24));
  t.set_loss(nn::functional::add(early, nn::functional::sum(nn::functional::mul(flat, flat))));
  const std::vector<std::pair<std::string, graph::graph>> graphs = {
      {"bert", models::trace_bert_lm<float>(bc, 2)}, {"two users", t.take()}};
  for (const auto& [name, g] : graphs) {
    INFO(name);
    exec::executor<float> own(g, 5);
    exec::executor<float> shared(g, 5);
    shared.reuse_gradient_buffers();
    feed_random_inputs(g, 3, own, shared);
    for (auto* ex : {&own, &shared}) {
      ex->set_step(1);
      (void)ex->forward();
      ex->backward();
    }
    std::size_t in_place = 0;
    std::size_t reshapes = 0;
    for (graph::node_id i = 0; i < g.size(); ++i)
      if (g[i].kind == graph::op::reshape && g[i].type != dtype::i64) {
        ++reshapes;
        if (std::as_const(shared).grad(g[i].inputs[0]).data() ==
            std::as_const(shared).grad(i).data())
          ++in_place;
      }
    CHECK(reshapes > 0);
    CHECK(in_place == reshapes); // BERT: each layer's head splits and merge, the logits' flatten
    for (graph::node_id p : g.parameters()) {
      INFO("parameter " << g[p].name);
      const auto a = std::as_const(own).grad(p);
      const auto b = std::as_const(shared).grad(p);
      CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    }
  }
}

TEST_CASE("the progress line of a resumed run divides its own time by its own steps") {
  train::train_options o;
  o.name = "m";
  o.steps = 20;
  o.batch = 10;
  const train::flops_meter meter;
  std::ostringstream fresh;
  train::progress(fresh, o, meter, {4, 1.0, 1e-3, 1.0, 0.1}, 0.5); // 5 steps in 0.5 s
  CHECK(fresh.str().find(" 100.00 ms/step ") != std::string::npos);
  // Resumed after step 10: steps 11..15 took the 0.5 s (it used to say 33.33 ms/step).
  std::ostringstream resumed;
  train::progress(resumed, o, meter, {14, 1.0, 1e-3, 1.0, 0.1}, 0.5, 10);
  INFO(resumed.str());
  CHECK(resumed.str().find(" 100.00 ms/step ") != std::string::npos);
  CHECK(resumed.str().find("ETA 0:01") != std::string::npos); // 5 steps x 0.1 s, rounded
}
