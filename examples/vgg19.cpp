// VGG19 on 32x32x3 images, single process. --width scales every stage's channels (1.0: the real
// VGG19) and --fc the classifier width.
//   build/release/examples/vgg19 --width 0.125 --fc 256 --steps 20
#include "images.hpp"

int main(int argc, char** argv) {
  return example::guarded([&] {
    CLI::App app{"hspmd example: VGG19"};
    example::common_options o;
    hspmd::models::vgg_config c;
    double width = 1.0;
    example::add_common(app, o);
    app.add_option("--width", width, "channel multiplier")->capture_default_str();
    app.add_option("--fc", c.fc, "classifier width")->capture_default_str();
    app.add_option("--dropout", c.dropout)->capture_default_str();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    for (auto& stage : c.stages)
      for (auto& ch : stage)
        ch = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(ch) * width));
    const auto g = hspmd::models::trace_vgg<float>(c, o.batch);
    return example::train("vgg19", g, o, example::image_feed(o, c.image, c.classes));
  });
}
