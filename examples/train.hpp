#pragma once
// Shared driver of the example models: common flags, synthetic data generators, and a
// single-process training run with a summary of what was measured.

#include <hspmd/hspmd.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace example {

/// Flags every example takes.
struct common_options {
  std::size_t steps = 20;
  std::size_t batch = 8;
  std::uint64_t seed = 1;
  double lr = 1e-3;
  double clip = 1.0;
  std::vector<std::string> data; ///< text file (LM) or CIFAR-10 .bin files (images)
  bool print_graph = false;
  bool profile = false;
};

inline void add_common(CLI::App& app, common_options& o) {
  app.add_option("--steps", o.steps, "training steps")->capture_default_str();
  app.add_option("--batch", o.batch, "samples per step")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of parameters and synthetic data")->capture_default_str();
  app.add_option("--lr", o.lr, "Adam learning rate")->capture_default_str();
  app.add_option("--clip", o.clip, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  app.add_option("--data", o.data,
                 "real data: a text file (language models) or CIFAR-10 .bin files (images); "
                 "seeded synthetic data when absent");
  app.add_flag("--print-graph", o.print_graph, "print the traced graph (op, name, shape, FLOPs)");
  app.add_flag("--profile", o.profile, "time each op kind and print where a step's time goes");
}

/// Traces nothing itself: trains `g` for `o.steps` with Adam, feeding each step with `feed`,
/// and prints the model size, FLOPs per step, progress and a summary. Returns 0.
inline int train(const std::string& model, const hspmd::graph::graph& g, const common_options& o,
                 const std::function<void(hspmd::exec::executor<float>&, std::size_t)>& feed) {
  std::size_t params = 0;
  for (auto id : g.parameters())
    params += g[id].out.size();
  const auto cost = hspmd::graph::total_cost(g);
  std::printf("%s: %zu parameters, %zu graph nodes, %.3f GFLOP per step (forward %.3f, backward "
              "%.3f), batch %zu\n",
              model.c_str(), params, g.size(), (cost.forward_flops + cost.backward_flops) / 1e9,
              cost.forward_flops / 1e9, cost.backward_flops / 1e9, o.batch);
  if (o.print_graph)
    hspmd::graph::print(std::cout, g);
  hspmd::exec::executor<float> ex(g, o.seed);
  ex.set_profiling(o.profile);
  hspmd::exec::trainer tr(ex, hspmd::exec::adam(o.lr));
  tr.clip = o.clip;
  tr.samples_per_step = o.batch;
  const auto start = std::chrono::steady_clock::now();
  const auto losses = tr.run(o.steps, feed, &std::cout);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!losses.empty())
    std::printf("%s: loss %.4f -> %.4f over %zu steps, %.1f ms/step, %.1f GFLOP/s\n", model.c_str(),
                losses.front(), losses.back(), losses.size(),
                1e3 * seconds / static_cast<double>(losses.size()),
                (cost.forward_flops + cost.backward_flops) * static_cast<double>(losses.size()) /
                    seconds / 1e9);
  if (o.profile)
    hspmd::exec::write_profile(std::cout, ex, losses.size());
  return 0;
}

/// Token sequences from a seeded random first-order Markov chain over `vocab` tokens (each
/// token has 2 likely successors): learnable, unlike uniform noise.
class markov_text {
public:
  markov_text(std::size_t vocab, std::uint64_t seed) : vocab_(vocab), rng_(seed) {
    std::mt19937_64 table(seed ^ 0xabcdefULL);
    next_.resize(vocab * 2);
    for (auto& n : next_)
      n = static_cast<std::int64_t>(table() % vocab);
  }
  void batch(std::size_t batch, std::size_t seq, std::vector<std::int64_t>& tokens,
             std::vector<std::int64_t>& targets) {
    tokens.resize(batch * seq);
    targets.resize(batch * seq);
    for (std::size_t b = 0; b < batch; ++b) {
      auto cur = static_cast<std::int64_t>(rng_() % vocab_);
      for (std::size_t s = 0; s < seq; ++s) {
        const auto nxt = next_[static_cast<std::size_t>(cur) * 2 + rng_() % 2];
        tokens[b * seq + s] = cur;
        targets[b * seq + s] = nxt;
        cur = nxt;
      }
    }
  }

private:
  std::size_t vocab_;
  std::mt19937_64 rng_;
  std::vector<std::int64_t> next_;
};

/// Images of `classes` classes: a fixed random prototype per class plus noise.
class prototype_images {
public:
  prototype_images(std::size_t values, std::size_t classes, std::uint64_t seed)
      : values_(values), classes_(classes), rng_(seed), protos_(values * classes) {
    std::mt19937_64 fixed(seed ^ 0x1234ULL);
    std::normal_distribution<float> nd(0.0F, 1.0F);
    for (auto& v : protos_)
      v = nd(fixed);
  }
  void batch(std::size_t batch, std::vector<float>& x, std::vector<std::int64_t>& y) {
    std::normal_distribution<float> nd(0.0F, 1.0F);
    x.resize(batch * values_);
    y.resize(batch);
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t c = rng_() % classes_;
      y[b] = static_cast<std::int64_t>(c);
      for (std::size_t i = 0; i < values_; ++i)
        x[b * values_ + i] = protos_[c * values_ + i] + 0.5F * nd(rng_);
    }
  }

private:
  std::size_t values_;
  std::size_t classes_;
  std::mt19937_64 rng_;
  std::vector<float> protos_;
};

/// Runs `body` and turns an hspmd error into one line on stderr and exit code 1.
template <class F>
int guarded(F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

} // namespace example
