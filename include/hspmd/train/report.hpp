#pragma once
// What the trainer says while it runs, as plain functions of the run's facts (no tensors, no
// engine): the start-up lines, the progress line, the metrics file's lines, the evaluation
// line, the summary with model FLOP/s and MFU. Rank 0 calls them; train/trainer_impl.hpp's loop
// decides when.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/backends/blas.hpp>
#include <hspmd/exec/caching_allocator.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/results.hpp>
#include <hspmd/train/train_options.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

// printf-style checking of the trainer's line formatter.
#if defined(__GNUC__)
#define HSPMD_PRINTF_FORMAT(f, a) __attribute__((format(printf, f, a)))
#else
#define HSPMD_PRINTF_FORMAT(f, a)
#endif

namespace hspmd::train {

namespace detail {

/// "1.67x": a slowdown as the trace and the progress show it.
[[nodiscard]] inline std::string times_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3gx", x);
  return buf;
}

[[nodiscard]] inline std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

} // namespace detail

/// printf to a stream (one line of at most 511 characters).
inline void print(std::ostream& out, const char* format, ...) HSPMD_PRINTF_FORMAT(2, 3);
inline void print(std::ostream& out, const char* format, ...) {
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  out << line;
}

/// Writes `text` and a newline to `path`, or throws naming it.
inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text << "\n";
  if (!f)
    throw config_error(path, "cannot be written", "give a path in an existing, writable directory");
}

/// The start-up line of what runs the host GEMMs, and its warning when it is slower than the CPU
/// allows.
inline void say_blas(std::ostream& out, const blas::info& b) {
  out << blas::describe(b) << "\n";
  if (!b.warning.empty())
    out << "warning: " << b.warning << "\n";
}

/// The model line (and the precision's) of the start-up.
inline void describe(std::ostream& out, const graph::graph& g, const train_options& o,
                     const std::string& device) {
  std::size_t params = 0;
  for (auto id : g.parameters())
    params += g[id].out.size();
  const auto cost = graph::total_cost(g);
  print(out,
        "%s: %zu parameters, %zu graph nodes, %.3f GFLOP per micro-batch of %zu (forward %.3f, "
        "backward %.3f), %zu micro-batch%s per step, on %s\n",
        o.name.c_str(), params, g.size(), (cost.forward_flops + cost.backward_flops) / 1e9, o.batch,
        cost.forward_flops / 1e9, cost.backward_flops / 1e9, o.accumulate,
        o.accumulate == 1 ? "" : "es", device.c_str());
  if (o.precision != exec::precision::f32)
    print(out,
          "precision %s: activations and GEMM operands in 16 bits, master weights, their "
          "gradients and reductions in float%s\n",
          std::string(name(o.precision)).c_str(),
          o.precision == exec::precision::f16 ? ", dynamic loss scaling" : "");
}

/// Model FLOP/s and MFU: per rank (one entry in one process) its peak flop/s (0: unknown), the
/// FLOPs its own program runs per micro-batch, and its name; the model's FLOPs of one optimizer
/// step (forward and backward of every micro-batch; recomputation and replicated work not
/// counted).
struct flops_meter {
  std::vector<double> peaks;
  std::vector<double> rank_flops;
  std::vector<std::string> device_names;
  double model_flops_per_step = 0.0;
  std::size_t accumulate = 1;

  flops_meter() = default;
  flops_meter(const graph::graph& g, std::size_t micro_batches) : accumulate(micro_batches) {
    const auto cost = graph::total_cost(g);
    model_flops_per_step =
        (cost.forward_flops + cost.backward_flops) * static_cast<double>(micro_batches);
  }
  /// Model FLOPs utilisation of a step of `seconds`: model FLOP/s over the devices' summed
  /// peak; 0 when a peak is unknown.
  [[nodiscard]] double mfu(double seconds) const {
    double peak = 0.0;
    for (double p : peaks) {
      if (p <= 0.0)
        return 0.0;
      peak += p;
    }
    return seconds > 0.0 && peak > 0.0 ? model_flops_per_step / seconds / peak : 0.0;
  }
};

inline std::string percent_text(const char* label, double fraction) {
  char b[48];
  std::snprintf(b, sizeof b, "%s %.1f%%", label, 100.0 * fraction);
  return b;
}

/// The progress line after step `r.step` with `elapsed` seconds trained so far by this run,
/// which started after step `first` (a resumed run's: its steps before are not in `elapsed`).
inline void progress(std::ostream& out, const train_options& o, const flops_meter& meter,
                     const step_report& r, double elapsed, std::size_t first = 0) {
  constexpr std::size_t width = 20;
  const std::size_t done = r.step + 1;
  std::string bar(width * done / o.steps, '#');
  bar.resize(width, '.');
  const double per_step = elapsed / static_cast<double>(std::max<std::size_t>(done - first, 1));
  const double units = static_cast<double>(o.batch * o.accumulate * o.units_per_sample);
  const double mfu = meter.mfu(per_step);
  print(out, "%s step %5zu/%-5zu [%s] loss %9.4f  lr %.2e  %8.2f ms/step  %9.1f %s/s%s  ETA %s\n",
        o.name.c_str(), done, o.steps, bar.c_str(), r.loss, r.lr, 1e3 * per_step, units / per_step,
        o.unit.c_str(), mfu > 0.0 ? percent_text("  MFU", mfu).c_str() : "",
        detail::duration_text(per_step * static_cast<double>(o.steps - done)).c_str());
  out.flush();
}

/// The metrics file's line of a step. `loss_scale`: f16's scale, with whether the step applied.
[[nodiscard]] inline nlohmann::json step_metrics(const step_report& r, const flops_meter& meter,
                                                 std::optional<double> loss_scale, bool applied,
                                                 const std::optional<memory_stats>& memory) {
  nlohmann::json j{{"step", r.step + 1},
                   {"loss", r.loss},
                   {"lr", r.lr},
                   {"grad_norm", r.grad_norm},
                   {"seconds", r.seconds}};
  if (r.seconds > 0.0) {
    j["model_flops_per_s"] = meter.model_flops_per_step / r.seconds;
    if (const double u = meter.mfu(r.seconds); u > 0.0)
      j["mfu"] = u;
  }
  if (loss_scale) {
    j["loss_scale"] = *loss_scale;
    if (!applied)
      j["skipped"] = true;
  }
  if (memory) { // a device's allocator: flat after the second step
    j["allocated_bytes"] = memory->allocated_bytes;
    j["reserved_bytes"] = memory->reserved_bytes;
  }
  return j;
}

/// The metrics file's line of an evaluation.
[[nodiscard]] inline nlohmann::json eval_metrics(const eval_report& ev) {
  nlohmann::json j{{"eval_after_step", ev.after_step}, {"loss", ev.loss}};
  if (!std::isnan(ev.accuracy))
    j["accuracy"] = ev.accuracy;
  if (!std::isnan(ev.perplexity))
    j["perplexity"] = ev.perplexity;
  return j;
}

/// The line of an evaluation of `batches` micro-batches.
inline void say_eval(std::ostream& out, const eval_report& rep, std::size_t batches) {
  print(out, "eval after step %zu: loss %.4f", rep.after_step, rep.loss);
  if (!std::isnan(rep.accuracy))
    print(out, ", accuracy %.2f%%", 100.0 * rep.accuracy);
  if (!std::isnan(rep.perplexity))
    print(out, ", perplexity %.2f", rep.perplexity);
  print(out, " (%zu micro-batch%s)\n", batches, batches == 1 ? "" : "es");
}

/// The end of a run: losses, measured against predicted and simulated step time, FLOP/s and
/// MFU, re-balances, f16's skipped steps, a device's memory.
inline void summary(std::ostream& out, const train_options& o, const train_result& r,
                    const synth::plan* plan, const flops_meter& meter, bool distributed,
                    const std::optional<memory_stats>& memory) {
  const double median = r.median_step_seconds();
  print(out, "%s: loss %.4f -> %.4f over %zu steps; step time measured %.2f ms (median)",
        o.name.c_str(), r.losses.front(), r.losses.back(), r.losses.size(), 1e3 * median);
  if (plan != nullptr)
    print(out, ", predicted %s (%+.0f%%)",
          synth::milliseconds_text(r.predicted_step_seconds).c_str(),
          100.0 * (r.predicted_step_seconds - median) / median);
  if (plan != nullptr && r.simulated_step_seconds > 0.0)
    print(out, ", simulated %s (%+.0f%%)",
          synth::milliseconds_text(r.simulated_step_seconds).c_str(),
          100.0 * (r.simulated_step_seconds - median) / median);
  out << "\n";
  if (median > 0.0) {
    print(out, "model %.2f GFLOP/s", meter.model_flops_per_step / median / 1e9);
    if (const double u = meter.mfu(median); u > 0.0) {
      double peak = 0.0;
      for (double p : meter.peaks)
        peak += p;
      print(out, ", MFU %.1f%% of %.1f GFLOP/s peak", 100.0 * u, peak / 1e9);
      if (meter.peaks.size() > 1) { // what each device ran of its own program, over its peak
        out << " (each device's own FLOPs over its peak:";
        const double per_mb = static_cast<double>(o.accumulate) / median;
        for (std::size_t d = 0; d < meter.peaks.size() && d < 16; ++d)
          print(out, " %s %.1f%%", meter.device_names[d].c_str(),
                100.0 * meter.rank_flops[d] * per_mb / meter.peaks[d]);
        out << (meter.peaks.size() > 16 ? " ...)" : ")");
      }
    } else if (!meter.peaks.empty())
      out << (distributed ? " (MFU: a device's peak is unknown; give it in the cluster "
                            "file's \"peak\")"
                          : " (MFU: measured against the host BLAS only; no peak is known "
                            "for this device)");
    out << "\n";
  }
  if (!r.rebalances.empty() && plan != nullptr)
    print(out, "re-balanced %zu time%s; the plan now predicts %s per step\n", r.rebalances.size(),
          r.rebalances.size() == 1 ? "" : "s", synth::milliseconds_text(plan->step_time).c_str());
  if (o.precision == exec::precision::f16)
    print(out, "f16: %zu of %zu steps skipped (gradients overflowed); loss scale now %g\n",
          r.skipped_steps, r.losses.size(), r.loss_scale);
  if (memory)
    print(out,
          "device memory: peak %.1f MiB allocated, %.1f MiB reserved (%zu device "
          "allocations, %zu from the cache)\n",
          static_cast<double>(memory->peak_allocated_bytes) / 1048576.0,
          static_cast<double>(memory->peak_reserved_bytes) / 1048576.0, memory->device_allocations,
          memory->cache_hits);
  out.flush();
}

} // namespace hspmd::train
