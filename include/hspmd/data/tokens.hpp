#pragma once
// Pre-tokenized corpora, memory-mapped (docs/data.md):
// - flat token files: little-endian uint16 (nanoGPT's train.bin) or uint32 ids, one document;
// - Megatron-LM indexed datasets: PREFIX.bin (the ids of every sequence, back to back) and
//   PREFIX.idx: "MMIDIDX\0\0", version (u64 = 1), the ids' type code (u8: 1 uint8, 2 int8,
//   3 int16, 4 int32, 5 int64, 8 uint16), the sequence count S (u64), the document index's
//   length D (u64), S sequence lengths (i32), S byte offsets into the .bin (i64), D sequence
//   indices where documents start (i64; the first 0, the last S) -- then, in multimodal files,
//   S mode bytes, ignored.
//
// `token_samples` cuts a file into samples of seq + 1 tokens (a sample's tokens and, shifted by
// one, its targets) that never cross a document's end: a document of n tokens gives
// (n - 1) / seq samples, consecutive ones sharing a token; shorter documents give none (counted).
// Sample i of the run is a function of i and the seed only -- epoch i / N, and within it the
// seeded permutation of the N samples (a Feistel network over the next power of four, walked
// until it lands below N) -- so every rank, any rank count, reads the same batch for the same
// micro-batch index. A batch of micro-batch m is samples m*b .. m*b+b-1.

#include <hspmd/core/error.hpp>
#include <hspmd/io/mapped_file.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::data {

enum class token_format { flat16, flat32, indexed };

/// The format of `path` for `--data-format` `word` (auto, bin16, bin32, megatron): auto takes a
/// .bin with a .idx beside it (or a path whose .bin and .idx exist) for Megatron-LM's, another
/// .bin for uint16 tokens. Throws naming the flag for another word.
[[nodiscard]] inline token_format token_format_of(const std::filesystem::path& path,
                                                  std::string_view word) {
  if (word == "bin16")
    return token_format::flat16;
  if (word == "bin32")
    return token_format::flat32;
  if (word == "megatron")
    return token_format::indexed;
  if (word != "auto")
    throw config_error("--data-format " + std::string(word), "is not a token format",
                       "give auto, bin16, bin32 or megatron");
  auto idx = path;
  idx.replace_extension(".idx");
  if (path.extension() == ".idx" || std::filesystem::exists(idx) ||
      std::filesystem::exists(path.string() + ".idx"))
    return token_format::indexed;
  return token_format::flat16;
}

/// A token file: its ids and its documents ([begin, end) in tokens).
class token_file {
public:
  token_file(const std::filesystem::path& path, token_format f) {
    if (f == token_format::indexed)
      open_indexed(path);
    else
      open_flat(path, f == token_format::flat16 ? 2 : 4);
  }

  [[nodiscard]] std::size_t size() const noexcept { return tokens_; }
  [[nodiscard]] std::size_t documents() const noexcept { return starts_.size() - 1; }
  [[nodiscard]] std::size_t document_begin(std::size_t d) const { return starts_.at(d); }
  [[nodiscard]] std::size_t document_end(std::size_t d) const { return starts_.at(d + 1); }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// "uint16", "int32", ...
  [[nodiscard]] const std::string& type() const noexcept { return type_; }

  /// Token `i` (< size()); a negative id reads as -1.
  [[nodiscard]] std::int64_t at(std::size_t i) const noexcept {
    const std::byte* p = bin_.bytes().data() + i * width_;
    switch (code_) {
    case 1:
      return static_cast<std::int64_t>(load<std::uint8_t>(p));
    case 2:
      return load<std::int8_t>(p);
    case 3:
      return load<std::int16_t>(p);
    case 4:
      return load<std::int32_t>(p);
    case 5:
      return load<std::int64_t>(p);
    case 9:
      return static_cast<std::int64_t>(load<std::uint32_t>(p));
    default:
      return static_cast<std::int64_t>(load<std::uint16_t>(p)); // 8
    }
  }

private:
  template <class I>
  [[nodiscard]] static std::int64_t load(const std::byte* p) noexcept {
    I v;
    std::memcpy(&v, p, sizeof v); // little-endian files on little-endian hosts
    return static_cast<std::int64_t>(v);
  }

  void open_flat(const std::filesystem::path& path, std::size_t width) {
    bin_ = io::mapped_input(path);
    name_ = path.string();
    width_ = width;
    code_ = width == 2 ? 8 : 9;
    type_ = width == 2 ? "uint16" : "uint32";
    const std::size_t bytes = bin_.bytes().size();
    if (bytes % width != 0)
      throw config_error(name_,
                         "has " + std::to_string(bytes) + " bytes, not a whole number of " + type_ +
                             " tokens",
                         width == 2 ? "give --data-format bin32 for 4-byte ids, or check the file"
                                    : "give --data-format bin16 for 2-byte ids, or check the file");
    tokens_ = bytes / width;
    starts_ = {0, tokens_};
  }

  void open_indexed(const std::filesystem::path& given) {
    // PREFIX, PREFIX.bin or PREFIX.idx
    std::filesystem::path prefix = given;
    if (given.extension() == ".bin" || given.extension() == ".idx")
      prefix.replace_extension();
    const std::filesystem::path idx_path = prefix.string() + ".idx";
    const std::filesystem::path bin_path = prefix.string() + ".bin";
    const io::mapped_input idx(idx_path);
    bin_ = io::mapped_input(bin_path);
    name_ = bin_path.string();
    const std::string in = idx_path.string();
    const auto bytes = idx.bytes();
    std::size_t at = 0;
    const auto need = [&](std::size_t n, const char* field) {
      if (bytes.size() - at < n)
        throw config_error(in, std::string("ends inside its ") + field,
                           "give the .idx Megatron-LM's builder wrote with its .bin");
    };
    const auto u64 = [&](const char* field) {
      need(8, field);
      std::uint64_t v;
      std::memcpy(&v, bytes.data() + at, 8);
      at += 8;
      return v;
    };
    need(9, "header");
    if (std::memcmp(bytes.data(), "MMIDIDX\0\0", 9) != 0)
      throw config_error(in, "does not start with MMIDIDX",
                         "give a Megatron-LM indexed dataset's .idx (or --data-format bin16 or "
                         "bin32 for a flat token file)");
    at = 9;
    if (const auto v = u64("version"); v != 1)
      throw config_error(in, "is version " + std::to_string(v), "give a version 1 index");
    need(1, "type code");
    code_ = static_cast<int>(bytes[at++]);
    static constexpr std::pair<int, const char*> types[] = {
        {1, "uint8"}, {2, "int8"}, {3, "int16"}, {4, "int32"}, {5, "int64"}, {8, "uint16"}};
    const auto* t = std::ranges::find(types, code_, &std::pair<int, const char*>::first);
    if (t == std::end(types))
      throw config_error(in, "has type code " + std::to_string(code_) + ", not an integer type",
                         "token ids are integers: codes 1-5 or 8");
    type_ = t->second;
    width_ = code_ == 5 ? 8 : code_ == 4 ? 4 : (code_ == 3 || code_ == 8) ? 2 : 1;
    const std::uint64_t sequences = u64("sequence count");
    const std::uint64_t doc_entries = u64("document count");
    const std::size_t rest = bytes.size() - at;
    if (sequences > rest / 12 || doc_entries > rest / 8 ||
        (rest != sequences * 12 + doc_entries * 8 && rest != sequences * 13 + doc_entries * 8))
      throw config_error(in,
                         "has " + std::to_string(rest) + " bytes after its header for " +
                             std::to_string(sequences) + " sequences and " +
                             std::to_string(doc_entries) + " document entries",
                         "give the .idx written with this .bin (the file is cut or not an index)");
    const std::size_t sizes_at = at;
    const auto i32 = [&](std::size_t k) {
      std::int32_t v;
      std::memcpy(&v, bytes.data() + sizes_at + 4 * k, 4);
      return v;
    };
    const std::size_t pointers_at = sizes_at + 4 * sequences;
    const std::size_t docs_at = pointers_at + 8 * sequences;
    const auto i64 = [&](std::size_t base, std::size_t k) {
      std::int64_t v;
      std::memcpy(&v, bytes.data() + base + 8 * k, 8);
      return v;
    };
    // The sequences, back to back from offset 0 (as Megatron-LM's builder writes them).
    std::vector<std::size_t> seq_start(sequences + 1, 0);
    std::int64_t expect = 0;
    for (std::size_t k = 0; k < sequences; ++k) {
      const std::int32_t n = i32(k);
      const std::int64_t p = i64(pointers_at, k);
      if (n < 0 || p != expect)
        throw config_error(in,
                           "sequence " + std::to_string(k) + ": length " + std::to_string(n) +
                               " at byte " + std::to_string(p) + ", expected at byte " +
                               std::to_string(expect),
                           "give an index whose sequences follow each other in the .bin");
      seq_start[k] = static_cast<std::size_t>(p) / width_;
      expect = p + static_cast<std::int64_t>(n) * static_cast<std::int64_t>(width_);
      seq_start[k + 1] = static_cast<std::size_t>(expect) / width_;
    }
    if (static_cast<std::uint64_t>(expect) > bin_.bytes().size())
      throw config_error(name_,
                         "has " + std::to_string(bin_.bytes().size()) + " bytes; its index " + in +
                             " needs " + std::to_string(expect),
                         "give the .bin written with this .idx");
    tokens_ = static_cast<std::size_t>(expect) / width_;
    if (doc_entries < 1 || i64(docs_at, 0) != 0 ||
        i64(docs_at, doc_entries - 1) != static_cast<std::int64_t>(sequences))
      throw config_error(
          in, "document index does not run from sequence 0 to " + std::to_string(sequences),
          "give the .idx Megatron-LM's builder wrote");
    starts_.clear();
    for (std::size_t d = 0; d < doc_entries; ++d) {
      const std::int64_t s = i64(docs_at, d);
      if ((d > 0 && s < i64(docs_at, d - 1)) || s > static_cast<std::int64_t>(sequences))
        throw config_error(in,
                           "document " + std::to_string(d) + " starts before document " +
                               std::to_string(d - 1),
                           "give the .idx Megatron-LM's builder wrote");
      starts_.push_back(seq_start[static_cast<std::size_t>(s)]);
    }
  }

  io::mapped_input bin_;
  std::string name_, type_;
  std::size_t width_ = 2;
  int code_ = 8; // the .idx's type codes; 9: uint32 (flat files)
  std::size_t tokens_ = 0;
  std::vector<std::size_t> starts_; // documents' first tokens, then the end
};

/// Samples of `seq` + 1 tokens of a token file, in a seeded order (see the file comment).
class token_samples {
public:
  token_samples(std::shared_ptr<const token_file> file, std::size_t seq, std::size_t vocab,
                std::uint64_t seed, bool shuffle = true)
      : file_(std::move(file)), seq_(seq), vocab_(vocab), seed_(seed), shuffle_(shuffle) {
    if (seq_ == 0)
      throw config_error(file_->name(), "samples of 0 tokens", "give --seq of at least 1");
    first_.push_back(0);
    for (std::size_t d = 0; d < file_->documents(); ++d) {
      const std::size_t n = file_->document_end(d) - file_->document_begin(d);
      const std::size_t k = n > seq_ ? (n - 1) / seq_ : 0;
      if (k > 0) {
        docs_.push_back(d);
        first_.push_back(first_.back() + k);
      } else {
        ++short_;
      }
    }
    if (first_.back() == 0)
      throw config_error(file_->name(),
                         "has no document of " + std::to_string(seq_ + 1) + " tokens or more",
                         "give a larger corpus or a shorter --seq");
  }

  /// Samples in one pass over the file.
  [[nodiscard]] std::size_t size() const noexcept { return first_.back(); }
  /// Documents shorter than a sample (they give none).
  [[nodiscard]] std::size_t short_documents() const noexcept { return short_; }
  [[nodiscard]] const token_file& file() const noexcept { return *file_; }

  /// Sample `i` of the run (any epoch): `seq` tokens and their targets, each the next token.
  void sample(std::uint64_t i, std::span<std::int64_t> tokens,
              std::span<std::int64_t> targets) const {
    const std::uint64_t n = size();
    const std::uint64_t epoch = i / n;
    std::uint64_t j = i % n;
    if (shuffle_)
      j = permute(j, n, seed_ + epoch * 0x9e3779b97f4a7c15ULL);
    const auto it = std::ranges::upper_bound(first_, j) - 1;
    const auto k = static_cast<std::size_t>(it - first_.begin());
    const std::size_t at = file_->document_begin(docs_[k]) + (j - *it) * seq_;
    for (std::size_t s = 0; s <= seq_; ++s) {
      const std::int64_t id = file_->at(at + s);
      if (id < 0 || static_cast<std::uint64_t>(id) >= vocab_)
        throw config_error(file_->name(),
                           "token " + std::to_string(at + s) + " is id " + std::to_string(id) +
                               ", outside the vocabulary of " + std::to_string(vocab_),
                           "give --vocab the tokenizer's vocabulary size (above every id)");
      if (s < seq_)
        tokens[s] = id;
      if (s > 0)
        targets[s - 1] = id;
    }
  }

  /// Micro-batch `index` of `batch` samples (samples index*batch ...), as the example feeds
  /// take it.
  void batch(std::uint64_t index, std::size_t batch, std::size_t seq,
             std::vector<std::int64_t>& tokens, std::vector<std::int64_t>& targets) const {
    if (seq != seq_)
      throw config_error(file_->name(), "cut into samples of " + std::to_string(seq_) + " tokens",
                         "read batches of the --seq the samples were cut for");
    tokens.resize(batch * seq);
    targets.resize(batch * seq);
    for (std::size_t b = 0; b < batch; ++b)
      sample(index * batch + b, std::span(tokens).subspan(b * seq, seq),
             std::span(targets).subspan(b * seq, seq));
  }

  /// A permutation of [0, n) keyed by `key`: a 4-round Feistel network on the smallest even
  /// number of bits that holds n, re-applied while the result is n or more (cycle walking).
  [[nodiscard]] static std::uint64_t permute(std::uint64_t x, std::uint64_t n, std::uint64_t key) {
    unsigned bits = 2;
    while (bits < 64 && (std::uint64_t{1} << bits) < n)
      bits += 2;
    const unsigned half = bits / 2;
    const std::uint64_t mask = (std::uint64_t{1} << half) - 1;
    do {
      std::uint64_t l = x >> half;
      std::uint64_t r = x & mask;
      for (std::uint64_t round = 0; round < 4; ++round) {
        const std::uint64_t f = mix(r ^ (key + round * 0xbf58476d1ce4e5b9ULL)) & mask;
        const std::uint64_t t = l ^ f;
        l = r;
        r = t;
      }
      x = (l << half) | r;
    } while (x >= n);
    return x;
  }

private:
  [[nodiscard]] static std::uint64_t mix(std::uint64_t z) noexcept { // splitmix64's finalizer
    z = (z ^ (z >> 30U)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27U)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31U);
  }

  std::shared_ptr<const token_file> file_;
  std::size_t seq_, vocab_;
  std::uint64_t seed_;
  bool shuffle_;
  std::vector<std::size_t> docs_;    // documents that give samples
  std::vector<std::uint64_t> first_; // their first sample's index, then the count
  std::size_t short_ = 0;
};

} // namespace hspmd::data
