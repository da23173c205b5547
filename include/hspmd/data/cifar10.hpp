#pragma once
// CIFAR-10 binary batches: records of 1 label byte (0..9) and 3072 pixel bytes (1024 red, 1024
// green, 1024 blue, row-major 32x32). Pixels are scaled to [0, 1] and normalized per channel
// with the usual CIFAR-10 means and standard deviations.

#include <hspmd/core/error.hpp>
#include <hspmd/io/json_input.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace hspmd::data {

/// All images of one or more CIFAR-10 binary batch files.
class cifar10 {
public:
  static constexpr std::size_t record = 1 + 3 * 32 * 32;
  static constexpr std::size_t pixels = 3 * 32 * 32;

  /// Reads the files; throws `config_error` naming a file whose size is not a whole number of
  /// records or that holds a label above 9.
  explicit cifar10(const std::vector<std::filesystem::path>& files) {
    for (const auto& f : files) {
      const std::string bytes = hspmd::io::read_text_file(f, std::size_t{1} << 31U);
      if (bytes.empty() || bytes.size() % record != 0)
        throw config_error(f.string(),
                           std::to_string(bytes.size()) + " bytes is not a whole number of " +
                               std::to_string(record) + "-byte records",
                           "a CIFAR-10 binary batch (data_batch_N.bin)");
      for (std::size_t at = 0; at < bytes.size(); at += record) {
        const auto label = static_cast<unsigned char>(bytes[at]);
        if (label > 9)
          throw config_error(f.string(),
                             "record " + std::to_string(at / record) + " has label " +
                                 std::to_string(label),
                             "labels 0..9");
        labels_.push_back(label);
        pixels_.insert(pixels_.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at + 1),
                       bytes.begin() + static_cast<std::ptrdiff_t>(at + record));
      }
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return labels_.size(); }

  /// Batch `index` of `batch` images (wrapping around), normalized, as (batch, 3, 32, 32).
  template <class T>
  void batch(std::size_t index, std::size_t batch_size, std::vector<T>& images,
             std::vector<std::int64_t>& labels) const {
    static constexpr std::array<double, 3> mean = {0.4914, 0.4822, 0.4465};
    static constexpr std::array<double, 3> stddev = {0.2470, 0.2435, 0.2616};
    images.resize(batch_size * pixels);
    labels.resize(batch_size);
    for (std::size_t b = 0; b < batch_size; ++b) {
      const std::size_t i = (index * batch_size + b) % size();
      labels[b] = labels_[i];
      for (std::size_t p = 0; p < pixels; ++p) {
        const std::size_t channel = p / 1024;
        const double v =
            static_cast<double>(static_cast<unsigned char>(pixels_[i * pixels + p])) / 255.0;
        images[b * pixels + p] = static_cast<T>((v - mean[channel]) / stddev[channel]);
      }
    }
  }

private:
  std::vector<std::int64_t> labels_;
  std::vector<char> pixels_;
};

} // namespace hspmd::data
