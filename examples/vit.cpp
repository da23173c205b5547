// ViT on 32x32x3 images (4x4 patches, CLS token), single process. Defaults: 12 layers, hidden 768.
//   build/release/examples/vit --layers 2 --hidden 64 --ffn 128 --heads 4 --steps 20
//   build/release/examples/vit --data data_batch_1.bin
#include "images.hpp"

int main(int argc, char** argv) {
  return example::guarded([&] {
    CLI::App app{"hspmd example: ViT"};
    example::common_options o;
    hspmd::models::vit_config c;
    example::add_common(app, o);
    app.add_option("--image", c.image)->capture_default_str();
    app.add_option("--patch", c.patch)->capture_default_str();
    app.add_option("--layers", c.layers)->capture_default_str();
    app.add_option("--hidden", c.hidden)->capture_default_str();
    app.add_option("--ffn", c.ffn)->capture_default_str();
    app.add_option("--heads", c.heads)->capture_default_str();
    app.add_option("--dropout", c.dropout)->capture_default_str();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    const auto g = hspmd::models::trace_vit<float>(c, o.batch);
    return example::train("vit", g, o, example::image_feed(o, c.image, c.classes));
  });
}
