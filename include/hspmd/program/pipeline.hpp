#pragma once
// Pipeline schedules as data: for each device of a pipeline, the order in which it runs its
// micro-batches' forward and backward passes. The executor will run this order and the simulator
// price it (a schedule is a program, like program/step.hpp's list); here it is built, checked and
// timed without hardware.
//
//     const auto s = program::make_schedule(program::schedule_kind::one_f_one_b, 4, 8);
//     program::check(s);                                 // every pass once, no deadlock
//     const auto t = program::simulate(s, {.forward = 1, .backward = 2});
//     t.bubble;                                          // (p - 1) / (m + p - 1) for 1F1B
//     program::text(s, 0);                               // "F0 F1 F2 F3 B0 F4 B1 F5 ..."
//
// A pipeline of p devices runs S = p * v stages: with v chunks a device (interleaved), device d
// holds stages d, d + p, d + 2p, ... (Megatron's interleaving). A micro-batch's forward runs
// stage 0 to S - 1, its backward S - 1 to 0. The zero-bubble schedule splits each backward into
// the input gradient (`backward_input`, which the previous stage waits for) and the weight
// gradient (`backward_weight`, which nothing waits for), and fills the pipeline's idle time with
// the latter.
//
// The schedules (p devices, m micro-batches):
//   gpipe        every forward, then every backward: m micro-batches' activations in flight
//   1f1b         p - 1 - d forwards to warm up, then one forward and one backward in turn:
//                at most p - d in flight on device d; bubble (p - 1) / (m + p - 1)
//   interleaved  1F1B over v chunks a device (m a multiple of p): bubble (p - 1) / (v m + p - 1)
//   zb           1F1B with the weight gradients run where a device would otherwise wait (ZB-H1):
//                at most p in flight on any device (1F1B's peak, on device 0); with equal
//                forward, input- and weight-gradient times a third of 1F1B's idle time

#include <hspmd/core/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::program {

/// A pipeline schedule's kind.
enum class schedule_kind : std::uint8_t { gpipe, one_f_one_b, interleaved, zero_bubble };
inline constexpr std::size_t schedule_kind_count = 4;

/// The name a flag and a plan file give it: gpipe, 1f1b, interleaved, zb.
[[nodiscard]] constexpr std::string_view name(schedule_kind k) noexcept {
  constexpr std::array<std::string_view, schedule_kind_count> names = {"gpipe", "1f1b",
                                                                       "interleaved", "zb"};
  return names.at(static_cast<std::size_t>(k));
}

/// The kind named `text`; throws `config_error` naming the choices otherwise.
[[nodiscard]] inline schedule_kind parse_schedule(std::string_view text) {
  for (std::size_t k = 0; k < schedule_kind_count; ++k)
    if (name(static_cast<schedule_kind>(k)) == text)
      return static_cast<schedule_kind>(k);
  throw config_error("schedule '" + std::string(text) + "'",
                     "not one of gpipe, 1f1b, interleaved, zb");
}

/// What one pipeline instruction runs.
enum class pass : std::uint8_t {
  forward,         ///< the stage's forward of a micro-batch
  backward,        ///< its whole backward (input and weight gradients)
  backward_input,  ///< the input gradient only (what the previous stage waits for)
  backward_weight, ///< the weight gradient only (zb)
};

/// One instruction of a device's pipeline order: `what` of micro-batch `micro` on the device's
/// chunk `chunk` (stage chunk * devices + device).
struct pipeline_op {
  pass what = pass::forward;
  std::size_t micro = 0;
  std::size_t chunk = 0;
  friend bool operator==(const pipeline_op&, const pipeline_op&) = default;
};

/// Every device's order.
struct pipeline_schedule {
  schedule_kind kind = schedule_kind::one_f_one_b;
  std::size_t devices = 1; ///< p
  std::size_t micro = 1;   ///< m, micro-batches a step
  std::size_t chunks = 1;  ///< v, stages a device (interleaved)
  std::vector<std::vector<pipeline_op>> order;

  [[nodiscard]] std::size_t stages() const noexcept { return devices * chunks; }
  /// The stage of chunk `c` on device `d`.
  [[nodiscard]] std::size_t stage(std::size_t d, std::size_t c) const noexcept {
    return c * devices + d;
  }
  /// Whether backwards come split into input and weight gradients.
  [[nodiscard]] bool split_backward() const noexcept { return kind == schedule_kind::zero_bubble; }
};

/// The micro-batches in flight at once on each chunk of device `d` under schedule `s`: a
/// forward takes a slot, its backward gives it back (a split backward: its weight-gradient
/// part, which still reads the micro-batch's activations). What each stage's activations cost
/// (exec/pipeline.hpp holds that many; `explain` prints it).
[[nodiscard]] inline std::vector<std::size_t> in_flight_per_chunk(const pipeline_schedule& s,
                                                                  std::size_t d) {
  std::vector<std::size_t> now(s.chunks, 0), peak(s.chunks, 0);
  for (const pipeline_op& op : s.order.at(d)) {
    if (op.what == pass::forward)
      peak[op.chunk] = std::max(peak[op.chunk], ++now[op.chunk]);
    else if (op.what != pass::backward_input && now[op.chunk] > 0)
      --now[op.chunk];
  }
  return peak;
}

/// "F3", "B3", "I3" (input gradient), "W3"; with chunks, "F3.1" (micro-batch 3 on chunk 1).
[[nodiscard]] inline std::string text(const pipeline_op& op, bool chunks) {
  constexpr std::array<char, 4> letter = {'F', 'B', 'I', 'W'};
  std::string s(1, letter.at(static_cast<std::size_t>(op.what)));
  s += std::to_string(op.micro);
  if (chunks)
    s += "." + std::to_string(op.chunk);
  return s;
}
/// Device `d`'s order as text, instructions separated by spaces.
[[nodiscard]] inline std::string text(const pipeline_schedule& s, std::size_t d) {
  std::string out;
  for (const pipeline_op& op : s.order.at(d)) {
    if (!out.empty())
      out += ' ';
    out += text(op, s.chunks > 1);
  }
  return out;
}

/// Per-pass times of one stage (any unit) and the time a boundary tensor takes between devices.
struct stage_costs {
  double forward = 1.0;
  double backward = 2.0;        ///< whole backward; split: input + weight
  double weight_share = 0.5;    ///< the weight gradient's share of `backward` (zb)
  double transfer = 0.0;        ///< a boundary send between two devices
  std::vector<double> slowdown; ///< per device, a factor on its passes (empty: all 1)
  /// Per stage, its forward and whole backward (a plan's predictions, a measurement); where
  /// given, they replace `forward` and `backward` (which a device's chunks divide).
  std::vector<double> stage_forward, stage_backward;
  /// Per stage (empty: none), work done once a step after its device's last pass -- the
  /// stage's gradient reduction across its group.
  std::vector<double> stage_sync;
};

/// What `simulate` found.
struct pipeline_timeline {
  double step = 0.0;                      ///< when the last device finishes
  double bubble = 0.0;                    ///< the share of device time spent idle before its end
  std::vector<double> busy;               ///< per device
  std::vector<std::size_t> peak_inflight; ///< per device: micro-batch chunks forward-done,
                                          ///< backward not yet complete (activations held)
  /// per device, per instruction: its start and end
  std::vector<std::vector<std::pair<double, double>>> spans;
};

namespace detail {

[[nodiscard]] inline double duration(const pipeline_schedule& s, const stage_costs& c,
                                     std::size_t d, std::size_t chunk, pass p) {
  const double f = c.slowdown.empty() ? 1.0 : c.slowdown.at(d);
  const double per_chunk = 1.0 / static_cast<double>(s.chunks);
  const std::size_t k = s.stage(d, chunk);
  const double forward = c.stage_forward.empty() ? per_chunk * c.forward : c.stage_forward.at(k);
  const double backward =
      c.stage_backward.empty() ? per_chunk * c.backward : c.stage_backward.at(k);
  switch (p) {
  case pass::forward:
    return f * forward;
  case pass::backward:
    return f * backward;
  case pass::backward_input:
    return f * backward * (1.0 - c.weight_share);
  case pass::backward_weight:
    return f * backward * c.weight_share;
  }
  return 0.0;
}

// When each pass of each (stage, micro-batch) finished, as the simulation proceeds.
struct finish_times {
  std::size_t micro;
  std::vector<std::optional<double>> forward, backward; // backward: whole or input gradient
  [[nodiscard]] std::size_t at(std::size_t stage, std::size_t m) const { return stage * micro + m; }
};

} // namespace detail

/// Runs every device's order against per-pass times: each instruction starts when its device is
/// free and what it reads has arrived (a forward: the previous stage's forward of that
/// micro-batch, a transfer later unless on the same device; a backward: the next stage's input
/// gradient, or the last stage's own forward). Throws `config_error` naming the devices and
/// instructions when no device can go on (a deadlock) -- `check` uses it.
[[nodiscard]] inline pipeline_timeline simulate(const pipeline_schedule& s,
                                                const stage_costs& c = {}) {
  const std::size_t p = s.devices;
  const std::size_t stages = s.stages();
  detail::finish_times done{s.micro, std::vector<std::optional<double>>(stages * s.micro),
                            std::vector<std::optional<double>>(stages * s.micro)};
  pipeline_timeline t;
  t.busy.assign(p, 0.0);
  t.peak_inflight.assign(p, 0);
  t.spans.resize(p);
  std::vector<std::size_t> next(p, 0), inflight(p, 0);
  std::vector<double> free_at(p, 0.0);
  const auto device_of = [&](std::size_t stage) { return stage % p; };
  const auto arrival = [&](std::size_t from_stage, std::size_t to_device, double at) {
    return device_of(from_stage) == to_device ? at : at + c.transfer;
  };
  // The time instruction op of device d may start, if what it reads is there.
  const auto ready = [&](std::size_t d, const pipeline_op& op) -> std::optional<double> {
    const std::size_t st = s.stage(d, op.chunk);
    switch (op.what) {
    case pass::forward:
      if (st == 0)
        return 0.0;
      if (const auto f = done.forward[done.at(st - 1, op.micro)])
        return arrival(st - 1, d, *f);
      return std::nullopt;
    case pass::backward:
    case pass::backward_input:
      if (st + 1 == stages)
        return done.forward[done.at(st, op.micro)];
      if (const auto b = done.backward[done.at(st + 1, op.micro)])
        return arrival(st + 1, d, *b);
      return std::nullopt;
    case pass::backward_weight:
      return done.backward[done.at(st, op.micro)];
    }
    return std::nullopt;
  };
  std::size_t remaining = 0;
  for (const auto& o : s.order)
    remaining += o.size();
  while (remaining > 0) {
    // Of the devices whose next instruction can run, the one that would start first.
    std::optional<std::size_t> pick;
    double pick_start = 0.0;
    for (std::size_t d = 0; d < p; ++d) {
      if (next[d] == s.order[d].size())
        continue;
      const auto r = ready(d, s.order[d][next[d]]);
      if (!r)
        continue;
      const double start = std::max(*r, free_at[d]);
      if (!pick || start < pick_start) {
        pick = d;
        pick_start = start;
      }
    }
    if (!pick) {
      std::string stuck;
      for (std::size_t d = 0; d < p; ++d)
        if (next[d] < s.order[d].size())
          stuck += (stuck.empty() ? "" : ", ") + std::string("device ") + std::to_string(d) +
                   " at " + text(s.order[d][next[d]], s.chunks > 1);
        else
          stuck +=
              (stuck.empty() ? "" : ", ") + std::string("device ") + std::to_string(d) + " done";
      throw config_error("pipeline schedule " + std::string(name(s.kind)),
                         "deadlocks: no device can go on (" + stuck + ")",
                         "order each device's passes so that what one waits for is not behind "
                         "what waits for it");
    }
    const std::size_t d = *pick;
    const pipeline_op& op = s.order[d][next[d]];
    const std::size_t st = s.stage(d, op.chunk);
    const double end = pick_start + detail::duration(s, c, d, op.chunk, op.what);
    t.spans[d].emplace_back(pick_start, end);
    t.busy[d] += end - pick_start;
    free_at[d] = end;
    const bool last_backward = op.what == pass::backward || op.what == pass::backward_weight;
    if (op.what == pass::forward) {
      done.forward[done.at(st, op.micro)] = end;
      t.peak_inflight[d] = std::max(t.peak_inflight[d], ++inflight[d]);
    } else if (op.what != pass::backward_weight) {
      done.backward[done.at(st, op.micro)] = end;
    }
    if (last_backward && inflight[d] > 0)
      --inflight[d];
    ++next[d];
    --remaining;
  }
  for (std::size_t k = 0; k < c.stage_sync.size() && k < stages; ++k) {
    free_at[device_of(k)] += c.stage_sync[k];
    t.busy[device_of(k)] += c.stage_sync[k];
  }
  for (std::size_t d = 0; d < p; ++d)
    t.step = std::max(t.step, free_at[d]);
  double idle = 0.0;
  for (std::size_t d = 0; d < p; ++d)
    idle += t.step - t.busy[d];
  t.bubble = t.step > 0.0 ? idle / (t.step * static_cast<double>(p)) : 0.0;
  return t;
}

/// Checks that `s` is a schedule: every stage of every micro-batch has one forward and one
/// backward (split: one input and one weight gradient) on the stage's device, a device's forward
/// of a micro-batch comes before its backward, its input gradient before its weight gradient, and
/// no device waits forever. Throws `config_error` naming what is wrong.
inline void check(const pipeline_schedule& s) {
  const std::string what = "pipeline schedule " + std::string(name(s.kind));
  if (s.devices == 0 || s.micro == 0 || s.chunks == 0)
    throw config_error(what, "devices, micro-batches and chunks must be at least 1");
  if (s.order.size() != s.devices)
    throw config_error(what, std::to_string(s.order.size()) + " device orders for " +
                                 std::to_string(s.devices) + " devices");
  const std::size_t passes = s.split_backward() ? 3 : 2;
  for (std::size_t d = 0; d < s.devices; ++d) {
    // position of each (pass, chunk, micro) in the device's order
    std::vector<std::size_t> seen(4 * s.chunks * s.micro, std::numeric_limits<std::size_t>::max());
    for (std::size_t i = 0; i < s.order[d].size(); ++i) {
      const pipeline_op& op = s.order[d][i];
      const bool allowed = s.split_backward()
                               ? op.what != pass::backward
                               : (op.what == pass::forward || op.what == pass::backward);
      if (op.micro >= s.micro || op.chunk >= s.chunks || !allowed)
        throw config_error(what, "device " + std::to_string(d) + " instruction " +
                                     std::to_string(i) + " (" + text(op, s.chunks > 1) +
                                     ") is not one of this schedule's");
      auto& at =
          seen[(static_cast<std::size_t>(op.what) * s.chunks + op.chunk) * s.micro + op.micro];
      if (at != std::numeric_limits<std::size_t>::max())
        throw config_error(what, "device " + std::to_string(d) + " runs " + text(op, s.chunks > 1) +
                                     " twice");
      at = i;
    }
    if (s.order[d].size() != passes * s.chunks * s.micro)
      throw config_error(what, "device " + std::to_string(d) + " has " +
                                   std::to_string(s.order[d].size()) + " instructions, not " +
                                   std::to_string(passes * s.chunks * s.micro));
    const auto pos = [&](pass p, std::size_t c, std::size_t m) {
      return seen[(static_cast<std::size_t>(p) * s.chunks + c) * s.micro + m];
    };
    for (std::size_t c = 0; c < s.chunks; ++c)
      for (std::size_t m = 0; m < s.micro; ++m) {
        const pass back = s.split_backward() ? pass::backward_input : pass::backward;
        if (pos(pass::forward, c, m) > pos(back, c, m))
          throw config_error(what, "device " + std::to_string(d) + " runs " +
                                       text({back, m, c}, s.chunks > 1) + " before its forward");
        if (s.split_backward() &&
            pos(pass::backward_input, c, m) > pos(pass::backward_weight, c, m))
          throw config_error(what, "device " + std::to_string(d) + " runs " +
                                       text({pass::backward_weight, m, c}, s.chunks > 1) +
                                       " before its input gradient");
      }
  }
  (void)simulate(s); // throws on a deadlock
}

namespace detail {

// 1F1B over the device's virtual micro-batches (Megatron's interleaved order; v = 1 is plain
// 1F1B): the k-th forward is micro-batch (k / (p v)) p + k % p on chunk (k / p) % v, the k-th
// backward the same micro-batch on chunk v - 1 - (k / p) % v; warm-up (p - d - 1) * 2 + (v - 1) p
// forwards (p - d - 1 with one chunk), then forward and backward in turn, then the backwards left.
inline std::vector<pipeline_op> one_f_one_b(std::size_t p, std::size_t m, std::size_t v,
                                            std::size_t d) {
  const std::size_t total = m * v;
  const auto virtual_op = [&](std::size_t k, bool forward) {
    const std::size_t group = k / p;
    const std::size_t chunk = forward ? group % v : v - 1 - group % v;
    return pipeline_op{forward ? pass::forward : pass::backward, (k / (p * v)) * p + k % p, chunk};
  };
  const auto plain = [&](std::size_t k, bool forward) {
    return pipeline_op{forward ? pass::forward : pass::backward, k, 0};
  };
  const auto op = [&](std::size_t k, bool forward) {
    return v == 1 ? plain(k, forward) : virtual_op(k, forward);
  };
  const std::size_t warmup = std::min(total, v == 1 ? p - d - 1 : (p - d - 1) * 2 + (v - 1) * p);
  std::vector<pipeline_op> out;
  std::size_t f = 0, b = 0;
  for (; f < warmup; ++f)
    out.push_back(op(f, true));
  for (; f < total; ++f, ++b) {
    out.push_back(op(f, true));
    out.push_back(op(b, false));
  }
  for (; b < total; ++b)
    out.push_back(op(b, false));
  return out;
}

} // namespace detail

/// The schedule of `kind` for `devices` devices and `micro` micro-batches a step (`chunks`
/// stages a device; interleaved only, at least 2, with `micro` a multiple of `devices`). Throws
/// `config_error` naming the bound a value breaks.
[[nodiscard]] inline pipeline_schedule make_schedule(schedule_kind kind, std::size_t devices,
                                                     std::size_t micro, std::size_t chunks = 1) {
  const std::string what = "pipeline schedule " + std::string(name(kind));
  if (devices == 0 || micro == 0)
    throw config_error(what, "needs at least one device and one micro-batch (got " +
                                 std::to_string(devices) + " devices, " + std::to_string(micro) +
                                 " micro-batches)");
  if (kind == schedule_kind::interleaved) {
    if (chunks < 2)
      throw config_error(what, "needs at least 2 chunks a device (got " + std::to_string(chunks) +
                                   "); with one chunk use 1f1b");
    if (micro % devices != 0)
      throw config_error(what, "micro-batches (" + std::to_string(micro) +
                                   ") must be a multiple of the pipeline's devices (" +
                                   std::to_string(devices) + ")");
  } else if (chunks != 1) {
    throw config_error(what, "runs one chunk a device (got " + std::to_string(chunks) +
                                 "); more chunks need interleaved");
  }
  pipeline_schedule s{kind, devices, micro, chunks, {}};
  s.order.resize(devices);
  for (std::size_t d = 0; d < devices; ++d) {
    auto& o = s.order[d];
    switch (kind) {
    case schedule_kind::gpipe:
      for (std::size_t k = 0; k < micro; ++k)
        o.push_back({pass::forward, k, 0});
      for (std::size_t k = 0; k < micro; ++k)
        o.push_back({pass::backward, k, 0});
      break;
    case schedule_kind::one_f_one_b:
    case schedule_kind::interleaved:
      o = detail::one_f_one_b(devices, micro, chunks, d);
      break;
    case schedule_kind::zero_bubble:
      break; // below: it depends on every device's timing
    }
  }
  if (kind == schedule_kind::zero_bubble) {
    // ZB-H1: 1F1B's order of forwards and input gradients, each device running a pending weight
    // gradient whenever its next forward or input gradient is not there yet, or before a forward
    // that would hold more than p micro-batches (1F1B's peak), and after its last input
    // gradient the rest. The order is fixed by a simulation with equal forward, input- and
    // weight-gradient times.
    std::vector<std::vector<pipeline_op>> main(devices);
    for (std::size_t d = 0; d < devices; ++d)
      for (pipeline_op op : detail::one_f_one_b(devices, micro, 1, d)) {
        if (op.what == pass::backward)
          op.what = pass::backward_input;
        main[d].push_back(op);
      }
    const stage_costs unit; // (the defaults: forward 1, backward 2, weight half of it)
    std::vector<std::size_t> next(devices, 0);
    std::vector<std::vector<std::size_t>> pending(devices); // micro-batches awaiting W
    std::vector<std::size_t> forwards(devices, 0), weights(devices, 0);
    std::vector<double> free_at(devices, 0.0);
    std::vector<std::optional<double>> fdone(devices * micro), bdone(devices * micro);
    const auto at = [micro](std::size_t st, std::size_t m) { return st * micro + m; };
    std::size_t left = 3 * devices * micro;
    while (left > 0) {
      // each device's next main instruction's ready time (if known), else a weight gradient
      std::optional<std::size_t> pick;
      double pick_start = 0.0;
      bool pick_weight = false;
      for (std::size_t d = 0; d < devices; ++d) {
        std::optional<double> r;
        if (next[d] < main[d].size()) {
          const pipeline_op& op = main[d][next[d]];
          if (op.what == pass::forward)
            r = d == 0 ? std::optional<double>(0.0) : fdone[at(d - 1, op.micro)];
          else
            r = d + 1 == devices ? fdone[at(d, op.micro)] : bdone[at(d + 1, op.micro)];
        }
        // run the main instruction if it can start now; else fill with a weight gradient. Before
        // a forward that would hold more than p micro-batches, a weight gradient first: it frees
        // one.
        double start = 0.0;
        bool weight = false;
        const bool full = next[d] < main[d].size() && main[d][next[d]].what == pass::forward &&
                          forwards[d] - weights[d] >= devices;
        if (full && !pending[d].empty()) {
          start = free_at[d];
          weight = true;
        } else if (r && *r <= free_at[d]) {
          start = free_at[d];
        } else if (!pending[d].empty()) {
          start = free_at[d];
          weight = true;
        } else if (r) {
          start = *r;
        } else if (!pending[d].empty() && next[d] == main[d].size()) {
          start = free_at[d]; // the input gradients are done: the weight gradients left
          weight = true;
        } else {
          continue;
        }
        if (!pick || start < pick_start) {
          pick = d;
          pick_start = start;
          pick_weight = weight;
        }
      }
      if (!pick)
        throw config_error(what, "internal: no device can go on while building it");
      const std::size_t d = *pick;
      if (pick_weight) {
        const std::size_t m = pending[d].front();
        pending[d].erase(pending[d].begin());
        s.order[d].push_back({pass::backward_weight, m, 0});
        ++weights[d];
        free_at[d] = pick_start + detail::duration(s, unit, d, 0, pass::backward_weight);
      } else {
        const pipeline_op op = main[d][next[d]++];
        s.order[d].push_back(op);
        free_at[d] = pick_start + detail::duration(s, unit, d, op.chunk, op.what);
        if (op.what == pass::forward) {
          fdone[at(d, op.micro)] = free_at[d];
          ++forwards[d];
        } else {
          bdone[at(d, op.micro)] = free_at[d];
          pending[d].push_back(op.micro);
        }
      }
      --left;
    }
  }
  return s;
}

} // namespace hspmd::program
