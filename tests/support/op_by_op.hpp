#pragma once
// Every op of the registry, one at a time, on a device backend against the host backend: each
// example call the registry lists (graph/ops/*.hpp `examples()`), as a graph of float inputs,
// the op, and a loss (sum of the op's output times a random weight) so that the backward gets a
// random output gradient. Both executors take the same seed, step, precision and inputs; the op's
// value and every float input's gradient are compared, each as the largest difference over the host
// tensor's largest magnitude. Used with the deferred backend here (tests/unit/exec/op_by_op) and
// with the CUDA backend where a GPU is (tests/gpu/cuda_backend.test.cu).
#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/kernels/precision.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::test {

/// One example call of one op as a graph.
struct op_case {
  std::string name;
  graph::graph g;
  graph::node_id node = 0; ///< the op's node
  std::vector<graph::node_id> float_inputs;
  std::vector<graph::node_id> positive_inputs;
  std::size_t id_limit = 4;
};

/// Every example call of every op that computes something.
inline std::vector<op_case> every_op_case() {
  std::vector<op_case> cases;
  for (std::size_t k = 0; k < graph::op_count; ++k) {
    const auto o = static_cast<graph::op>(k);
    if (graph::arity(o) == 0)
      continue; // inputs and parameters compute nothing
    for (const graph::op_example& e : graph::examples(o)) {
      op_case c;
      c.name = std::string(graph::name(o)) + (e.label.empty() ? "" : " " + e.label);
      c.id_limit = e.id_limit;
      const auto input = [&c](std::vector<std::size_t> dims, dtype t, bool positive) {
        graph::node n;
        n.kind = graph::op::input;
        n.name = "in" + std::to_string(c.g.size());
        n.out.dims = std::move(dims);
        n.type = t == dtype::i64 ? dtype::i64 : dtype::f32;
        const auto id = c.g.add(n);
        if (n.type != dtype::i64)
          c.float_inputs.push_back(id);
        if (positive)
          c.positive_inputs.push_back(id);
        return id;
      };
      const auto add = [&c](graph::op kind, std::vector<graph::node_id> ins,
                            graph::attributes a = {}) {
        graph::node n;
        n.kind = kind;
        n.name = std::string(graph::name(kind)) + std::to_string(c.g.size());
        n.inputs = std::move(ins);
        n.attrs = std::move(a);
        n.type = dtype::f32;
        n.out = graph::infer_shape(c.g, n);
        return c.g.add(n);
      };
      std::vector<graph::node_id> ins;
      for (const auto& in : e.inputs)
        ins.push_back(input(in.dims, in.type, in.positive));
      c.node = add(o, ins, e.attrs);
      graph::node_id out = c.node;
      if (c.g[out].out.rank() == 0)
        out = add(graph::op::reshape, {out}, graph::attributes{0.0, {1}, false});
      const auto weight = input(c.g[out].out.dims, dtype::f32, false);
      c.g.set_loss(add(graph::op::sum, {add(graph::op::mul, {out, weight})}));
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

/// The same inputs on any executor: N(0, 1) away from 0 (relu's kink), positive inputs in
/// (0.5, 1.5), ids in [0, id_limit).
template <class Ex>
void feed_case(Ex& ex, const op_case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (graph::node_id i = 0; i < c.g.size(); ++i) {
    const graph::node& n = c.g[i];
    if (n.kind != graph::op::input)
      continue;
    if (n.type == dtype::i64) {
      std::vector<std::int64_t> ids(n.out.size());
      for (auto& v : ids)
        v = static_cast<std::int64_t>(rng() % c.id_limit);
      ex.set_input(n.name, std::span<const std::int64_t>(ids));
    } else {
      const bool positive = std::ranges::find(c.positive_inputs, i) != c.positive_inputs.end();
      std::vector<float> v(n.out.size());
      for (auto& x : v) {
        double d =
            positive ? 1.0 + std::uniform_real_distribution<double>(-0.5, 0.5)(rng) : nd(rng);
        if (std::abs(d) < 1e-3)
          d = 0.5;
        x = static_cast<float>(d);
      }
      ex.set_input(n.name, std::span<const float>(v));
    }
  }
}

/// How far one tensor of one case is from the host's.
struct op_difference {
  std::string what;   ///< "<case>: value" or "<case>: gradient of input k"
  double error = 0.0; ///< max |device - host| / max |host| (0 for empty tensors)
};

[[nodiscard]] inline double relative_difference(const std::vector<float>& got,
                                                std::span<const float> want) {
  double worst = 0.0;
  double scale = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst =
        std::max(worst, std::abs(static_cast<double>(got.at(i)) - static_cast<double>(want[i])));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  if (std::isnan(worst) || got.size() != want.size())
    return INFINITY;
  return scale > 0.0 ? worst / scale : worst;
}

/// Every case on `make_device()`'s backend against the host, both in precision `p`: the op's
/// value and each float input's gradient. (Under bf16 a device's different order of sums can
/// flip a 16-bit rounding: an ulp of bf16 is 2^-8 relative.)
template <class Dev>
[[nodiscard]] std::vector<op_difference> compare_every_op(const std::function<Dev()>& make_device,
                                                          exec::precision p) {
  std::vector<op_difference> out;
  for (const op_case& c : every_op_case()) {
    exec::executor<float> host(c.g, 3);
    exec::executor<float, Dev> dev(c.g, 3, {}, make_device());
    host.set_precision(p);
    dev.set_precision(p);
    feed_case(host, c, 11);
    feed_case(dev, c, 11);
    host.set_step(1);
    dev.set_step(1);
    (void)host.forward();
    (void)dev.forward();
    host.backward();
    dev.backward();
    if (c.g[c.node].type != dtype::i64)
      out.push_back(
          {c.name + ": value", relative_difference(dev.value_to_host(c.node),
                                                   std::span<const float>(host.value(c.node)))});
    for (std::size_t k = 0; k < c.float_inputs.size(); ++k)
      out.push_back({c.name + ": gradient of input " + std::to_string(k),
                     relative_difference(dev.grad_to_host(c.float_inputs[k]),
                                         std::span<const float>(host.grad(c.float_inputs[k])))});
  }
  return out;
}

} // namespace hspmd::test
