#pragma once
// A ViT for 32x32x3 images: 4x4 patches (64 tokens of 48 values) embedded linearly, a learned CLS
// token in front, learned positions, 12 pre-norm transformer blocks of hidden 768, and a linear
// head on the final CLS token.
//
// Inputs: "images" (batch, 3, 32, 32), "labels" (batch) int64. Loss: summed cross-entropy.

#include <hspmd/core/dtype.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>
#include <hspmd/nn/transformer.hpp>

#include <cstddef>
#include <string>

namespace hspmd::models {

/// ViT sizes.
struct vit_config {
  std::size_t image = 32;
  std::size_t patch = 4;
  std::size_t layers = 12;
  std::size_t hidden = 768;
  std::size_t ffn = 3072;
  std::size_t heads = 12;
  std::size_t classes = 10;
  double dropout = 0.1;
  double eps = 1e-5; ///< LayerNorm epsilon (Hugging Face ViT's layer_norm_eps is 1e-12)
};

/// Traces the ViT for `batch` images in element type T.
template <class T>
[[nodiscard]] graph::graph trace_vit(const vit_config& c, std::size_t batch) {
  constexpr std::size_t dyn = dynamic_extent;
  if (c.patch == 0 || c.image % c.patch != 0)
    throw plan_error("vit",
                     "image " + std::to_string(c.image) + " and patch " + std::to_string(c.patch),
                     "a patch size that divides the image size");
  const std::size_t side = c.image / c.patch;
  const std::size_t patches = side * side;
  const std::size_t patch_values = 3 * c.patch * c.patch;
  nn::tracer t(dtype_of<T>, batch);
  auto images = t.input<T, extents<hspmd::batch, dyn, dyn, dyn>>("images", 3, c.image, c.image);
  auto labels = t.input<std::int64_t, extents<hspmd::batch>>("labels");
  // (B, 3, side, p, side, p) -> (B, side, side, 3, p, p) -> (B, patches, 3 p p)
  const auto six = nn::reshape(
      images, extents<dyn, dyn, dyn, dyn, dyn, dyn>(batch, 3, side, c.patch, side, c.patch));
  const auto moved = nn::permute(six, {0, 2, 4, 1, 3, 5});
  const auto tokens =
      nn::reshape(moved, t.bind<extents<hspmd::batch, dyn, dyn>>(patches, patch_values));
  const nn::linear<T, dyn, dyn> embed("patch_embed", patch_values, c.hidden);
  auto x = embed(t, tokens); // (B, patches, H)
  const auto cls = t.parameter<T>("cls", extents<1, 1, dyn>(c.hidden), nn::normal_init(0.02));
  auto cls_all = nn::broadcast_to(cls, t.bind<extents<hspmd::batch, 1, dyn>>(c.hidden));
  auto h = nn::concat<1>(cls_all, x); // (B, patches + 1, H)
  const auto pos =
      t.parameter<T>("pos.table", extents<dyn, dyn>(patches + 1, c.hidden), nn::normal_init(0.02));
  auto hp = nn::add_broadcast(h, pos);
  for (std::size_t i = 0; i < c.layers; ++i) {
    const nn::transformer_block<T, dyn, dyn> block{"layers." + std::to_string(i),
                                                   c.heads,
                                                   /*causal=*/false,
                                                   c.dropout,
                                                   c.hidden,
                                                   c.ffn,
                                                   0,
                                                   1.25,
                                                   false,
                                                   c.eps};
    hp = block(t, hp);
  }
  const nn::layer_norm<T, dyn> ln_f{"ln_f", c.eps, c.hidden};
  auto normed = ln_f(t, hp);
  const auto first = nn::slice(normed, 1, 0, 1); // the CLS token: (B, 1, H)
  const auto feature = nn::reshape(first, t.bind<extents<hspmd::batch, dyn>>(c.hidden));
  const nn::linear<T, dyn, dyn> head("head", c.hidden, c.classes);
  t.set_loss(nn::cross_entropy(head(t, feature), labels));
  return t.take();
}

} // namespace hspmd::models
