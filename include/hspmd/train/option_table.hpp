#pragma once
// The library trainer's options, each declared once: its flag, its help, its value in
// `train_options`, the range a number must lie in, what the ranks must agree on and whether it
// needs a cluster. The command-line flags (train/train_flags.hpp), the check at start
// (`check_train_options`, which the trainer calls), the ranks' agreement
// (`agreed_train_options`) and the one-process refusals come from this table: an option added as
// a row gets all of them, and a value out of range is refused at start with one line naming the
// flag and its range whichever way it arrived (flag or code).
//
//     {"--accumulate", "micro-batches per optimizer step", count(accumulate), 1, 1e6}
//
// A flag whose text does not fit its type never gets here (CLI11 refuses it); a negative count
// that the conversion would wrap (`--steps -1` is 2^64 - 1) and a value past any sensible run
// (10^23 steps, 4e9 micro-batches, an infinite learning rate) are out of range.

#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/train/fault.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/train_options.hpp>
#include <hspmd/train/world.hpp>

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace hspmd::train {

static_assert(std::is_same_v<std::uint64_t, std::size_t>,
              "the option table reads seeds and counts through one accessor type");

/// One option of `train_options`.
struct train_option {
  using count_ref = std::size_t& (*)(train_options&);
  using real_ref = double& (*)(train_options&);
  using text_ref = std::string& (*)(train_options&);
  using switch_ref = bool& (*)(train_options&);
  /// On, off or unset (`auto`): a `--name` and a `--no-name` flag.
  using tristate_ref = std::optional<bool>& (*)(train_options&);
  /// One of a few words (`allowed`, separated by '|'), read and written through these.
  struct choice {
    std::string (*get)(const train_options&);
    void (*set)(train_options&, std::string_view);
    std::string_view allowed;
  };
  /// A flag without a value that does something to the options (`--quiet`).
  struct action {
    void (*apply)(train_options&);
    bool (*is_set)(const train_options&);
  };
  /// What the ranks compare: nothing (a rank's own business, e.g. how often rank 0 prints),
  /// the value, or only whether it is set (an output file each rank may name its own way).
  enum class agreement : std::uint8_t { none, value, presence };

  std::string_view flag; ///< e.g. "--steps"
  std::string_view help;
  std::variant<count_ref, real_ref, text_ref, switch_ref, tristate_ref, choice, action> value;
  double low = 0.0;  ///< numbers: smallest allowed value (inclusive unless `low_open`)
  double high = 0.0; ///< numbers: largest allowed value (inclusive)
  bool low_open = false;
  agreement agree = agreement::value;
  /// Set in a one-process run, it is refused: it acts on a plan, which one process has not.
  bool needs_cluster = false;

  /// The option's name: its flag without the dashes, e.g. "steps".
  [[nodiscard]] std::string name() const { return std::string(flag.substr(2)); }
  [[nodiscard]] bool numeric() const {
    return std::holds_alternative<count_ref>(value) || std::holds_alternative<real_ref>(value);
  }
  /// A number's value in `o` (exact for counts up to 2^53); 0 for other kinds.
  [[nodiscard]] double number(const train_options& o) const {
    auto& m = const_cast<train_options&>(o); // the accessors only read here
    if (const auto* c = std::get_if<count_ref>(&value))
      return static_cast<double>((*c)(m));
    if (const auto* r = std::get_if<real_ref>(&value))
      return (*r)(m);
    return 0.0;
  }
  /// The value as text: counts in decimal, reals in the shortest form that reads back, switches
  /// on / off, a tristate auto / on / off.
  [[nodiscard]] std::string text(const train_options& o) const {
    auto& m = const_cast<train_options&>(o);
    const auto on = [](bool b) { return std::string(b ? "on" : "off"); };
    return std::visit(
        [&](const auto& v) -> std::string {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, count_ref>)
            return std::to_string(v(m));
          else if constexpr (std::is_same_v<V, real_ref>)
            return shortest(v(m));
          else if constexpr (std::is_same_v<V, text_ref>)
            return v(m);
          else if constexpr (std::is_same_v<V, switch_ref>)
            return on(v(m));
          else if constexpr (std::is_same_v<V, tristate_ref>)
            return v(m) ? on(*v(m)) : std::string("auto");
          else if constexpr (std::is_same_v<V, choice>)
            return v.get(o);
          else
            return on(v.is_set(o));
        },
        value);
  }
  /// Whether the option is set away from "nothing" (a count or real not 0, a text not empty, a
  /// switch on, a tristate on).
  [[nodiscard]] bool is_set(const train_options& o) const {
    auto& m = const_cast<train_options&>(o);
    return std::visit(
        [&](const auto& v) -> bool {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, count_ref> || std::is_same_v<V, real_ref>)
            return v(m) != 0;
          else if constexpr (std::is_same_v<V, text_ref>)
            return !v(m).empty();
          else if constexpr (std::is_same_v<V, switch_ref>)
            return v(m);
          else if constexpr (std::is_same_v<V, tristate_ref>)
            return v(m).value_or(false);
          else if constexpr (std::is_same_v<V, choice>)
            return false;
          else
            return v.is_set(o);
        },
        value);
  }
  [[nodiscard]] bool in_range(double v) const {
    return std::isfinite(v) && (low_open ? v > low : v >= low) && v <= high;
  }
  /// A number's range in words, e.g. "[1, 1e+06]" or "(0, 1e+06]".
  [[nodiscard]] std::string range() const {
    return std::string(low_open ? "(" : "[") + shortest(low) + ", " + shortest(high) + "]";
  }
  [[nodiscard]] static std::string shortest(double v) {
    std::array<char, 40> b{};
    const auto r = std::to_chars(b.data(), b.data() + b.size(), v);
    return {b.data(), r.ptr};
  }
};

namespace detail {
inline constexpr double any_count = 1e12; // past any run: a step a microsecond for 11 days
} // namespace detail

/// Every option of the trainer, in --help order.
[[nodiscard]] inline const std::vector<train_option>& train_option_table() {
  using c = train_option::count_ref;
  using r = train_option::real_ref;
  using t = train_option::text_ref;
  using s = train_option::switch_ref;
  using a = train_option::agreement;
  constexpr double many = detail::any_count;
  static const std::vector<train_option> table = {
      {"--steps", "optimizer steps", c([](train_options & o) -> auto& { return o.steps; }), 0,
       many},
      {"--batch", "samples per micro-batch", c([](train_options & o) -> auto& { return o.batch; }),
       1, 1e9},
      {"--accumulate", "micro-batches per optimizer step (gradient accumulation)",
       c([](train_options & o) -> auto& { return o.accumulate; }), 1, 1e6},
      {"--seed", "seed of parameters, dropout and synthetic data",
       c([](train_options & o) -> auto& { return o.seed; }), 0, 1.8446744073709552e19},
      {"--lr", "(peak) learning rate of Adam",
       r([](train_options & o) -> auto& { return o.lr.peak; }), 0, 1e6, true},
      {"--schedule",
       "learning-rate schedule: constant, or cosine (linear warm-up, then cosine decay to "
       "--min-lr)",
       train_option::choice{
           [](const train_options& o) {
             return std::string(o.lr.shape == lr_schedule::kind::constant ? "constant" : "cosine");
           },
           [](train_options& o, std::string_view v) {
             o.lr.shape = v == "cosine" ? lr_schedule::kind::cosine : lr_schedule::kind::constant;
           },
           "constant|cosine"}},
      {"--warmup", "cosine schedule: warm-up steps",
       c([](train_options & o) -> auto& { return o.lr.warmup; }), 0, many},
      {"--min-lr", "cosine schedule: learning rate at the last step",
       r([](train_options & o) -> auto& { return o.lr.floor; }), 0, 1e6},
      {"--weight-decay", "AdamW's decoupled weight decay",
       r([](train_options & o) -> auto& { return o.weight_decay; }), 0, 1e6},
      {"--clip", "clip gradients to this global norm (0: off)",
       r([](train_options & o) -> auto& { return o.clip; }), 0, 1e12},
      {"--device",
       "host, cuda (a GPU per process; the program links hspmd::cuda) or auto (GPUs when every "
       "process has one, else the host)",
       t([](train_options & o) -> auto& { return o.device; })},
      {"--precision",
       "f32 (default); bf16: activations and GEMM operands in bfloat16, master weights in float; "
       "f16: the same in binary16 with dynamic loss scaling",
       train_option::choice{
           [](const train_options& o) { return std::string(name(o.precision)); },
           [](train_options& o, std::string_view v) { o.precision = *parse_precision(v); },
           "f32|bf16|f16"}},
      {"--cluster",
       "train on every rank of an MPI job (mpirun -np N, one rank per device of this cluster "
       "file); one process when absent",
       t([](train_options & o) -> auto& { return o.cluster; }), 0, 0, false, a::none},
      {"--recompute",
       "recompute each block's activations in the backward instead of keeping them (one more "
       "forward of the blocks per step, a block's activations in memory)",
       s([](train_options & o) -> auto& { return o.recompute; })},
      {"--plan", "with --cluster: synth (default), dp-ev, dp-cp, tp, or a plan JSON file",
       t([](train_options & o) -> auto& { return o.plan; }), 0, 0, false, a::value, true},
      {"--pipeline",
       "with --cluster: pipeline stages on groups of ranks, the devices of each group in rank "
       "order (e.g. 1,1 or 2,1,1; a number P: P equal groups); --accumulate micro-batches a step",
       t([](train_options & o) -> auto& { return o.pipeline; }), 0, 0, false, a::value, true},
      {"--pipeline-schedule", "with --pipeline: gpipe, 1f1b (default), interleaved or zb",
       train_option::choice{
           [](const train_options& o) { return o.pipeline_schedule; },
           [](train_options& o, std::string_view v) { o.pipeline_schedule = std::string(v); },
           "gpipe|1f1b|interleaved|zb"}},
      {"--pipeline-chunks", "with --pipeline: stages per group (interleaved: 2 or more)",
       c([](train_options & o) -> auto& { return o.pipeline_chunks; }), 1, 1e4},
      {"--calibrate",
       "with --cluster: before planning, time the model's ops on rank 0 and the collectives on "
       "all ranks, and price the plan by those measurements (default: on where the cluster has "
       "emulated devices, whose declared numbers describe another machine; --no-calibrate: "
       "price the plan by the cluster file's numbers)",
       train_option::tristate_ref(
           [](train_options& o) -> std::optional<bool>& { return o.calibrate; }),
       0, 0, false, a::value, true},
      {"--bucket-mb",
       "with --cluster: MiB of gradients per all-reduce bucket, each started during the "
       "backward as soon as it is complete (0: the library default)",
       r([](train_options & o) -> auto& { return o.bucket_mb; }), 0, 1e6},
      {"--rank-by-cost",
       "with --cluster: pick the synthesized plan by the cost model alone (default: its final "
       "candidates are weighed by the simulated step too)",
       s([](train_options & o) -> auto& { return o.rank_by_cost; })},
      {"--explain", "with --cluster: print the plan's explain table",
       s([](train_options & o) -> auto& { return o.explain; }), 0, 0, false, a::none, true},
      {"--trace",
       "with --cluster: write a Chrome/Perfetto trace (a track per rank: compute, collectives, "
       "idle, steps) to this file, and the simulated step (sim/step.hpp) beside it (t.json: "
       "t.simulated.json)",
       t([](train_options & o) -> auto& { return o.trace; }), 0, 0, false, a::presence, true},
      {"--save-plan", "with --cluster: write the plan as JSON to this file",
       t([](train_options & o) -> auto& { return o.save_plan; }), 0, 0, false, a::presence, true},
      {"--plan-cache",
       "with --cluster: keep synthesized plans in this directory; a start with the same model, "
       "options and cluster reads its plan, and one whose cluster numbers changed re-solves its "
       "ratios only",
       t([](train_options & o) -> auto& { return o.plan_cache; }), 0, 0, false, a::presence, true},
      {"--rebalance",
       "with --cluster: re-balance while training when a device is persistently this many "
       "times slower than the others relative to the plan (e.g. 1.25): ratios re-solved at the "
       "measured speeds, parameters and optimizer state moved; 0: off",
       r([](train_options & o) -> auto& { return o.rebalance; }), 0, 1e6, false, a::value, true},
      {"--rebalance-window", "with --rebalance: steps whose median is compared",
       c([](train_options & o) -> auto& { return o.rebalance_window; }), 1, 1e6},
      {"--rebalance-persist",
       "with --rebalance: windows in a row a device must be off by the threshold (0: window + 2)",
       c([](train_options & o) -> auto& { return o.rebalance_persist; }), 0, 1e6},
      {"--rebalance-min-gain",
       "with --rebalance: keep the plan when re-solved ratios would gain less than this share "
       "of the predicted step",
       r([](train_options & o) -> auto& { return o.rebalance_min_gain; }), 0, 0.99},
      {"--checkpoint-dir",
       "the directory checkpoints are saved into (--save-every) and resumed from (--resume); "
       "shared by every rank",
       t([](train_options & o) -> auto& { return o.checkpoint_dir; })},
      {"--save-every", "save a checkpoint after every N steps and after the last (0: never)",
       c([](train_options & o) -> auto& { return o.save_every; }), 0, many},
      {"--keep-checkpoints", "keep only the newest N checkpoints (0: all)",
       c([](train_options & o) -> auto& { return o.keep_checkpoints; }), 0, many},
      {"--resume",
       "continue from the newest checkpoint in --checkpoint-dir (saved under any rank count or "
       "plan); from step 0 when it has none",
       s([](train_options & o) -> auto& { return o.resume; })},
      {"--ram-dir",
       "keep the state after every --ram-every steps in memory files here (\"auto\": under "
       "/dev/shm), each rank's also on a rank of the next node; --resume takes the newest of "
       "both tiers",
       t([](train_options & o) -> auto& { return o.ram_dir; })},
      {"--ram-every", "with --ram-dir: keep the state after every N steps",
       c([](train_options & o) -> auto& { return o.ram_every; }), 1, many},
      {"--ram-budget",
       "with --ram-dir: measure what saves cost the steps over the first ~18 and keep the state "
       "as often as keeps it within this share of a step (0.05: 5 %; 0: every --ram-every)",
       r([](train_options & o) -> auto& { return o.ram_budget; }), 0, 1},
      {"--no-ram-peers", "with --ram-dir: no copies on another node's ranks",
       s([](train_options & o) -> auto& { return o.no_ram_peers; })},
      {"--init-from",
       "start from the parameters of this checkpoint (any layout, or what hspmd-checkpoint "
       "import wrote); optimizer and data start fresh",
       t([](train_options & o) -> auto& { return o.init_from; })},
      {"--save-graph", "write the traced graph as JSON to this file (hspmd-plan --graph plans it)",
       t([](train_options & o) -> auto& { return o.save_graph; }), 0, 0, false, a::presence},
      {"--eval-every", "evaluate every N steps (0: only after the last step)",
       c([](train_options & o) -> auto& { return o.eval_every; }), 0, many},
      {"--eval-batches", "micro-batches per evaluation",
       c([](train_options & o) -> auto& { return o.eval_batches; }), 1, 1e6},
      {"--metrics",
       "write one JSON line per step and evaluation (loss, lr, grad norm, seconds) to this file",
       t([](train_options & o) -> auto& { return o.metrics; }), 0, 0, false, a::presence},
      {"--report",
       "draw the run's loss and step-time curves as SVG pictures (loss.svg, step_time.svg) and "
       "write report.json into this directory (rank 0; made before step 1)",
       t([](train_options & o) -> auto& { return o.report; }), 0, 0, false, a::presence},
      {"--log-every", "a progress line every N steps (0: about 20 lines)",
       c([](train_options & o) -> auto& { return o.log_every; }), 0, many, false, a::none},
      {"--print-graph", "print the traced graph (op, name, shape, FLOPs)",
       s([](train_options & o) -> auto& { return o.print_graph; }), 0, 0, false, a::none},
      {"--profile", "time each op kind and print where a step's time goes",
       s([](train_options & o) -> auto& { return o.profile; })},
      {"--quiet", "no progress or summary lines",
       train_option::action{[](train_options& o) { o.out = nullptr; },
                            [](const train_options& o) { return o.out == nullptr; }},
       0, 0, false, a::none},
  };
  return table;
}

/// Throws `config_error` naming the first option of `o` outside its range, with the range; and
/// in a one-process run (`distributed` false) the first one set that needs a cluster.
inline void check_train_options(const train_options& o, bool distributed = true) {
  for (const train_option& row : train_option_table()) {
    if (row.numeric() && !row.in_range(row.number(o)))
      throw config_error(
          row.name() + " " + row.text(o),
          "lies outside " + row.range() +
              (std::holds_alternative<train_option::count_ref>(row.value) && row.number(o) > 9e18
                   ? " (a negative count wraps around)"
                   : ""),
          "give " + std::string(row.flag) + " a value in " + row.range());
    if (!distributed && row.needs_cluster && row.is_set(o))
      throw config_error(
          std::holds_alternative<train_option::text_ref>(row.value) ? row.name() + " " + row.text(o)
                                                                    : row.name(),
          "needs a cluster (one process has no plan)", "give a cluster file, or drop it");
  }
}

/// What every rank must agree on, as (name, text) pairs in table order (for
/// `agree_on_options`): the value, or "on" / "off" for whether it is set.
[[nodiscard]] inline std::vector<std::pair<std::string, std::string>>
agreed_train_options(const train_options& o) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const train_option& row : train_option_table())
    if (row.agree == train_option::agreement::value)
      out.emplace_back(row.name(), row.text(o));
    else if (row.agree == train_option::agreement::presence)
      out.emplace_back(row.name(), row.is_set(o) ? "on" : "off");
  return out;
}

/// What a checkpoint records of the run's options (its manifest's `meta.options`,
/// docs/checkpoint.md): every option the ranks agree on by value -- what makes the run the run
/// it is -- as (name, text) pairs in table order.
[[nodiscard]] inline std::vector<std::pair<std::string, std::string>>
recorded_train_options(const train_options& o) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const train_option& row : train_option_table())
    if (row.agree == train_option::agreement::value)
      out.emplace_back(row.name(), row.text(o));
  return out;
}

} // namespace hspmd::train
