// VGG19 on 32x32x3 images, one process or under mpirun with --cluster. --width scales every
// stage's channels (1.0: the real VGG19) and --fc the classifier width.
//   build/release/examples/vgg19 --width 0.125 --fc 256 --steps 20
#include "train.hpp"

#include <algorithm>

int main(int argc, char** argv) {
  CLI::App app{"hspmd example: VGG19"};
  example::options o;
  o.train.name = "vgg19";
  hspmd::models::vgg_config c;
  double width = 1.0;
  example::add_common(app, o);
  app.add_option("--width", width, "channel multiplier of every stage")->capture_default_str();
  app.add_option("--fc", c.fc, "classifier width")->capture_default_str();
  app.add_option("--dropout", c.dropout, "dropout rate of the classifier")->capture_default_str();
  return example::main_of(app, argc, argv, [&] {
    for (auto& stage : c.stages)
      for (auto& ch : stage)
        ch = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(ch) * width));
    example::fit([&](std::size_t b) { return hspmd::models::trace_vgg<float>(c, b); }, o,
                 example::image_feeds(o, c.image, c.classes));
  });
}
