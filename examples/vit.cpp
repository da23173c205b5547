// ViT on 32x32x3 images (4x4 patches, CLS token), one process or under mpirun with --cluster.
// Defaults: 12 layers, hidden 768.
//   build/release/examples/vit --layers 2 --hidden 64 --ffn 128 --heads 4 --steps 20
//   build/release/examples/vit --data data_batch_1.bin
#include "train.hpp"

int main(int argc, char** argv) {
  CLI::App app{"hspmd example: ViT"};
  example::options o;
  o.train.name = "vit";
  hspmd::models::vit_config c;
  example::add_common(app, o);
  app.add_option("--image", c.image, "image side in pixels")->capture_default_str();
  app.add_option("--patch", c.patch, "patch side in pixels")->capture_default_str();
  app.add_option("--layers", c.layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", c.hidden, "model width")->capture_default_str();
  app.add_option("--ffn", c.ffn, "feed-forward width")->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads")->capture_default_str();
  app.add_option("--dropout", c.dropout, "dropout rate")->capture_default_str();
  auto* eps = example::add_norm_eps(app, c.eps);
  return example::main_of(app, argc, argv, [&] {
    example::settle_norm_eps(o, c.eps, eps->count() > 0);
    example::fit([&](std::size_t b) { return hspmd::models::trace_vit<float>(c, b); }, o,
                 example::image_feeds(o, c.image, c.classes));
  });
}
