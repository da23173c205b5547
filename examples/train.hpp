#pragma once
// What the example models share besides the library trainer: the --data flag and the synthetic
// or real data each model family trains on. The loop itself is hspmd::train::trainer.

#include <hspmd/data/prefetch.hpp>
#include <hspmd/data/tokens.hpp>
#include <hspmd/hspmd.hpp>
#include <hspmd/train/train_flags.hpp>

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace example {

using sink = hspmd::exec::batch_sink<float>;
using feed_fn = hspmd::exec::feed_fn<float>;

/// The trainer's options plus the data files.
struct options {
  hspmd::train::train_options train;
  std::vector<std::string> data; ///< a text or token file (LM) or CIFAR-10 .bin files (images)
  std::string data_format = "auto";
  std::string valid_data; ///< language models: a token file evaluation reads
};

inline void add_common(CLI::App& app, options& o) {
  hspmd::train::add_train_flags(app, o.train);
  app.add_option("--data", o.data,
                 "real data: a text or token file (language models; docs/data.md) or CIFAR-10 "
                 ".bin files (images); seeded synthetic data when absent");
  app.add_option("--data-format", o.data_format,
                 "language models' --data: text (words, a vocabulary of the most frequent), "
                 "bin16 or bin32 (flat uint16/uint32 token ids, as nanoGPT's train.bin), "
                 "megatron (Megatron-LM's PREFIX.bin + PREFIX.idx), or auto (by the file: .bin "
                 "with an .idx beside it megatron, other .bin bin16, else text)")
      ->capture_default_str();
  app.add_option("--valid-data", o.valid_data,
                 "language models: the token file evaluation reads (same format as --data), in "
                 "order; without it evaluation reads training samples");
}

/// Evaluation batches come from this index on (synthetic data: never drawn for training).
inline constexpr std::uint64_t held_out = std::uint64_t{1} << 40U;

/// Token sequences from a seeded random first-order Markov chain over `vocab` tokens (each token
/// has 2 likely successors): learnable, unlike uniform noise. Batch i depends only on i.
class markov_text {
public:
  markov_text(std::size_t vocab, std::uint64_t seed) : vocab_(vocab), seed_(seed) {
    std::mt19937_64 table(seed ^ 0xabcdefULL);
    next_.resize(vocab * 2);
    for (auto& n : next_)
      n = static_cast<std::int64_t>(table() % vocab);
  }
  void batch(std::uint64_t index, std::size_t batch, std::size_t seq,
             std::vector<std::int64_t>& tokens, std::vector<std::int64_t>& targets) const {
    std::mt19937_64 rng(seed_ + index * 0x9e3779b97f4a7c15ULL);
    tokens.resize(batch * seq);
    targets.resize(batch * seq);
    for (std::size_t b = 0; b < batch; ++b) {
      auto cur = static_cast<std::int64_t>(rng() % vocab_);
      for (std::size_t s = 0; s < seq; ++s) {
        const auto nxt = next_[static_cast<std::size_t>(cur) * 2 + rng() % 2];
        tokens[b * seq + s] = cur;
        targets[b * seq + s] = nxt;
        cur = nxt;
      }
    }
  }

private:
  std::size_t vocab_;
  std::uint64_t seed_;
  std::vector<std::int64_t> next_;
};

/// Images of `classes` classes: a fixed random prototype per class plus noise; batch i depends
/// only on i.
class prototype_images {
public:
  prototype_images(std::size_t values, std::size_t classes, std::uint64_t seed)
      : values_(values), classes_(classes), seed_(seed), protos_(values * classes) {
    std::mt19937_64 fixed(seed ^ 0x1234ULL);
    std::normal_distribution<float> nd(0.0F, 1.0F);
    for (auto& v : protos_)
      v = nd(fixed);
  }
  void batch(std::uint64_t index, std::size_t batch, std::vector<float>& x,
             std::vector<std::int64_t>& y) const {
    std::mt19937_64 rng(seed_ + index * 0x9e3779b97f4a7c15ULL);
    std::normal_distribution<float> nd(0.0F, 1.0F);
    x.resize(batch * values_);
    y.resize(batch);
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t c = rng() % classes_;
      y[b] = static_cast<std::int64_t>(c);
      for (std::size_t i = 0; i < values_; ++i)
        x[b * values_ + i] = protos_[c * values_ + i] + 0.5F * nd(rng);
    }
  }

private:
  std::size_t values_;
  std::size_t classes_;
  std::uint64_t seed_;
  std::vector<float> protos_;
};

/// The training feed (batches from 0) and the evaluation feed (batches from `eval_from`) of a
/// text source: `source->batch(index, batch, seq, tokens, targets)`.
template <class Source>
std::pair<feed_fn, feed_fn> token_feeds(std::shared_ptr<Source> source, std::size_t b,
                                        std::size_t seq, std::uint64_t eval_from) {
  const auto feed = [source, b, seq](std::uint64_t offset) -> feed_fn {
    return [source, b, seq, offset](sink& s, std::size_t i) {
      std::vector<std::int64_t> tokens, targets;
      source->batch(offset + i, b, seq, tokens, targets);
      s.set_input("tokens", tokens);
      s.set_input("targets", targets);
    };
  };
  return {feed(0), feed(eval_from)};
}

/// The same for an image source: `source->batch(index, batch, images, labels)`.
template <class Source>
std::pair<feed_fn, feed_fn> image_feeds(std::shared_ptr<Source> source, std::size_t b,
                                        std::uint64_t eval_from) {
  const auto feed = [source, b](std::uint64_t offset) -> feed_fn {
    return [source, b, offset](sink& s, std::size_t i) {
      std::vector<float> x;
      std::vector<std::int64_t> y;
      source->batch(offset + i, b, x, y);
      s.set_input("images", x);
      s.set_input("labels", y);
    };
  };
  return {feed(0), feed(eval_from)};
}

/// A feed of micro-batches `source->batch(offset + i, ...)` made ahead on a background thread
/// (data/prefetch.hpp).
template <class Source>
feed_fn prefetched_tokens(std::shared_ptr<const Source> source, std::size_t b, std::size_t seq,
                          std::uint64_t offset) {
  using batch = std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>;
  auto ahead = std::make_shared<hspmd::data::prefetcher<batch>>(
      [source, b, seq, offset](std::uint64_t i, batch& into) {
        source->batch(offset + i, b, seq, into.first, into.second);
      });
  return [ahead](sink& s, std::size_t i) {
    const batch& x = ahead->get(i);
    s.set_input("tokens", x.first);
    s.set_input("targets", x.second);
  };
}

/// Training and evaluation feeds of a token file (data/tokens.hpp): samples in the seed's order;
/// evaluation reads --valid-data's samples in order, else the training file's.
inline std::pair<feed_fn, feed_fn> token_file_feeds(const options& o, std::size_t vocab,
                                                    std::size_t seq) {
  namespace d = hspmd::data;
  const std::size_t b = o.train.batch;
  const auto open = [&](const std::string& path, bool shuffle) {
    auto file =
        std::make_shared<const d::token_file>(path, d::token_format_of(path, o.data_format));
    auto samples =
        std::make_shared<const d::token_samples>(file, seq, vocab, o.train.seed, shuffle);
    std::printf(
        "%s: %s, %zu %s tokens in %zu document(s): %zu samples of %zu tokens%s%s\n",
        shuffle ? "data" : "validation data", file->name().c_str(), file->size(),
        file->type().c_str(), file->documents(), samples->size(), seq + 1,
        samples->short_documents() > 0
            ? (", " + std::to_string(samples->short_documents()) + " shorter document(s) skipped")
                  .c_str()
            : "",
        shuffle ? ", shuffled by --seed" : ", in order");
    return samples;
  };
  const auto train = open(o.data.front(), true);
  if (o.valid_data.empty()) {
    std::printf("evaluation: the training samples in order (no --valid-data)\n");
    return {prefetched_tokens(train, b, seq, 0),
            prefetched_tokens(std::make_shared<const d::token_samples>(
                                  std::shared_ptr<const d::token_file>(train, &train->file()), seq,
                                  vocab, o.train.seed, false),
                              b, seq, 0)};
  }
  return {prefetched_tokens(train, b, seq, 0),
          prefetched_tokens(open(o.valid_data, false), b, seq, 0)};
}

/// Training and evaluation feeds of a language model: --data, a token file (above) or a text
/// file (evaluation reads the text from its middle on), else Markov text.
inline std::pair<feed_fn, feed_fn> text_feeds(const options& o, std::size_t vocab,
                                              std::size_t seq) {
  const std::size_t b = o.train.batch;
  const bool tokens =
      !o.data.empty() && o.data_format != "text" &&
      (o.data_format != "auto" || std::filesystem::path(o.data.front()).extension() == ".bin" ||
       std::filesystem::path(o.data.front()).extension() == ".idx" ||
       std::filesystem::exists(o.data.front() + ".idx"));
  if (tokens)
    return token_file_feeds(o, vocab, seq);
  if (!o.valid_data.empty())
    throw hspmd::config_error("--valid-data " + o.valid_data,
                              o.data.empty() ? "needs --data"
                                             : "needs token files: a text file "
                                               "builds its vocabulary from itself",
                              "give --data and --valid-data as token files (docs/data.md)");
  if (!o.data.empty()) {
    auto corpus = std::make_shared<hspmd::data::text_corpus>(o.data.front(), vocab);
    std::printf("data: %s, %zu tokens, vocabulary %zu (%zu unknown)\n", o.data.front().c_str(),
                corpus->tokens().size(), corpus->vocabulary().size(), corpus->unknown_count());
    const std::size_t half = corpus->tokens().size() / 2 / (b * seq + 1);
    return token_feeds(corpus, b, seq, half);
  }
  return token_feeds(std::make_shared<markov_text>(vocab, o.train.seed), b, seq, held_out);
}

/// Training and evaluation feeds of an image model: CIFAR-10 files with --data (evaluation reads
/// them too), else prototype images.
inline std::pair<feed_fn, feed_fn> image_feeds(const options& o, std::size_t image,
                                               std::size_t classes) {
  const std::size_t b = o.train.batch;
  if (!o.data.empty()) {
    if (image != 32)
      throw hspmd::config_error("--data", "CIFAR-10 images are 32x32", "use --image 32");
    std::vector<std::filesystem::path> files(o.data.begin(), o.data.end());
    auto c = std::make_shared<hspmd::data::cifar10>(files);
    std::printf("data: %zu CIFAR-10 images from %zu file(s)\n", c->size(), files.size());
    return image_feeds(c, b, c->size() / 2 / b);
  }
  return image_feeds(std::make_shared<prototype_images>(3 * image * image, classes, o.train.seed),
                     b, held_out);
}

/// --norm-eps, the model's normalization epsilon `eps`.
inline CLI::Option* add_norm_eps(CLI::App& app, double& eps) {
  return app
      .add_option("--norm-eps", eps,
                  "the normalization layers' epsilon (with --init-from an import that recorded "
                  "config.json's: that one)")
      ->capture_default_str();
}

/// With --init-from a checkpoint `hspmd-checkpoint import` wrote with config.json's epsilon:
/// that epsilon, unless --norm-eps (`given`) says otherwise -- then refused if it differs.
inline void settle_norm_eps(const options& o, double& eps, bool given) {
  if (o.train.init_from.empty())
    return;
  const auto dir = hspmd::train::find_checkpoint(o.train.init_from);
  if (!dir)
    return; // the trainer names what is wrong with it
  const auto meta = hspmd::train::read_manifest(*dir).value("meta", nlohmann::json::object());
  if (!meta.contains("imported") || !meta["imported"].contains("norm_eps"))
    return;
  const double recorded = meta["imported"]["norm_eps"].get<double>();
  const std::string field = meta["imported"].value("norm_eps_field", "config.json");
  const auto text = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  if (given && std::abs(eps - recorded) > 1e-9 * recorded)
    throw hspmd::config_error("--norm-eps " + text(eps),
                              "differs from the epsilon " + dir->string() + " was imported with (" +
                                  text(recorded) + ", " + field + ")",
                              "drop --norm-eps, or give " + text(recorded));
  if (!given && eps != recorded)
    std::printf("normalization epsilon %s from %s (%s; the model's default is %s)\n",
                text(recorded).c_str(), dir->string().c_str(), field.c_str(), text(eps).c_str());
  eps = recorded;
}

/// Parses the flags and runs `body`; an error of a single-process run becomes one line on
/// stderr and exit code 1 (distributed, the trainer ends the job itself).
template <class F>
int main_of(CLI::App& app, int argc, char** argv, F&& body) {
  if (const auto rc = hspmd::exec::parse_flags(app, argc, argv))
    return *rc;
  return hspmd::exec::report_errors([&] {
    body();
    return 0;
  });
}

/// Trains the model `trace` traces (at a batch) with the library trainer on the feeds; a
/// calibrated run traces it at half the batch too (train_options::trace_at).
inline void fit(const std::function<hspmd::graph::graph(std::size_t)>& trace, options o,
                const std::pair<feed_fn, feed_fn>& feeds) {
  o.train.trace_at = trace;
  hspmd::train::trainer<float> tr(trace(o.train.batch), o.train);
  tr.fit(feeds.first, feeds.second);
}

} // namespace example
