#pragma once
// Plain text for the language models: whitespace tokenization, a vocabulary of the most frequent
// words (ties broken alphabetically, so every rank builds the same one), id 0 for unknown words,
// and batches of (tokens, next-token targets) cut from the token stream.

#include <hspmd/core/error.hpp>
#include <hspmd/io/json_input.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace hspmd::data {

/// A tokenized text with its vocabulary.
class text_corpus {
public:
  /// Reads `file`; keeps the `vocabulary - 1` most frequent words (id 0 is "<unk>"). Throws
  /// `config_error` naming the file when it cannot be read or has fewer than two tokens.
  text_corpus(const std::filesystem::path& file, std::size_t vocabulary) : source_(file.string()) {
    build(hspmd::io::read_text_file(file, std::size_t{1} << 30U), vocabulary);
  }
  /// From text in memory (`source` names it in errors).
  static text_corpus from_string(const std::string& text, std::size_t vocabulary,
                                 std::string source = "<text>") {
    text_corpus c;
    c.source_ = std::move(source);
    c.build(text, vocabulary);
    return c;
  }

  [[nodiscard]] const std::vector<std::int64_t>& tokens() const noexcept { return ids_; }
  [[nodiscard]] const std::vector<std::string>& vocabulary() const noexcept { return words_; }
  [[nodiscard]] std::size_t unknown_count() const noexcept { return unknown_; }

  /// Batch `index` of `batch` sequences of `seq` tokens, cut consecutively from the stream
  /// (wrapping around), and the targets: each token's successor.
  void batch(std::size_t index, std::size_t batch_size, std::size_t seq,
             std::vector<std::int64_t>& tokens, std::vector<std::int64_t>& targets) const {
    tokens.resize(batch_size * seq);
    targets.resize(batch_size * seq);
    const std::size_t n = ids_.size();
    std::size_t at = (index * batch_size * seq) % n;
    for (std::size_t i = 0; i < batch_size * seq; ++i) {
      tokens[i] = ids_[(at + i) % n];
      targets[i] = ids_[(at + i + 1) % n];
    }
  }

private:
  text_corpus() = default;

  void build(const std::string& text, std::size_t vocabulary) {
    if (vocabulary < 2)
      throw config_error(source_, "vocabulary of " + std::to_string(vocabulary),
                         "at least 2 entries (<unk> and one word)");
    std::vector<std::string> words;
    std::istringstream in(text);
    for (std::string w; in >> w;)
      words.push_back(std::move(w));
    if (words.size() < 2)
      throw config_error(source_, "has " + std::to_string(words.size()) + " tokens",
                         "a text file with at least two whitespace-separated words");
    std::map<std::string, std::size_t> counts;
    for (const auto& w : words)
      ++counts[w];
    std::vector<std::pair<std::string, std::size_t>> by_count(counts.begin(), counts.end());
    std::stable_sort(by_count.begin(), by_count.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    words_ = {"<unk>"};
    std::unordered_map<std::string, std::int64_t> id_of;
    for (std::size_t i = 0; i < by_count.size() && words_.size() < vocabulary; ++i) {
      id_of[by_count[i].first] = static_cast<std::int64_t>(words_.size());
      words_.push_back(by_count[i].first);
    }
    ids_.reserve(words.size());
    for (const auto& w : words) {
      const auto it = id_of.find(w);
      ids_.push_back(it == id_of.end() ? 0 : it->second);
      unknown_ += it == id_of.end() ? 1U : 0U;
    }
  }

  std::string source_;
  std::vector<std::string> words_;
  std::vector<std::int64_t> ids_;
  std::size_t unknown_ = 0;
};

} // namespace hspmd::data
