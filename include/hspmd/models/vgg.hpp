#pragma once
// VGG19 for 32x32x3 images (CIFAR-10): 16 3x3 convolutions with ReLU in five stages separated by
// 2x2 max pooling, adaptive average pooling to 7x7, then FC 25088 -> 4096 -> 4096 -> classes
// with ReLU and dropout. `stages` and the FC width make smaller variants.
//
// Inputs: "images" (batch, 3, 32, 32), "labels" (batch) int64. Loss: summed cross-entropy.

#include <hspmd/core/dtype.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace hspmd::models {

/// VGG sizes: channels of the convolutions per stage (a pool follows each stage).
struct vgg_config {
  std::vector<std::vector<std::size_t>> stages = {
      {64, 64}, {128, 128}, {256, 256, 256, 256}, {512, 512, 512, 512}, {512, 512, 512, 512}};
  std::size_t image = 32;
  std::size_t fc = 4096;
  std::size_t pooled = 7; ///< adaptive pooling to pooled x pooled before the classifier
  std::size_t classes = 10;
  double dropout = 0.5;
};

/// Traces VGG for `batch` images in element type T.
template <class T>
[[nodiscard]] graph::graph trace_vgg(const vgg_config& c, std::size_t batch) {
  constexpr std::size_t dyn = dynamic_extent;
  nn::tracer t(dtype_of<T>, batch);
  auto x = t.input<T, extents<hspmd::batch, dyn, dyn, dyn>>("images", 3, c.image, c.image);
  auto labels = t.input<std::int64_t, extents<hspmd::batch>>("labels");
  std::size_t channels = 3;
  std::size_t conv = 0;
  for (std::size_t s = 0; s < c.stages.size(); ++s) {
    for (std::size_t k : c.stages[s]) {
      const nn::conv2d<T, dyn, dyn> layer{
          "features." + std::to_string(conv++), 3, 1, 1, channels, k};
      x = nn::relu(layer(t, x));
      channels = k;
    }
    x = nn::max_pool2d(x, 2, 2);
  }
  x = nn::adaptive_avg_pool2d(x, c.pooled, c.pooled);
  auto h = nn::flatten(x); // (B, channels * pooled^2)
  const std::size_t features = channels * c.pooled * c.pooled;
  const nn::linear<T, dyn, dyn> fc1("classifier.0", features, c.fc);
  const nn::linear<T, dyn, dyn> fc2("classifier.1", c.fc, c.fc);
  const nn::linear<T, dyn, dyn> fc3("classifier.2", c.fc, c.classes);
  const auto dropout = [&](auto v) { return nn::dropout(v, c.dropout); };
  auto logits = fc3(t, dropout(nn::relu(fc2(t, dropout(nn::relu(fc1(t, h)))))));
  t.set_loss(nn::cross_entropy(logits, labels));
  return t.take();
}

} // namespace hspmd::models
