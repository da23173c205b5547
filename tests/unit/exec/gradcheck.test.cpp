// Every op's backward against central finite differences in f64 (max relative error <= 1e-6),
// on every example call its registry entry lists, and forward values against hand-computed ones
// where they are easy to state.
#include "../../support/finite_difference.hpp"

#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/ops.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace hspmd;
using graph::op;

namespace {

struct builder {
  graph::graph g;
  std::vector<graph::node_id> float_inputs;
  std::vector<graph::node_id> positive_inputs;

  graph::node_id input(std::vector<std::size_t> dims, dtype t = dtype::f64, bool positive = false) {
    graph::node n;
    n.kind = op::input;
    n.name = "in" + std::to_string(g.size());
    n.out.dims = std::move(dims);
    n.type = t;
    const auto id = g.add(n);
    if (t != dtype::i64)
      float_inputs.push_back(id);
    if (positive)
      positive_inputs.push_back(id);
    return id;
  }
  graph::node_id add(op k, std::vector<graph::node_id> ins, graph::attributes a = {}) {
    graph::node n;
    n.kind = k;
    n.name = std::string(graph::name(k)) + std::to_string(g.size());
    n.inputs = std::move(ins);
    n.attrs = std::move(a);
    n.type = dtype::f64;
    n.out = graph::infer_shape(g, n);
    return g.add(n);
  }
  // loss = sum(node * R) with a random weight input R: a random output gradient (a scalar
  // node is made a vector of one first).
  void finish(graph::node_id out) {
    if (g[out].out.rank() == 0)
      out = add(op::reshape, {out}, graph::attributes{0.0, {1}, false});
    const auto r = input(g[out].out.dims);
    g.set_loss(add(op::sum, {add(op::mul, {out, r})}));
  }
};

// Fills float inputs with N(0,1) (shifted away from 0 for relu's kink), positive ones from
// (0.5, 1.5), ids with `id_limit`.
void feed(exec::executor<double>& ex, const builder& b, std::uint64_t seed, std::size_t id_limit) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (graph::node_id i = 0; i < b.g.size(); ++i) {
    const auto& n = b.g[i];
    if (n.kind != op::input)
      continue;
    if (n.type == dtype::i64) {
      std::vector<std::int64_t> ids(n.out.size());
      for (auto& v : ids)
        v = static_cast<std::int64_t>(rng() % id_limit);
      ex.set_input(n.name, ids);
    } else {
      const bool positive = std::ranges::find(b.positive_inputs, i) != b.positive_inputs.end();
      std::vector<double> v(n.out.size());
      for (auto& x : v) {
        x = positive ? 1.0 + std::uniform_real_distribution<double>(-0.5, 0.5)(rng) : nd(rng);
        if (std::abs(x) < 1e-3)
          x = 0.5;
      }
      ex.set_input(n.name, v);
    }
  }
}

// Max relative error of the analytic gradient of every float input against central differences.
double gradcheck(const builder& b, std::size_t id_limit = 4) {
  exec::executor<double> ex(b.g, 1);
  feed(ex, b, 7, id_limit);
  ex.forward();
  ex.backward();
  return test_support::worst_gradient_error(ex, b.float_inputs);
}

} // namespace

TEST_CASE("gradients of every op match central differences (f64, rel. error <= 1e-6)") {
  struct check {
    std::string name;
    builder b;
    std::size_t ids = 4;
  };
  std::vector<check> checks;
  const auto make = [&](const std::string& name, auto&& build, std::size_t ids = 4) {
    check c{name, {}, ids};
    c.b.finish(build(c.b));
    checks.push_back(std::move(c));
  };
  // Every example call of every op in the registry.
  for (std::size_t k = 0; k < graph::op_count; ++k) {
    const auto o = static_cast<op>(k);
    const auto examples = graph::examples(o);
    if (graph::arity(o) == 0)
      continue; // inputs and parameters compute nothing
    CAPTURE(graph::name(o));
    CHECK_FALSE(examples.empty()); // an op without an example call is never checked
    for (const auto& e : examples)
      make(
          std::string(graph::name(o)) + (e.label.empty() ? "" : " " + e.label),
          [&](builder& b) {
            std::vector<graph::node_id> ins;
            for (const auto& in : e.inputs)
              ins.push_back(b.input(in.dims, in.type, in.positive));
            return b.add(o, ins, e.attrs);
          },
          e.id_limit);
  }
  // Composites: a gradient flowing through routing twice, and a node used more than once.
  for (const std::size_t capacity : {4UL, 2UL}) // 2: some choices overflow and are dropped
    make("moe dispatch+combine, capacity " + std::to_string(capacity), [capacity](builder& b) {
      const auto x = b.input({5, 3});
      const auto probs = b.add(op::softmax, {b.input({5, 4})});
      const auto buffers =
          b.add(op::moe_dispatch, {x, probs}, graph::attributes{0.0, {capacity}, false});
      const auto w = b.input({4, capacity, 3}); // a stand-in for the experts: scale elementwise
      return b.add(op::moe_combine, {b.add(op::mul, {buffers, w}), probs});
    });
  // Attention's layout changes: permutes next to batched matmuls, read and written by strides.
  make("permutes around batched matmuls (strided)", [](builder& b) {
    const graph::attributes swap{0.0, {0, 2, 1, 3}, false};
    const auto q = b.add(op::permute, {b.input({2, 3, 2, 4})}, swap);
    const auto k = b.add(op::permute, {b.input({2, 3, 2, 4})}, swap);
    const auto v = b.add(op::permute, {b.input({2, 3, 2, 5})}, swap);
    const auto s = b.add(op::batched_matmul, {q, k}, graph::attributes{0.0, {}, true});
    const auto c = b.add(op::batched_matmul, {b.add(op::softmax, {s}), v});
    return b.add(op::permute, {c}, swap);
  });
  make("fan-out: x*x + x", [](builder& b) {
    const auto x = b.input({3, 3});
    return b.add(op::add, {b.add(op::mul, {x, x}), x});
  });
  CHECK(checks.size() >= 40);
  for (auto& c : checks) {
    CAPTURE(c.name);
    CHECK(gradcheck(c.b, c.ids) <= 1e-6);
  }
}

TEST_CASE("forward values of the nonlinear ops") {
  builder b;
  const auto x = b.input({1, 3});
  const auto s = b.add(op::softmax, {x});
  const auto ls = b.add(op::log_softmax, {x});
  const auto ge = b.add(op::gelu, {x});
  const auto si = b.add(op::silu, {x});
  const auto sw = b.add(op::swiglu, {x, ge});
  b.g.set_loss(b.add(op::sum, {s}));
  exec::executor<double> ex(b.g);
  ex.set_input("in0", std::vector<double>{1.0, 2.0, 3.0});
  ex.forward();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  CHECK(ex.value(s)[2] == Approx(std::exp(3.0) / z));
  CHECK(ex.value(ls)[0] == Approx(1.0 - std::log(z)));
  CHECK(ex.value(ge)[0] == Approx(1.0 * 0.5 * (1 + std::erf(1.0 / std::sqrt(2.0)))));
  CHECK(ex.value(si)[2] == Approx(3.0 / (1.0 + std::exp(-3.0))));
  CHECK(ex.value(sw)[1] == Approx(2.0 / (1.0 + std::exp(-2.0)) * ex.value(ge)[1]));
  CHECK(ex.forward() == Approx(1.0));
}

TEST_CASE("a reshape reads its input where it lies, its gradient is a buffer of its own") {
  builder b;
  const auto x = b.input({2, 3});
  const auto r = b.add(op::reshape, {x}, graph::attributes{0.0, {3, 2}, false});
  const auto sq = b.add(op::mul, {r, r});
  b.g.set_loss(b.add(op::sum, {sq}));
  exec::executor<double> ex(b.g);
  ex.set_input("in0", std::vector<double>{1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
  CHECK(ex.forward() == Approx(91.0));
  CHECK(ex.value(r).data() == ex.value(x).data()); // no copy
  CHECK(ex.value(r).size() == 6);
  ex.set_input("in0", std::vector<double>{0.0, 1.0, 0.0, 1.0, 0.0, 2.0});
  CHECK(ex.forward() == Approx(6.0)); // the view follows its input
  ex.backward();
  CHECK(ex.grad(r).data() != ex.grad(x).data());
  const std::vector<double> dx(ex.grad(x).begin(), ex.grad(x).end());
  CHECK(dx == std::vector<double>{0.0, 2.0, 0.0, 2.0, 0.0, 4.0});
}

TEST_CASE("permutes next to batched matmuls are read and written by strides, not copied") {
  // Q K^T and P V over (2 samples, 2 heads) from (B, S, heads, d) projections, the product
  // permuted back: the permutes that only products read, and the product only a permute reads,
  // lie with dimensions 1 and 2 exchanged. The same graph with a second reader of each (times
  // 0, so the loss is the same) copies instead: values and gradients must agree.
  const graph::attributes swap{0.0, {0, 2, 1, 3}, false};
  struct built {
    builder b;
    graph::node_id q, k, v, s, c, out;
  };
  const auto build = [&](bool copied) {
    built r;
    builder& b = r.b;
    const auto xq = b.input({2, 3, 2, 4});
    const auto xk = b.input({2, 3, 2, 4});
    const auto xv = b.input({2, 3, 2, 5});
    r.q = b.add(op::permute, {xq}, swap);
    r.k = b.add(op::permute, {xk}, swap);
    r.v = b.add(op::permute, {xv}, swap);
    r.s = b.add(op::batched_matmul, {r.q, r.k}, graph::attributes{0.0, {}, true});
    r.c = b.add(op::batched_matmul, {b.add(op::softmax, {r.s}), r.v});
    r.out = b.add(op::permute, {r.c}, swap);
    auto loss = b.add(op::sum, {b.add(op::mul, {r.out, b.input({2, 3, 2, 5})})});
    if (copied)
      for (graph::node_id x : {r.q, r.k, r.v, r.c})
        loss = b.add(
            op::add,
            {loss, b.add(op::sum, {b.add(op::scale, {x}, graph::attributes{0.0, {}, false})})});
    b.g.set_loss(loss);
    return r;
  };
  const built strided = build(false);
  const built copied = build(true);
  exec::executor<double> a(strided.b.g, 1);
  exec::executor<double> e(copied.b.g, 1);
  for (graph::node_id i : {strided.q, strided.k, strided.v, strided.c}) {
    CHECK(a.swapped(i));
    CHECK_FALSE(e.swapped(i));
  }
  CHECK_FALSE(a.swapped(strided.s)); // (read by the softmax)
  CHECK_FALSE(a.swapped(strided.out));
  feed(a, strided.b, 3, 4);
  feed(e, copied.b, 3, 4);
  CHECK(a.forward() == Approx(e.forward()).epsilon(1e-12));
  CHECK(a.value(strided.out).data() == a.value_storage(strided.c).data()); // no copy
  const std::vector<double> ya(a.value(strided.out).begin(), a.value(strided.out).end());
  const std::vector<double> ye(e.value(copied.out).begin(), e.value(copied.out).end());
  REQUIRE(ya.size() == ye.size());
  for (std::size_t i = 0; i < ya.size(); ++i)
    CHECK(ya[i] == Approx(ye[i]).epsilon(1e-12));
  a.backward();
  e.backward();
  for (std::size_t in = 0; in < 3; ++in) {
    const auto ga = a.grad(strided.b.float_inputs[in]);
    const auto ge = e.grad(copied.b.float_inputs[in]);
    REQUIRE(ga.size() == ge.size());
    for (std::size_t i = 0; i < ga.size(); ++i)
      CHECK(ga[i] == Approx(ge[i]).epsilon(1e-12).margin(1e-14));
  }
  CHECK_THROWS_WITH(a.value(strided.q), Catch::Contains("dimensions 1 and 2 exchanged"));
}

TEST_CASE("rms_norm forward values by hand") {
  builder b;
  const auto x = b.input({2, 3});
  const auto w = b.input({3});
  graph::attributes a;
  a.scalar = 1e-6;
  const auto y = b.add(op::rms_norm, {x, w}, a);
  b.g.set_loss(b.add(op::sum, {y}));
  exec::executor<double> ex(b.g);
  ex.set_input("in0", std::vector<double>{1, 2, 3, -2, 0, 2});
  ex.set_input("in1", std::vector<double>{1, 1, 2});
  ex.forward();
  const double r0 = std::sqrt(14.0 / 3 + 1e-6);
  const double r1 = std::sqrt(8.0 / 3 + 1e-6);
  CHECK(ex.value(y)[2] == Approx(3 / r0 * 2));
  CHECK(ex.value(y)[3] == Approx(-2 / r1));
  CHECK(ex.value(y)[4] == 0.0);
}

TEST_CASE("rotary embedding forward values by hand, a sequence piece rotates by global positions") {
  builder b;
  const auto x = b.input({1, 3, 1, 4}); // (B, S, heads, d)
  graph::attributes a;
  a.scalar = 100.0;
  const auto y = b.add(op::rotary, {x}, a);
  b.g.set_loss(b.add(op::sum, {y}));
  exec::executor<double> ex(b.g);
  ex.set_input("in0", std::vector<double>{1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 4});
  ex.forward();
  const auto v = ex.value(y);
  // Position 0: unchanged. Position 1, pair 0: angle 1; pair 1: angle 100^(-1/2) = 0.1.
  CHECK(v[0] == 1.0);
  CHECK(v[4] == Approx(std::cos(1.0)));
  CHECK(v[5] == Approx(std::sin(1.0)));
  CHECK(v[6] == Approx(std::cos(0.1)));
  CHECK(v[7] == Approx(std::sin(0.1)));
  // Position 2, pair 1 (3, 4) by 0.2.
  CHECK(v[10] == Approx(3 * std::cos(0.2) - 4 * std::sin(0.2)));
  CHECK(v[11] == Approx(3 * std::sin(0.2) + 4 * std::cos(0.2)));
  // The same node as rank 1's piece (positions 1 .. 2 of 3) gives the whole tensor's rows.
  builder piece;
  const auto px = piece.input({1, 2, 1, 4});
  const auto py = piece.add(op::rotary, {px}, a);
  piece.g.set_loss(piece.add(op::sum, {py}));
  std::vector<program::node_layout> layouts(piece.g.size());
  for (graph::node_id i = 0; i < piece.g.size(); ++i)
    layouts[i].global = piece.g[i].out.dims;
  layouts[py] = {{1, 3, 1, 4}, 1, 1, 2};
  exec::executor<double> part(piece.g, 0, layouts);
  part.set_input("in0", std::vector<double>{1, 0, 1, 0, 1, 2, 3, 4});
  part.forward();
  for (std::size_t i = 0; i < 8; ++i)
    CHECK(part.value(py)[i] == Approx(v[4 + i]));
}

TEST_CASE("dropout: masks by (seed, step, node, index), causal softmax hides later keys") {
  builder b;
  const auto x = b.input({1000});
  graph::attributes a;
  a.scalar = 0.25;
  const auto d = b.add(op::dropout, {x}, a);
  graph::attributes causal;
  causal.flag = true;
  const auto s = b.add(op::softmax, {b.input({3, 3})}, causal);
  b.g.set_loss(b.add(op::sum, {d}));
  exec::executor<double> ex(b.g, 5);
  ex.set_input("in0", std::vector<double>(1000, 1.0));
  ex.set_input("in2", std::vector<double>(9, 0.0));
  ex.forward();
  const std::vector<double> first(ex.value(d).begin(), ex.value(d).end());
  std::size_t dropped = 0;
  for (double v : first) {
    CHECK((v == 0.0 || v == Approx(1.0 / 0.75)));
    dropped += v == 0.0 ? 1U : 0U;
  }
  CHECK(dropped > 200); // ~250 of 1000
  CHECK(dropped < 300);
  ex.forward();
  CHECK(std::vector<double>(ex.value(d).begin(), ex.value(d).end()) == first); // same step
  ex.set_step(1);
  ex.forward();
  CHECK(std::vector<double>(ex.value(d).begin(), ex.value(d).end()) != first);
  ex.set_training(false);
  ex.forward();
  CHECK(ex.value(d)[0] == 1.0);
  // Row i of a causal softmax over equal scores spreads 1 evenly over keys 0 .. i.
  CHECK(ex.value(s)[0] == 1.0);
  CHECK(ex.value(s)[1] == 0.0);
  CHECK(ex.value(s)[3] == Approx(0.5));
  CHECK(ex.value(s)[8] == Approx(1.0 / 3));
}

TEST_CASE("conv2d and pooling forward values by hand") {
  builder b;
  const auto x = b.input({1, 1, 3, 3});
  const auto w = b.input({1, 1, 2, 2});
  const auto bias = b.input({1});
  const auto y = b.add(op::conv2d, {x, w, bias}, graph::attributes{0.0, {1, 0}, false});
  const auto p = b.add(op::max_pool2d, {x}, graph::attributes{0.0, {2, 1}, false});
  const auto a = b.add(op::adaptive_avg_pool2d, {x}, graph::attributes{0.0, {1, 1}, false});
  b.g.set_loss(b.add(op::sum, {y}));
  exec::executor<double> ex(b.g);
  ex.set_input("in0", std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  ex.set_input("in1", std::vector<double>{1, 0, 0, -1}); // x[i][j] - x[i+1][j+1]
  ex.set_input("in2", std::vector<double>{0.5});
  ex.forward();
  for (double v : ex.value(y))
    CHECK(v == Approx(-4 + 0.5));
  CHECK(std::vector<double>(ex.value(p).begin(), ex.value(p).end()) ==
        std::vector<double>{5, 6, 8, 9});
  CHECK(ex.value(a)[0] == Approx(5.0));
}

TEST_CASE("bad data is refused with the node and the range") {
  builder b;
  const auto e = b.add(op::embedding, {b.input({5, 2}), b.input({3}, dtype::i64)});
  b.g.set_loss(b.add(op::sum, {e}));
  exec::executor<double> ex(b.g);
  ex.set_input("in1", std::vector<std::int64_t>{0, 9, 1});
  CHECK_THROWS_WITH(ex.forward(), Catch::Contains("token id 9 is out of range [0, 5)"));
  CHECK_THROWS_AS(ex.set_input("in1", std::vector<std::int64_t>{0, 1}), shape_error);
  CHECK_THROWS_AS(ex.set_input("nope", std::vector<double>{1.0}), plan_error);
}

namespace {
// Fused attention of q (2, 2, S, 4), k and v (2, 2, T, 4 | 3) with loss sum(out * R), or the
// same through products and a softmax; every input set from `x`. Returns the output and the
// gradients of q, k and v.
struct attention_run {
  std::vector<double> out, dq, dk, dv;
};
attention_run run_attention(bool fused, bool causal, std::size_t s, std::size_t t,
                            const std::vector<std::vector<double>>& x,
                            const program::node_layout* piece = nullptr, std::size_t whole_s = 0) {
  builder b;
  const auto q = b.input({2, 2, s, 4});
  const auto k = b.input({2, 2, t, 4});
  const auto v = b.input({2, 2, t, 3});
  graph::attributes a;
  a.scalar = 0.4;
  a.flag = causal;
  graph::node_id out = 0;
  if (fused && piece != nullptr) { // a rank's piece, as lowering makes it (no whole-shape check)
    graph::node n;
    n.kind = op::attention;
    n.name = "attention";
    n.inputs = {q, k, v};
    n.attrs = a;
    n.type = dtype::f64;
    n.out.dims = {2, 2, s, 3};
    out = b.g.add(n);
  } else if (fused) {
    out = b.add(op::attention, {q, k, v}, a);
  } else {
    graph::attributes transposed;
    transposed.flag = true;
    graph::attributes scale;
    scale.scalar = 0.4;
    graph::attributes mask;
    mask.flag = causal;
    const auto scores = b.add(op::scale, {b.add(op::batched_matmul, {q, k}, transposed)}, scale);
    out = b.add(op::batched_matmul, {b.add(op::softmax, {scores}, mask), v});
  }
  const auto r = b.input(b.g[out].out.dims);
  b.g.set_loss(b.add(op::sum, {b.add(op::mul, {out, r})}));
  std::vector<program::node_layout> layouts;
  if (piece != nullptr) {
    layouts.resize(b.g.size());
    for (graph::node_id i = 0; i < b.g.size(); ++i)
      layouts[i].global = b.g[i].out.dims;
    layouts[out] = *piece;
    layouts[out].global = {2, 2, whole_s, 3};
  }
  exec::executor<double> ex(b.g, 0, layouts);
  for (std::size_t i = 0; i < 4; ++i)
    ex.set_input(b.g[i == 3 ? r : static_cast<graph::node_id>(i)].name, x[i]);
  ex.forward();
  ex.backward();
  const auto host = [](std::span<const double> y) {
    return std::vector<double>(y.begin(), y.end());
  };
  return {host(ex.value(out)), host(ex.grad(q)), host(ex.grad(k)), host(ex.grad(v))};
}
std::vector<double> normal(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> d;
  std::vector<double> v(n);
  for (auto& e : v)
    e = d(rng);
  return v;
}
double worst(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double w = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::abs(a[i] - b[i]));
  return w;
}
} // namespace

TEST_CASE("fused attention equals products and a softmax, causal or not, a query piece masks "
          "by global positions and its key gradients sum to the whole's") {
  std::mt19937_64 rng(11);
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    const std::size_t s = 5;
    const std::size_t t = causal ? 5 : 7;
    const std::vector<std::vector<double>> x = {normal(16 * s, rng), normal(16 * t, rng),
                                                normal(12 * t, rng), normal(12 * s, rng)};
    const auto fused = run_attention(true, causal, s, t, x);
    const auto plain = run_attention(false, causal, s, t, x);
    CHECK(worst(fused.out, plain.out) <= 1e-12);
    CHECK(worst(fused.dq, plain.dq) <= 1e-12);
    CHECK(worst(fused.dk, plain.dk) <= 1e-12);
    CHECK(worst(fused.dv, plain.dv) <= 1e-12);
    // Queries 0..1 and 2..4 as two ranks' pieces (k and v whole on both).
    const auto rows = [&](const std::vector<double>& whole, std::size_t from, std::size_t n,
                          std::size_t width) {
      std::vector<double> p;
      for (std::size_t b = 0; b < 4; ++b)
        for (std::size_t i = from; i < from + n; ++i)
          for (std::size_t c = 0; c < width; ++c)
            p.push_back(whole[(b * s + i) * width + c]);
      return p;
    };
    std::vector<double> dk(fused.dk.size(), 0.0);
    std::vector<double> dv(fused.dv.size(), 0.0);
    for (const auto& [from, n] : {std::pair<std::size_t, std::size_t>{0, 2}, {2, 3}}) {
      CAPTURE(from);
      program::node_layout l;
      l.split = 2;
      l.offset = from;
      l.length = n;
      const auto part = run_attention(
          true, causal, n, t, {rows(x[0], from, n, 4), x[1], x[2], rows(x[3], from, n, 3)}, &l, s);
      CHECK(worst(part.out, rows(fused.out, from, n, 3)) <= 1e-12);
      CHECK(worst(part.dq, rows(fused.dq, from, n, 4)) <= 1e-12);
      for (std::size_t i = 0; i < dk.size(); ++i)
        dk[i] += part.dk[i];
      for (std::size_t i = 0; i < dv.size(); ++i)
        dv[i] += part.dv[i];
    }
    CHECK(worst(dk, fused.dk) <= 1e-12);
    CHECK(worst(dv, fused.dv) <= 1e-12);
  }
}

TEST_CASE("fused attention keeps no scores: its FLOPs count only the pairs a causal mask lets "
          "through, and a bad call names the node") {
  builder b;
  const auto q = b.input({2, 3, 8, 4});
  graph::attributes a;
  a.scalar = 0.5;
  a.flag = true;
  const auto y = b.add(op::attention, {q, b.input({2, 3, 8, 4}), b.input({2, 3, 8, 6})}, a);
  CHECK(b.g[y].out.dims == std::vector<std::size_t>{2, 3, 8, 6});
  const graph::node_cost c = graph::cost_of(b.g, y);
  CHECK(c.forward_flops == 6.0 * 36.0 * (2 * 4 + 2 * 6 + 4)); // 6 rows, 8 * 9 / 2 pairs each
  a.flag = false;
  const auto full = b.add(op::attention, {q, b.input({2, 3, 8, 4}), b.input({2, 3, 8, 6})}, a);
  CHECK(graph::cost_of(b.g, full).forward_flops == 6.0 * 64.0 * (2 * 4 + 2 * 6 + 4));
  a.flag = true;
  CHECK_THROWS_WITH(b.add(op::attention, {q, b.input({2, 3, 5, 4}), b.input({2, 3, 5, 6})}, a),
                    Catch::Contains("as many keys as queries"));
  CHECK_THROWS_WITH(b.add(op::attention, {q, b.input({2, 3, 8, 5}), b.input({2, 3, 8, 6})}, a),
                    Catch::Contains("q (b..., S, d)"));
}

namespace {
// Fused attention of q (2, 4, S, 4) over k (2, hk, S, 4) and v (2, hk, S, 3), causal, with loss
// sum(out * R): the output and the gradients of q, k and v.
attention_run run_grouped(std::size_t hk, const std::vector<std::vector<double>>& x) {
  constexpr std::size_t s = 5;
  builder b;
  const auto q = b.input({2, 4, s, 4});
  const auto k = b.input({2, hk, s, 4});
  const auto v = b.input({2, hk, s, 3});
  graph::attributes a;
  a.scalar = 0.4;
  a.flag = true;
  const auto out = b.add(op::attention, {q, k, v}, a);
  const auto r = b.input(b.g[out].out.dims);
  b.g.set_loss(b.add(op::sum, {b.add(op::mul, {out, r})}));
  exec::executor<double> ex(b.g);
  for (const graph::node_id i : {q, k, v, r})
    ex.set_input(b.g[i].name, x[i == r ? 3 : i]);
  ex.forward();
  ex.backward();
  const auto host = [](std::span<const double> y) {
    return std::vector<double>(y.begin(), y.end());
  };
  return {host(ex.value(out)), host(ex.grad(q)), host(ex.grad(k)), host(ex.grad(v))};
}
// Heads of (2, hk, S, w) repeated `times` each (head h of the result is head h / times), as
// Hugging Face's repeat_kv lays them out.
std::vector<double> repeat_heads(const std::vector<double>& x, std::size_t hk, std::size_t times,
                                 std::size_t block) {
  std::vector<double> out;
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < hk * times; ++h) {
      const auto from = x.begin() + static_cast<std::ptrdiff_t>((b * hk + h / times) * block);
      out.insert(out.end(), from, from + static_cast<std::ptrdiff_t>(block));
    }
  return out;
}
} // namespace

TEST_CASE("grouped-query attention equals attention over repeated key/value heads, and each "
          "key/value head's gradient sums its group's") {
  std::mt19937_64 rng(5);
  constexpr std::size_t s = 5;
  const std::vector<std::vector<double>> x = {
      normal(2 * 4 * s * 4, rng), normal(2 * 2 * s * 4, rng), normal(2 * 2 * s * 3, rng),
      normal(2 * 4 * s * 3, rng)};
  const auto grouped = run_grouped(2, x);
  const auto full = run_grouped(
      4, {x[0], repeat_heads(x[1], 2, 2, s * 4), repeat_heads(x[2], 2, 2, s * 3), x[3]});
  CHECK(worst(grouped.out, full.out) <= 1e-12);
  CHECK(worst(grouped.dq, full.dq) <= 1e-12);
  // dk of key/value head j = the repeated heads 2j and 2j + 1's gradients summed.
  const auto summed = [&](const std::vector<double>& rep, std::size_t block) {
    std::vector<double> out(2 * 2 * block, 0.0);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t i = 0; i < block; ++i)
          out[(b * 2 + h / 2) * block + i] += rep[(b * 4 + h) * block + i];
    return out;
  };
  CHECK(worst(grouped.dk, summed(full.dk, s * 4)) <= 1e-12);
  CHECK(worst(grouped.dv, summed(full.dv, s * 3)) <= 1e-12);
  // One key/value head for all four query heads.
  const std::vector<double> k1(x[1].begin(), x[1].begin() + 2 * s * 4);
  const std::vector<double> v1(x[2].begin(), x[2].begin() + 2 * s * 3);
  const auto one = run_grouped(1, {x[0], k1, v1, x[3]});
  const auto one_full =
      run_grouped(4, {x[0], repeat_heads(k1, 1, 4, s * 4), repeat_heads(v1, 1, 4, s * 3), x[3]});
  CHECK(worst(one.out, one_full.out) <= 1e-12);
  CHECK(worst(one.dq, one_full.dq) <= 1e-12);
  // A key/value head count that does not divide the query heads is refused.
  builder b;
  graph::attributes a;
  a.scalar = 0.5;
  CHECK_THROWS_WITH(b.add(op::attention,
                          {b.input({2, 4, s, 4}), b.input({2, 3, s, 4}), b.input({2, 3, s, 3})}, a),
                    Catch::Contains("fewer heads"));
}
