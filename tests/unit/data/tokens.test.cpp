// Token files (data/tokens.hpp) on small files the tests write, byte by byte as the formats are
// documented, and the prefetching thread (data/prefetch.hpp).
#include <hspmd/data/prefetch.hpp>
#include <hspmd/data/tokens.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using namespace hspmd;

namespace {
std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("hspmd-test-" + name);
}
template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void write(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}
// A Megatron-LM index of uint16 sequences `sizes`, documents starting at sequences `docs`.
std::string index_of(const std::vector<std::int32_t>& sizes, const std::vector<std::int64_t>& docs,
                     std::uint8_t code = 8) {
  std::string out("MMIDIDX\0\0", 9);
  put<std::uint64_t>(out, 1);
  put<std::uint8_t>(out, code);
  put<std::uint64_t>(out, sizes.size());
  put<std::uint64_t>(out, docs.size());
  for (auto s : sizes)
    put<std::int32_t>(out, s);
  std::int64_t at = 0;
  for (auto s : sizes) {
    put<std::int64_t>(out, at);
    at += 2 * s;
  }
  for (auto d : docs)
    put<std::int64_t>(out, d);
  return out;
}
std::string what(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
} // namespace

TEST_CASE("a flat uint16 file is one document, its samples never leave it and follow the seed") {
  std::string bytes;
  for (std::uint16_t t = 0; t < 41; ++t)
    put<std::uint16_t>(bytes, t);
  const auto path = temp_path("flat.bin");
  write(path, bytes);
  CHECK(data::token_format_of(path, "auto") == data::token_format::flat16);
  auto file = std::make_shared<const data::token_file>(path, data::token_format::flat16);
  CHECK(file->size() == 41);
  CHECK(file->documents() == 1);
  CHECK(file->type() == "uint16");
  // seq 4: samples of 5 tokens at 0, 4, ..., 36: (41 - 1) / 4 = 10
  const data::token_samples in_order(file, 4, 100, 7, false);
  REQUIRE(in_order.size() == 10);
  std::vector<std::int64_t> tok, tgt;
  in_order.batch(1, 2, 4, tok, tgt); // samples 2 and 3
  CHECK(tok == std::vector<std::int64_t>{8, 9, 10, 11, 12, 13, 14, 15});
  CHECK(tgt == std::vector<std::int64_t>{9, 10, 11, 12, 13, 14, 15, 16});
  // Shuffled: each epoch a permutation of the 10 samples; two seeds differ; the same seed
  // gives the same batches (every rank, any rank count).
  const data::token_samples a(file, 4, 100, 7), b(file, 4, 100, 7), c(file, 4, 100, 8);
  std::set<std::int64_t> starts;
  bool differs = false;
  for (std::uint64_t i = 0; i < 20; ++i) {
    std::vector<std::int64_t> x(4), y(4), z(4), w(4);
    a.sample(i, x, y);
    b.sample(i, z, w);
    CHECK(x == z);
    CHECK(y == w);
    CHECK(x[0] % 4 == 0);
    CHECK(y[3] == x[3] + 1);
    if (i < 10)
      starts.insert(x[0]);
    std::vector<std::int64_t> u(4), v(4);
    c.sample(i, u, v);
    differs = differs || u != x;
  }
  CHECK(starts.size() == 10);
  CHECK(differs);
  // An id outside the vocabulary is named with its place.
  const data::token_samples small(file, 4, 10, 7, false);
  CHECK_THAT(what([&] { small.batch(2, 1, 4, tok, tgt); }),
             Catch::Contains("token 10 is id 10, outside the vocabulary of 10") &&
                 Catch::Contains("--vocab"));
  // Odd bytes: not a uint16 file.
  write(temp_path("odd.bin"), bytes + "x");
  CHECK_THAT(what([] { data::token_file(temp_path("odd.bin"), data::token_format::flat16); }),
             Catch::Contains("not a whole number of uint16 tokens"));
  CHECK_THAT(what([] { (void)data::token_format_of("x.bin", "bin8"); }),
             Catch::Contains("give auto, bin16, bin32 or megatron"));
}

TEST_CASE("the permutation of samples is a bijection for every size") {
  for (std::uint64_t n : {1U, 2U, 3U, 5U, 16U, 17U, 100U, 1000U, 4097U}) {
    std::set<std::uint64_t> seen;
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto p = data::token_samples::permute(i, n, 0xfeed + n);
      CHECK(p < n);
      seen.insert(p);
    }
    CHECK(seen.size() == n);
  }
}

TEST_CASE("a Megatron-LM indexed dataset: documents from the index, samples inside them") {
  // Three documents: sequences {3, 4} (7 tokens), {2} (2 tokens: shorter than a sample),
  // {5, 5} (10 tokens); ids 100 + position.
  const std::vector<std::int32_t> sizes = {3, 4, 2, 5, 5};
  std::string bin;
  for (std::uint16_t t = 0; t < 19; ++t)
    put<std::uint16_t>(bin, static_cast<std::uint16_t>(100 + t));
  const auto prefix = temp_path("mm");
  write(prefix.string() + ".bin", bin);
  write(prefix.string() + ".idx", index_of(sizes, {0, 2, 3, 5}));
  CHECK(data::token_format_of(prefix.string() + ".bin", "auto") == data::token_format::indexed);
  auto file = std::make_shared<const data::token_file>(prefix.string() + ".bin",
                                                       data::token_format::indexed);
  REQUIRE(file->documents() == 3);
  CHECK(file->size() == 19);
  CHECK(file->document_begin(1) == 7);
  CHECK(file->document_end(2) == 19);
  // seq 3: document 0 gives (7 - 1) / 3 = 2 samples, document 1 none, document 2 three
  const data::token_samples s(file, 3, 1000, 1, false);
  REQUIRE(s.size() == 5);
  CHECK(s.short_documents() == 1);
  std::vector<std::int64_t> tok(3), tgt(3);
  s.sample(1, tok, tgt);
  CHECK(tok == std::vector<std::int64_t>{103, 104, 105});
  CHECK(tgt == std::vector<std::int64_t>{104, 105, 106}); // the document's last token
  s.sample(2, tok, tgt);
  CHECK(tok == std::vector<std::int64_t>{109, 110, 111}); // document 2, not across 1
  s.sample(5, tok, tgt);                                  // the next epoch
  CHECK(tok == std::vector<std::int64_t>{100, 101, 102});

  // Damaged indexes: each refused in one line naming the file and what is wrong.
  const auto bad = [&](const std::string& idx) {
    write(prefix.string() + ".idx", idx);
    return what([&] { data::token_file(prefix, data::token_format::indexed); });
  };
  CHECK_THAT(bad("MMIDIDX"), Catch::Contains("mm.idx: ends inside its header"));
  CHECK_THAT(bad(std::string("NOTANIDX\0", 9) + std::string(40, '\0')),
             Catch::Contains("does not start with MMIDIDX"));
  auto idx = index_of(sizes, {0, 2, 3, 5});
  CHECK_THAT(bad(idx.substr(0, idx.size() - 3)), Catch::Contains("bytes after its header"));
  CHECK_THAT(bad(index_of(sizes, {0, 2, 3, 5}, 7)), Catch::Contains("not an integer type"));
  CHECK_THAT(bad(index_of(sizes, {0, 3, 2, 5})), Catch::Contains("document 2 starts before"));
  CHECK_THAT(bad(index_of(sizes, {0, 2, 4})), Catch::Contains("document index does not run"));
  CHECK_THAT(bad(index_of({3, 4, 2, 5, 50}, {0, 5})),
             Catch::Contains("mm.bin: has 38 bytes; its index") && Catch::Contains("needs 128"));
  std::string gap = index_of(sizes, {0, 5});
  std::int64_t moved = 8; // sequence 1 said to start at byte 8, not 6
  std::memcpy(gap.data() + 9 + 8 + 1 + 8 + 8 + 4 * 5 + 8, &moved, 8);
  CHECK_THAT(bad(gap), Catch::Contains("sequence 1: length 4 at byte 8, expected at byte 6"));
  CHECK_THAT(what([] { data::token_file(temp_path("none"), data::token_format::indexed); }),
             Catch::Contains("none.idx: cannot be opened"));
}

TEST_CASE("prefetching makes the next batch ahead, the same one, and rethrows its error") {
  std::atomic<int> made{0};
  data::prefetcher<std::vector<int>> p([&](std::uint64_t i, std::vector<int>& into) {
    ++made;
    if (i == 5)
      throw std::runtime_error("batch 5 is bad");
    into.assign(3, static_cast<int>(i));
  });
  for (std::uint64_t i = 0; i < 4; ++i)
    CHECK(p.get(i) == std::vector<int>(3, static_cast<int>(i)));
  CHECK(p.get(10) == std::vector<int>(3, 10)); // out of turn: made on the spot
  CHECK(p.get(2) == std::vector<int>(3, 2));
  CHECK(p.get(3) == std::vector<int>(3, 3));
  CHECK(p.get(4) == std::vector<int>(3, 4));
  CHECK_THAT(what([&] { (void)p.get(5); }), Catch::Contains("batch 5 is bad")); // the thread's
  CHECK_THAT(what([&] { (void)p.get(5); }), Catch::Contains("batch 5 is bad")); // on the spot
  CHECK(p.get(6) == std::vector<int>(3, 6));
  CHECK(made >= 9);
}
