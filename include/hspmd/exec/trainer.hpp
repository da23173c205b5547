#pragma once
// A single-process training loop: feed a batch, forward, backward, clip, optimizer step; prints a
// progress bar with the loss, step time and throughput.
//
//     exec::trainer tr(ex, exec::adam(1e-3));
//     tr.clip = 1.0;
//     auto losses = tr.run(50, [&](exec::executor<float>& e, std::size_t step) { feed(e, step); },
//                          std::cout);

#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace hspmd::exec {

/// Runs training steps on one process.
template <std::floating_point T, class Optimizer>
class trainer {
public:
  trainer(executor<T>& ex, Optimizer opt) : ex_(&ex), opt_(std::move(opt)) {}

  double clip = 0.0;                ///< clip gradients to this global norm (0: no clipping)
  std::size_t samples_per_step = 0; ///< for the throughput line (0: not shown)

  /// Runs `steps` steps; `feed(executor, step)` sets the inputs of each step. Prints progress to
  /// `out` when given. Returns the loss of every step.
  std::vector<double> run(std::size_t steps,
                          const std::function<void(executor<T>&, std::size_t)>& feed,
                          std::ostream* out = nullptr) {
    std::vector<double> losses;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t s = 0; s < steps; ++s) {
      feed(*ex_, s);
      ex_->set_step(s);
      const double loss = static_cast<double>(ex_->forward());
      ex_->backward();
      if (clip > 0.0)
        last_norm_ = clip_grad_norm(*ex_, clip);
      opt_.step(*ex_);
      losses.push_back(loss);
      if (out != nullptr && (s + 1 == steps || (s + 1) % std::max<std::size_t>(1, steps / 20) == 0))
        progress(*out, s + 1, steps, loss,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return losses;
  }

  [[nodiscard]] Optimizer& optimizer() noexcept { return opt_; }
  [[nodiscard]] double last_grad_norm() const noexcept { return last_norm_; }

private:
  void progress(std::ostream& out, std::size_t done, std::size_t total, double loss,
                double seconds) const {
    constexpr std::size_t width = 24;
    const std::size_t filled = width * done / total;
    std::string bar(filled, '#');
    bar.resize(width, '.');
    const double per_step = seconds / static_cast<double>(done);
    char line[200];
    std::snprintf(line, sizeof line, "step %5zu/%-5zu [%s] loss %10.4f  %8.2f ms/step", done, total,
                  bar.c_str(), loss, 1e3 * per_step);
    out << line;
    if (samples_per_step > 0) {
      std::snprintf(line, sizeof line, "  %10.1f samples/s",
                    static_cast<double>(samples_per_step) / per_step);
      out << line;
    }
    out << "\n" << std::flush;
  }

  executor<T>* ex_;
  Optimizer opt_;
  double last_norm_ = 0.0;
};

} // namespace hspmd::exec
