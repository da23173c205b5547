#pragma once
// A multi-layer perceptron classifier: inputs -> hidden layers with ReLU -> classes.
// Inputs: "x" (batch, inputs), "labels" (batch) int64. Loss: summed cross-entropy.

#include <hspmd/core/dtype.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace hspmd::models {

/// MLP sizes.
struct mlp_config {
  std::size_t inputs = 784;
  std::vector<std::size_t> hidden = {1024, 1024};
  std::size_t classes = 10;
};

/// Traces the MLP for `batch` samples in element type T.
template <class T>
[[nodiscard]] graph::graph trace_mlp(const mlp_config& c, std::size_t batch) {
  constexpr std::size_t dyn = dynamic_extent;
  nn::tracer t(dtype_of<T>, batch);
  auto x = t.input<T, extents<hspmd::batch, dyn>>("x", c.inputs);
  auto labels = t.input<std::int64_t, extents<hspmd::batch>>("labels");
  std::size_t width = c.inputs;
  for (std::size_t i = 0; i < c.hidden.size(); ++i) {
    const nn::linear<T, dyn, dyn> fc("fc" + std::to_string(i), width, c.hidden[i]);
    x = nn::relu(fc(t, x));
    width = c.hidden[i];
  }
  const nn::linear<T, dyn, dyn> head("head", width, c.classes);
  t.set_loss(nn::cross_entropy(head(t, x), labels));
  return t.take();
}

} // namespace hspmd::models
