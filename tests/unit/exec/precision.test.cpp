// Mixed precision (kernels/precision.hpp): the 16-bit GEMM is the float GEMM of rounded operands
// (checked against an fp64 reference of the rounded operands, and shown to differ from the
// unrounded product by bf16's rounding only), an executor under bf16 or f16 stores every
// activation and activation gradient as a 16-bit value while parameters and their gradients stay
// float, and a BERT trains under bf16 and under f16 with loss scaling as it does in float.
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/train/loss_scale.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

using namespace hspmd;
using exec::precision;
using exec::transpose;

namespace {

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 r(seed);
  std::normal_distribution<float> d(0.0F, 1.0F);
  std::vector<float> v(n);
  for (float& x : v)
    x = d(r);
  return v;
}

// C (m x n) = op(A) op(B) in fp64 from A and B as given (row-major, leading dimensions).
std::vector<double> reference(transpose ta, transpose tb, std::size_t m, std::size_t n,
                              std::size_t k, const std::vector<float>& a, std::size_t lda,
                              const std::vector<float>& b, std::size_t ldb) {
  std::vector<double> c(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t l = 0; l < k; ++l) {
        const float x = ta == transpose::yes ? a[l * lda + i] : a[i * lda + l];
        const float y = tb == transpose::yes ? b[j * ldb + l] : b[l * ldb + j];
        s += double(x) * double(y);
      }
      c[i * n + j] = s;
    }
  return c;
}

std::vector<float> rounded(precision p, std::vector<float> v) {
  for (float& x : v)
    x = exec::round_to(p, x);
  return v;
}

// Largest |got - want| over the largest |want|.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return worst / scale;
}

bool representable(precision p, float x) {
  return exec::round_to(p, x) == x || std::isnan(x);
}

} // namespace

TEST_CASE("precision names and rounding") {
  CHECK(exec::parse_precision("bf16") == precision::bf16);
  CHECK(exec::parse_precision("fp16") == precision::f16);
  CHECK(exec::parse_precision("f32") == precision::f32);
  CHECK_FALSE(exec::parse_precision("fp8"));
  for (precision p : {precision::f32, precision::bf16, precision::f16})
    CHECK(exec::parse_precision(exec::name(p)) == p);
  CHECK(exec::round_to(precision::bf16, 1.00390625F) == 1.0F); // a tie, to even
  CHECK(exec::round_to(precision::bf16, 1.01171875F) == 1.015625F);
  CHECK(std::isinf(exec::round_to(precision::f16, 70000.0F)));
  CHECK(exec::round_to(precision::f32, 1.00390625F) == 1.00390625F);
  CHECK(exec::round_to(precision::bf16, 3.0) == 3.0); // doubles round through float
  // The device GEMM's operand encoding decodes to the same rounding.
  const auto x = random_values(4096, 7);
  std::vector<std::uint16_t> bits(x.size());
  exec::host_backend host;
  for (precision p : {precision::bf16, precision::f16}) {
    host.for_each_index(x.size(), exec::encode_16<float>{x.data(), bits.data(), p});
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float back = p == precision::bf16
                             ? static_cast<float>(hspmd::bfloat16::from_bits(bits[i]))
                             : static_cast<float>(hspmd::float16::from_bits(bits[i]));
      REQUIRE(back == exec::round_to(p, x[i]));
    }
  }
}

TEST_CASE("16-bit GEMMs are float GEMMs of rounded operands") {
  exec::host_backend host;
  const std::size_t m = 13, n = 7, k = 300;
  for (precision p : {precision::bf16, precision::f16})
    for (transpose ta : {transpose::no, transpose::yes})
      for (transpose tb : {transpose::no, transpose::yes}) {
        INFO(exec::name(p) << " ta " << (ta == transpose::yes) << " tb " << (tb == transpose::yes));
        // Leading dimensions wider than the rows: the padding is never read.
        const std::size_t lda = (ta == transpose::yes ? m : k) + 3;
        const std::size_t ldb = (tb == transpose::yes ? k : n) + 2;
        const auto a = random_values((ta == transpose::yes ? k : m) * lda, 1);
        const auto b = random_values((tb == transpose::yes ? n : k) * ldb, 2);
        std::vector<float> c(m * n, 0.0F);
        exec::gemm_in(host, p, ta, tb, m, n, k, 1.0F, a.data(), lda, b.data(), ldb, 0.0F, c.data(),
                      n);
        // Exact products, float sums: within float's accumulation error of the rounded product.
        CHECK(relative_error(
                  c, reference(ta, tb, m, n, k, rounded(p, a), lda, rounded(p, b), ldb)) < 1e-5);
        // The unrounded product differs by the 16-bit rounding of the operands: more than float's
        // rounding, within the 2e-2 the GPU tests allow a 16-bit GEMM.
        const double off = relative_error(c, reference(ta, tb, m, n, k, a, lda, b, ldb));
        CHECK(off > 1e-5);
        CHECK(off < 2e-2);
      }
}

TEST_CASE("16-bit batched GEMMs round every batch's operands") {
  exec::host_backend host;
  const std::size_t m = 5, n = 6, k = 64, batch = 3;
  const auto a = random_values(batch * m * k, 3);
  const auto b = random_values(batch * n * k, 4);
  std::vector<float> c(batch * m * n, 0.0F);
  exec::gemm_strided_batched_in(host, precision::bf16, transpose::no, transpose::yes, m, n, k, 1.0F,
                                a.data(), k, m * k, b.data(), k, n * k, 0.0F, c.data(), n, m * n,
                                batch);
  const auto ra = rounded(precision::bf16, a);
  const auto rb = rounded(precision::bf16, b);
  for (std::size_t i = 0; i < batch; ++i) {
    const std::vector<float> ai(ra.begin() + long(i * m * k), ra.begin() + long((i + 1) * m * k));
    const std::vector<float> bi(rb.begin() + long(i * n * k), rb.begin() + long((i + 1) * n * k));
    const std::vector<float> ci(c.begin() + long(i * m * n), c.begin() + long((i + 1) * m * n));
    INFO("batch " << i);
    CHECK(relative_error(ci, reference(transpose::no, transpose::yes, m, n, k, ai, k, bi, k)) <
          1e-5);
  }
}

namespace {

models::bert_config small_bert() {
  models::bert_config c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.ffn = 64;
  c.vocab = 50;
  c.seq = 8;
  return c;
}

template <class Ex>
void feed(Ex& ex, std::size_t step, std::size_t batch, std::size_t seq) {
  // A learnable task: the target is the next token of a fixed cycle.
  std::vector<std::int64_t> ids(batch * seq), targets(batch * seq);
  std::mt19937 r(static_cast<unsigned>(step));
  for (std::size_t s = 0; s < batch; ++s) {
    const auto start = static_cast<std::int64_t>(r() % 50);
    for (std::size_t t = 0; t < seq; ++t) {
      ids[s * seq + t] = (start + static_cast<std::int64_t>(t) * 7) % 50;
      targets[s * seq + t] = (start + static_cast<std::int64_t>(t + 1) * 7) % 50;
    }
  }
  ex.set_input("tokens", std::span<const std::int64_t>(ids));
  ex.set_input("targets", std::span<const std::int64_t>(targets));
}

} // namespace

TEST_CASE("an executor under bf16 or f16 stores activations in 16 bits, parameters in float") {
  const auto cfg = small_bert();
  const graph::graph g = models::trace_bert_lm<float>(cfg, 4);
  exec::executor<float> full(g, 5);
  feed(full, 0, 4, cfg.seq);
  const double want = full.forward();
  for (precision p : {precision::bf16, precision::f16}) {
    INFO(exec::name(p));
    exec::executor<float> ex(g, 5);
    ex.set_precision(p);
    CHECK(ex.precision() == p);
    feed(ex, 0, 4, cfg.seq);
    const double loss = ex.forward();
    ex.backward();
    CHECK(std::abs(loss - want) <= 2e-2 * std::abs(want));
    CHECK(loss != want); // the rounding happened
    std::size_t activations = 0, params_unrounded = 0;
    for (graph::node_id i = 0; i < g.size(); ++i) {
      const graph::node& n = g[i];
      if (n.type == dtype::i64 || n.out.rank() == 0 || n.kind == graph::op::input)
        continue;
      const auto stored = ex.value_storage(i); // (order does not matter here)
      const std::vector<float> v(stored.begin(), stored.end());
      if (n.kind == graph::op::parameter) {
        // Master weights and their gradients keep float's bits.
        params_unrounded += std::ranges::any_of(v, [&](float x) { return !representable(p, x); });
        continue;
      }
      ++activations;
      INFO("node " << n.name << " (" << graph::name(n.kind) << ")");
      CHECK(std::ranges::all_of(v, [&](float x) { return representable(p, x); }));
      const auto d = ex.gradient_storage(i);
      CHECK(std::ranges::all_of(d, [&](float x) { return representable(p, x); }));
    }
    CHECK(activations > 20);
    CHECK(params_unrounded > 5);
  }
}

TEST_CASE("a BERT trains under bf16, and under f16 with dynamic loss scaling, as in float") {
  const auto cfg = small_bert();
  const graph::graph g = models::trace_bert_lm<float>(cfg, 8);
  const std::size_t steps = 40;
  const auto train = [&](precision p) {
    exec::executor<float> ex(g, 11);
    ex.set_precision(p);
    exec::adam opt(1e-2);
    train::dynamic_loss_scale scale;
    std::vector<double> losses;
    for (std::size_t s = 0; s < steps; ++s) {
      feed(ex, s, 8, cfg.seq);
      ex.set_step(s);
      if (p == precision::f16)
        ex.set_loss_scale(scale.scale());
      losses.push_back(ex.forward());
      ex.backward();
      const double norm2 = exec::grad_norm_squared(ex); // of the scaled gradients
      const double factor = p == precision::f16 ? 1.0 / scale.scale() : 1.0;
      if (p != precision::f16 || scale.update(!std::isfinite(norm2)))
        opt.step(ex, factor);
    }
    return losses;
  };
  const auto f32 = train(precision::f32);
  REQUIRE(f32.back() < 0.5 * f32.front());
  for (precision p : {precision::bf16, precision::f16}) {
    INFO(exec::name(p));
    const auto got = train(p);
    CHECK(std::abs(got.front() - f32.front()) <= 2e-2 * f32.front());
    CHECK(got.back() < 0.5 * got.front());
    // The same curve, within what 16-bit activations change over 40 steps.
    CHECK(std::abs(got.back() - f32.back()) <= 0.15 * f32.back() + 0.05);
  }
}

TEST_CASE("16-bit precision needs an executor of float") {
  const graph::graph g = models::trace_bert_lm<double>(small_bert(), 2);
  exec::executor<double> ex(g, 1);
  CHECK_THROWS_WITH(ex.set_precision(precision::bf16),
                    Catch::Contains("precision bf16") && Catch::Contains("float"));
  ex.set_precision(precision::f32); // no-op
}
