#pragma once
// Dynamic loss scaling for training with float16 activations and gradients: binary16's smallest
// normal is 2^-14, so small gradients would flush to zero; the loss is multiplied by `scale()`
// before the backward, which multiplies every gradient by it, and the optimizer divides it out
// (pass 1 / scale() as its gradient factor, with clipping's). An overflow shows as a non-finite
// gradient norm -- the norm that clipping computes anyway, so detecting it costs no extra pass:
//
//     train::dynamic_loss_scale ls;                     // 2^16, x2 after 2000 clean steps
//     ... forward, seed the backward with ls.scale(), backward ...
//     const double norm2 = grad_norm_squared(ex);       // scaled gradients
//     if (ls.update(!std::isfinite(norm2)))            // false: skip this step, scale halved
//       opt.step(ex, clip_scale(std::sqrt(norm2) / ls.scale(), max_norm) / ls.scale());
//
// On a non-finite norm the step is skipped and the scale multiplied by `backoff`; after
// `growth_interval` finite steps in a row it is multiplied by `growth`; it stays within
// [min_scale, max_scale]. bfloat16 has float's range and needs none of this.

#include <hspmd/core/error.hpp>
#include <hspmd/train/namespace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

namespace hspmd::train {

/// Settings of `dynamic_loss_scale` (PyTorch's GradScaler defaults).
struct loss_scale_options {
  double initial = 65536.0;
  double growth = 2.0;
  double backoff = 0.5;
  std::size_t growth_interval = 2000;
  double min_scale = 1.0;
  double max_scale = 16777216.0; // 2^24
};

/// The loss scale of one training run (see the file comment). Every rank must feed it the same
/// (all-reduced) norm so that all skip the same steps.
class dynamic_loss_scale {
public:
  /// Throws `config_error` naming the setting when one is out of range.
  explicit dynamic_loss_scale(loss_scale_options o = {}) : o_(o), scale_(o.initial) {
    const auto bad = [](const char* field, double v, const char* need) {
      throw config_error("loss scale: field " + std::string(field),
                         std::to_string(v) + " is out of range", need);
    };
    if (!(o.min_scale > 0.0) || !std::isfinite(o.min_scale))
      bad("min_scale", o.min_scale, "a finite value > 0");
    if (!(o.max_scale >= o.min_scale) || !std::isfinite(o.max_scale))
      bad("max_scale", o.max_scale, "a finite value >= min_scale");
    if (!(o.initial >= o.min_scale && o.initial <= o.max_scale))
      bad("initial", o.initial, "within [min_scale, max_scale]");
    if (!(o.growth >= 1.0) || !std::isfinite(o.growth))
      bad("growth", o.growth, "a finite factor >= 1");
    if (!(o.backoff > 0.0 && o.backoff < 1.0))
      bad("backoff", o.backoff, "a factor in (0, 1)");
    if (o.growth_interval == 0)
      bad("growth_interval", 0.0, "at least 1 step");
  }

  /// The factor the loss (and so every gradient) is multiplied by this step.
  [[nodiscard]] double scale() const noexcept { return scale_; }
  /// Steps skipped so far (non-finite gradients).
  [[nodiscard]] std::size_t skipped() const noexcept { return skipped_; }

  /// What a checkpoint keeps of it: the scale, the clean steps since it last changed, and the
  /// steps skipped.
  struct snapshot {
    double scale = 1.0;
    std::size_t clean = 0;
    std::size_t skipped = 0;
  };
  [[nodiscard]] snapshot save() const noexcept { return {scale_, clean_, skipped_}; }
  void restore(const snapshot& s) noexcept {
    scale_ = std::clamp(s.scale, o_.min_scale, o_.max_scale);
    clean_ = s.clean;
    skipped_ = s.skipped;
  }

  /// After the backward: `non_finite` when the (scaled) gradients hold an inf or NaN. Returns
  /// whether to apply this step; adjusts the scale for the next one.
  bool update(bool non_finite) noexcept {
    if (non_finite) {
      ++skipped_;
      clean_ = 0;
      scale_ = std::max(o_.min_scale, scale_ * o_.backoff);
      return false;
    }
    if (++clean_ >= o_.growth_interval) {
      clean_ = 0;
      scale_ = std::min(o_.max_scale, scale_ * o_.growth);
    }
    return true;
  }

private:
  loss_scale_options o_;
  double scale_;
  std::size_t clean_ = 0;
  std::size_t skipped_ = 0;
};

} // namespace hspmd::train
