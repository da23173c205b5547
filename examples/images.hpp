#pragma once
// Feeding the image models: CIFAR-10 files with --data, else seeded prototype images.
#include "train.hpp"

#include <filesystem>
#include <memory>

namespace example {

inline feed_fn image_feed(const common_options& o, std::size_t image, std::size_t classes) {
  if (!o.data.empty()) {
    std::vector<std::filesystem::path> files(o.data.begin(), o.data.end());
    auto c = std::make_shared<hspmd::data::cifar10>(files);
    if (image != 32)
      throw hspmd::config_error("--data", "CIFAR-10 images are 32x32", "use --image 32");
    std::printf("data: %zu CIFAR-10 images from %zu file(s)\n", c->size(), files.size());
    return [c, b = o.batch](example::input_sink& ex, std::size_t step) {
      std::vector<float> x;
      std::vector<std::int64_t> y;
      c->batch(step, b, x, y);
      ex.set_input("images", x);
      ex.set_input("labels", y);
    };
  }
  auto gen = std::make_shared<prototype_images>(3 * image * image, classes, o.seed);
  return [gen, b = o.batch](example::input_sink& ex, std::size_t) {
    std::vector<float> x;
    std::vector<std::int64_t> y;
    gen->batch(b, x, y);
    ex.set_input("images", x);
    ex.set_input("labels", y);
  };
}

} // namespace example
