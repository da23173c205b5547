// The safetensors reader and writer, and the CRC-32 checkpoints checksum with: values written
// read back, a file another tool wrote the same way is read, and every way a file can be damaged
// is one error naming the file.
#include <hspmd/io/crc32.hpp>
#include <hspmd/io/safetensors.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace hspmd;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "hspmd-safetensors-test";
  fs::create_directories(d);
  return d / name;
}

// A file as any writer of the format lays it out: length, header text, data.
void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  const std::uint64_t n = header.size();
  for (int k = 0; k < 8; ++k)
    f.put(static_cast<char>((n >> (8 * k)) & 0xFFU));
  f << header << data;
}

} // namespace

TEST_CASE("CRC-32 is zlib's") {
  const std::string s = "123456789";
  CHECK(io::crc32(std::as_bytes(std::span<const char>(s))) == 0xCBF43926U);
  CHECK(io::crc32({}) == 0U);
  // Chained in pieces equals all at once, at every split (the 8-byte steps and the tail).
  const std::string long_text = "The quick brown fox jumps over the lazy dog, twice over.";
  const auto all = std::as_bytes(std::span<const char>(long_text));
  for (std::size_t cut = 0; cut <= all.size(); ++cut)
    CHECK(io::crc32(all.subspan(cut), io::crc32(all.first(cut))) == io::crc32(all));
  CHECK(io::crc32(std::as_bytes(std::span<const char>(long_text.data(), 43))) == 0x414FA339U);
}

TEST_CASE("CRC-32 folded by carry-less products equals the table path at every length") {
  // Lengths across the 64-byte steps, the 16-byte steps and the tail, at odd alignments, from
  // odd starting values; then a MiB (the checkpoint block) and zlib's check value on it.
  std::mt19937 rng(5);
  std::vector<std::byte> v(1 << 20);
  for (std::byte& b : v)
    b = static_cast<std::byte>(rng() & 0xFFU);
  std::size_t differ = 0;
  for (std::size_t len = 0; len < 600; ++len)
    for (const std::size_t off : std::array<std::size_t, 4>{0, 1, 3, 8}) {
      const auto start = static_cast<std::uint32_t>(rng());
      const auto part = std::span<const std::byte>(v).subspan(off, len);
      if (io::crc32(part, start) != io::detail::crc32_tables_only(part, start))
        ++differ;
    }
  CHECK(differ == 0);
  CHECK(io::crc32(v) == io::detail::crc32_tables_only(v));
  std::vector<std::byte> zeros(1 << 20);
  CHECK(io::crc32(zeros) == 0xA738EA1CU); // zlib.crc32(bytes(1 << 20))
}

TEST_CASE("safetensors: written tensors and metadata read back") {
  const std::vector<float> a = {1.5F, -2.0F, 3.25F, 0.0F, 7.0F, 8.5F};
  const std::vector<double> b = {1e-300, 2.0};
  const std::vector<io::safetensors_tensor> ts = {
      {"layer.weight", dtype::f32, {2, 3}, std::as_bytes(std::span<const float>(a))},
      {"scalar", dtype::f64, {}, std::as_bytes(std::span<const double>(b).first(1))},
      {"empty", dtype::f32, {0, 4}, {}},
      {"b", dtype::f64, {2}, std::as_bytes(std::span<const double>(b))}};
  const fs::path p = scratch("round.safetensors");
  const auto offsets = io::write_safetensors(p, ts, {{"format", "test"}});
  const io::safetensors_header h = io::read_safetensors_header(p);
  CHECK(h.metadata.at("format") == "test");
  REQUIRE(h.tensors.size() == 4);
  CHECK(h.tensors.at("layer.weight").shape == std::vector<std::size_t>{2, 3});
  CHECK(h.tensors.at("layer.weight").begin == offsets[0]);
  CHECK(h.tensors.at("layer.weight").begin % 8 == 0); // the data starts aligned
  CHECK(h.tensors.at("scalar").shape.empty());
  CHECK(h.tensors.at("b").type == dtype::f64);
  std::vector<float> got(6);
  io::read_file_range(p, offsets[0], std::as_writable_bytes(std::span<float>(got)));
  CHECK(got == a);
  std::vector<double> gb(2);
  io::read_file_range(p, h.tensors.at("b").begin, std::as_writable_bytes(std::span<double>(gb)));
  CHECK(gb == b);
  CHECK_THROWS_WITH(
      io::write_safetensors(p,
                            std::vector<io::safetensors_tensor>{
                                {"x", dtype::f32, {4}, std::as_bytes(std::span<const float>(a))}}),
      Catch::Contains("tensor x: 24 bytes for a shape of 16 bytes"));
}

TEST_CASE("safetensors: a file another writer laid out the same way reads") {
  // Header keys in another order, no padding, BF16 and I64 tensors.
  const fs::path p = scratch("other.safetensors");
  write_raw(p,
            R"({"b":{"dtype":"I64","shape":[1],"data_offsets":[4,12]},)"
            R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})",
            std::string(12, '\x01'));
  const auto h = io::read_safetensors_header(p);
  CHECK(h.tensors.at("a").type == dtype::bf16);
  CHECK(h.tensors.at("b").type == dtype::i64);
  CHECK(h.metadata.at("k") == "v");
}

TEST_CASE("safetensors: every damaged file is one error naming it") {
  const fs::path p = scratch("bad.safetensors");
  const std::string f = p.string() + ": ";
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::pair<std::function<void()>, std::string> cases[] = {
      {[&] { write_raw(p, ok, std::string(4, 'x')); },
       "tensor a: data_offsets [0,8] do not lie within the 4 bytes of data"},
      {[&] {
         std::ofstream out(p, std::ios::binary | std::ios::trunc);
         out.write("\xe8\x03\0\0\0\0\0\0{}", 10); // a header of 1000 bytes announced
       },
       "header length 1000 does not fit the file of 10 bytes"},
      {[&] { write_raw(p, "{not json", ""); }, "header is not valid JSON"},
      {[&] { write_raw(p, "[1, 2]", ""); }, "header is not a JSON object"},
      {[&] { write_raw(p, R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", "xx"); },
       "tensor a: dtype \"F8\" is not one hspmd holds"},
      {[&] {
         write_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "xxxxxxxx");
       },
       "tensor a: 8 bytes for shape [3] of F32"},
      {[&] {
         write_raw(p,
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   std::string(8, 'x'));
       },
       "overlap"},
      {[&] {
         write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "xxxxxxxx");
       },
       "leave a gap"},
      {[&] { write_raw(p, ok, std::string(12, 'x')); }, "4 bytes after the last tensor's data"},
      {[&] { std::ofstream(p, std::ios::trunc) << "abc"; }, "is truncated: 3 bytes"},
  };
  for (const auto& [make, message] : cases) {
    make();
    INFO(message);
    CHECK_THROWS_WITH(io::read_safetensors_header(p),
                      Catch::StartsWith(f) && Catch::Contains(message));
  }
  write_raw(p, ok, std::string(8, 'x'));
  std::vector<std::byte> too_much(16);
  const auto end = fs::file_size(p);
  CHECK_THROWS_WITH(io::read_file_range(p, end - 8, too_much),
                    f + "is truncated: 16 bytes expected at offset " + std::to_string(end - 8) +
                        ", the file ends at " + std::to_string(end) +
                        " (restore the file, or load an earlier checkpoint)");
  CHECK_THROWS_WITH(io::read_safetensors_header(scratch("absent.safetensors")),
                    Catch::Contains("absent.safetensors: cannot be read: No such file"));
}
