#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/nn/layers.hpp>

#include <catch2/catch.hpp>

#include <set>
#include <sstream>

using namespace hspmd;

namespace {
// A small traced model to count: (B, S, H) -> linear -> layer norm -> gelu -> logits -> CE.
graph::graph traced(std::size_t batch) {
  nn::tracer t(dtype::f32, batch);
  auto x = t.input<float, extents<hspmd::batch, 16, 32>>("x");
  auto labels = t.input<std::int64_t, extents<dynamic_extent>>("labels", batch * 16);
  nn::linear<float, 32, 64> fc{"fc"};
  nn::layer_norm<float, 64> ln{"ln"};
  nn::linear<float, 64, 10> head{"head"};
  auto h = nn::gelu(ln(t, fc(t, x)));                                             // (B, 16, 64)
  auto logits = nn::reshape(head(t, h), extents<dynamic_extent, 10>(batch * 16)); // (B*16, 10)
  t.set_loss(nn::cross_entropy(logits, labels));
  return t.take();
}
} // namespace

TEST_CASE("FLOP counts per op follow the hand-derived formulas") {
  const std::size_t b = 4;
  const graph::graph g = traced(b);
  const double rows = static_cast<double>(b * 16);
  const auto cost = [&](std::string_view op_name) {
    for (graph::node_id i = 0; i < g.size(); ++i)
      if (graph::name(g[i].kind) == op_name)
        return graph::cost_of(g, i);
    FAIL("no node of kind " << op_name);
    return graph::node_cost{};
  };
  // fc: (64 rows of 32) x (32, 64) + bias: forward 2*m*k*n + m*n; backward 4*m*k*n + m*n.
  REQUIRE(g.find("fc.linear4").has_value()); // op nodes are named by scope, op and index
  const auto fc = graph::cost_of(g, *g.find("fc.linear4"));
  CHECK(fc.forward_flops == 2 * rows * 32 * 64 + rows * 64);
  CHECK(fc.backward_flops == 4 * rows * 32 * 64 + rows * 64);
  CHECK(fc.forward_bytes == 4.0 * (rows * 32 + 32 * 64 + 64 + rows * 64));
  CHECK(cost("layer_norm").forward_flops == 8 * rows * 64);
  CHECK(cost("layer_norm").backward_flops == 15 * rows * 64);
  CHECK(cost("gelu").forward_flops == 6 * rows * 64);
  CHECK(cost("cross_entropy").forward_flops == 5 * rows * 10 + rows);
  CHECK(cost("cross_entropy").backward_flops == 3 * rows * 10);
  CHECK(cost("reshape").forward_flops == 0);
  const auto total = graph::total_cost(g);
  CHECK(total.forward_flops > fc.forward_flops);
}

TEST_CASE("batched matmul, embedding and elementwise counts") {
  nn::tracer t(dtype::f64, 2);
  auto q = t.input<double, extents<hspmd::batch, 4, 8, 16>>("q"); // (B, heads, S, d)
  auto k = t.input<double, extents<hspmd::batch, 4, 8, 16>>("k");
  graph::attributes a;
  a.flag = true; // q k^T
  const auto scores = t.op(graph::op::batched_matmul, {q.id(), k.id()}, a);
  const auto ids = t.input<std::int64_t, extents<hspmd::batch, 8>>("ids");
  nn::embedding<double, 100, 16> emb{"emb"};
  auto e = emb(t, ids);
  auto s = nn::add(e, e);
  const graph::graph& g = t.graph();
  // (2*4) batches of (8 x 16) x (16 x 8): 2 * b * m * k * n forward, twice that backward.
  CHECK(graph::cost_of(g, scores).forward_flops == 2.0 * 8 * 8 * 16 * 8);
  CHECK(graph::cost_of(g, scores).backward_flops == 4.0 * 8 * 8 * 16 * 8);
  CHECK(graph::cost_of(g, e.id()).forward_flops == 0);
  CHECK(graph::cost_of(g, e.id()).backward_flops == 2.0 * 8 * 16);
  CHECK(graph::cost_of(g, s.id()).forward_flops == 2.0 * 8 * 16);
  CHECK(g[scores].out.to_string() == "(batch=2, 4, 8, 8)");
}

TEST_CASE("graphs print themselves and round-trip through JSON with shapes re-checked") {
  const graph::graph g = traced(3);
  std::ostringstream os;
  graph::print(os, g);
  CHECK_THAT(os.str(), Catch::Contains("fc.weight"));
  CHECK_THAT(os.str(), Catch::Contains("<- loss"));
  CHECK_THAT(os.str(), Catch::Contains("(batch=3, 16, 64)"));
  const auto j = graph::to_json(g);
  CHECK(graph::from_json(j) == g);
  auto tampered = j;
  tampered["nodes"][4]["shape"] = {3, 16, 65};
  CHECK_THROWS_WITH(graph::from_json(tampered, "m.json"),
                    Catch::Contains("m.json: nodes[4]: recorded shape (batch=3, 16, 65) but the op "
                                    "gives (batch=3, 16, 64)"));
  auto unknown = j;
  unknown["nodes"][5]["op"] = "convolve";
  CHECK_THROWS_WITH(graph::from_json(unknown, "m.json"),
                    Catch::StartsWith("m.json: field nodes[5].op: unknown op \"convolve\""));
}

TEST_CASE("conv2d and pooling counts: the kernel size counts") {
  graph::graph g;
  const auto add_input = [&](std::vector<std::size_t> dims) {
    graph::node n;
    n.kind = graph::op::input;
    n.name = "in" + std::to_string(g.size());
    n.out.dims = std::move(dims);
    return g.add(n);
  };
  const auto x = add_input({2, 3, 5, 6});
  const auto w = add_input({4, 3, 3, 2});
  const auto b = add_input({4});
  graph::node conv;
  conv.kind = graph::op::conv2d;
  conv.name = "conv";
  conv.inputs = {x, w, b};
  conv.attrs.dims = {1, 0};
  conv.out = graph::infer_shape(g, conv);
  CHECK(conv.out.dims == std::vector<std::size_t>{2, 4, 3, 5});
  const auto c = g.add(conv);
  // 120 outputs, each a dot product of C R S = 18 terms: 2 * 120 * 18 + 120 (bias).
  CHECK(graph::cost_of(g, c).forward_flops == 2.0 * 120 * 18 + 120);
  CHECK(graph::cost_of(g, c).backward_flops == 4.0 * 120 * 18 + 120);
  graph::node pool;
  pool.kind = graph::op::max_pool2d;
  pool.name = "pool";
  pool.inputs = {c};
  pool.attrs.dims = {2, 2};
  pool.out = graph::infer_shape(g, pool);
  CHECK(pool.out.dims == std::vector<std::size_t>{2, 4, 1, 2});
  const auto p = g.add(pool);
  CHECK(graph::cost_of(g, p).forward_flops == 16.0 * 3); // 16 outputs, 3 comparisons each
  graph::node bad = conv;
  bad.inputs = {x, b, b};
  CHECK_THROWS_WITH(graph::infer_shape(g, bad), Catch::Contains("cannot convolve"));
}

TEST_CASE("every op has a distinct name that parses back") {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < graph::op_count; ++i) {
    const auto o = static_cast<graph::op>(i);
    CAPTURE(i);
    CHECK_FALSE(graph::name(o).empty());
    CHECK(graph::parse_op(graph::name(o)) == o);
    names.insert(graph::name(o));
  }
  CHECK(names.size() == graph::op_count);
}
