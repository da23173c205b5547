// The data readers on small files the tests write.
#include <hspmd/data/cifar10.hpp>
#include <hspmd/data/text.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace hspmd;

namespace {
std::filesystem::path temp_file(const std::string& name, const std::string& bytes) {
  const auto path = std::filesystem::temp_directory_path() / ("hspmd-test-" + name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}
} // namespace

TEST_CASE("text: vocabulary by frequency, <unk>, and next-token batches") {
  const auto file = temp_file("text.txt", "the cat sat on the mat\nthe  dog\tsat\n");
  const data::text_corpus c(file, 4);
  // counts: the 3, sat 2, then cat/dog/mat/on 1 each (alphabetical among ties): cat
  CHECK(c.vocabulary() == std::vector<std::string>{"<unk>", "the", "sat", "cat"});
  CHECK(c.tokens() == std::vector<std::int64_t>{1, 3, 2, 0, 1, 0, 1, 0, 2});
  CHECK(c.unknown_count() == 3);
  std::vector<std::int64_t> tokens, targets;
  c.batch(0, 2, 3, tokens, targets);
  CHECK(tokens == std::vector<std::int64_t>{1, 3, 2, 0, 1, 0});
  CHECK(targets == std::vector<std::int64_t>{3, 2, 0, 1, 0, 1});
  c.batch(1, 2, 3, tokens, targets); // wraps around the 9-token stream
  CHECK(tokens == std::vector<std::int64_t>{1, 0, 2, 1, 3, 2});
  std::filesystem::remove(file);
  CHECK_THROWS_WITH(data::text_corpus::from_string("one", 10, "tiny.txt"),
                    Catch::StartsWith("tiny.txt: has 1 tokens"));
  CHECK_THROWS_AS(data::text_corpus("/nonexistent/text.txt", 10), config_error);
}

TEST_CASE("CIFAR-10: records, labels, normalization, and malformed files") {
  std::string bytes;
  for (int r = 0; r < 3; ++r) {
    bytes.push_back(static_cast<char>(r * 3)); // labels 0, 3, 6
    for (std::size_t p = 0; p < data::cifar10::pixels; ++p)
      bytes.push_back(static_cast<char>(p < 1024 ? 255 : 0)); // red 1, green and blue 0
  }
  const auto file = temp_file("cifar.bin", bytes);
  const data::cifar10 c({file});
  CHECK(c.size() == 3);
  std::vector<float> images;
  std::vector<std::int64_t> labels;
  c.batch(1, 2, images, labels); // records 2 and 0
  CHECK(labels == std::vector<std::int64_t>{6, 0});
  CHECK(images.size() == 2 * 3072);
  CHECK(images[0] == Approx((1.0 - 0.4914) / 0.2470));
  CHECK(images[1024] == Approx((0.0 - 0.4822) / 0.2435));
  const auto broken = temp_file("cifar-broken.bin", bytes.substr(0, 5000));
  CHECK_THROWS_WITH(data::cifar10({broken}), Catch::Contains("5000 bytes is not a whole number"));
  bytes[0] = 12;
  const auto bad_label = temp_file("cifar-label.bin", bytes);
  CHECK_THROWS_WITH(data::cifar10({bad_label}), Catch::Contains("record 0 has label 12"));
  for (const auto& f : {file, broken, bad_label})
    std::filesystem::remove(f);
}
