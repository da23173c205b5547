#pragma once
// An engine's RAM tier (train/ram_tier.hpp) across the re-balances of one run.

#include <hspmd/train/ram_tier.hpp>

#include <concepts>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace hspmd::train {

/// An engine's RAM tier across the layouts of one run: a new tier (job JOB-L<k>) after each
/// re-balance, the previous one's folders retired once the new one has saved three times.
template <std::floating_point T, class Comm>
class ram_keeper {
public:
  /// The tier of the current layout, made now if there is none (collective).
  void start(Comm& comm, const ram_options& o, std::span<const training_tensor<T>> tensors) {
    if (tier_)
      return;
    ram_options mine = o;
    mine.job = o.job + "-L" + std::to_string(layouts_);
    mine.retire.insert(mine.retire.end(), retired_.begin(), retired_.end());
    job_ = mine.job;
    tier_ = std::make_unique<ram_tier<T, Comm>>(comm, std::move(mine), tensors);
  }
  void save(Comm& comm, const ram_options& o, std::size_t step,
            std::span<const training_tensor<T>> tensors, const nlohmann::json& meta) {
    start(comm, o, tensors);
    tier_->save(step, tensors, meta);
  }
  void poll() {
    if (tier_)
      tier_->poll();
  }
  /// Waits for the tier's copies and records; what it cost so far.
  [[nodiscard]] ram_stats finish() {
    ram_stats s = done_;
    if (tier_) {
      tier_->finish();
      s.add(tier_->stats());
    }
    return s;
  }
  /// Before the state's layout changes: the next save starts a new tier.
  void relayout() {
    if (!tier_)
      return;
    tier_->finish();
    done_.add(tier_->stats());
    tier_.reset();
    retired_.push_back(job_);
    ++layouts_;
  }

private:
  std::unique_ptr<ram_tier<T, Comm>> tier_;
  std::string job_;
  std::size_t layouts_ = 0;
  std::vector<std::string> retired_;
  ram_stats done_;
};

} // namespace hspmd::train
