#pragma once
// What a checkpoint's manifest says of the run besides its tensors (docs/checkpoint.md), and
// what a resumed run checks of it and takes back: the model, the plan, the optimizer and its
// hyper-parameters, the schedule, the data position, the RNG, the precision and f16's loss
// scale. Plain functions; the trainer's loop (train/trainer_impl.hpp) saves and loads the
// tensors through its engine.

#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/train/checkpoint_layout.hpp>
#include <hspmd/train/loss_scale.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/train_options.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace hspmd::train {

/// The manifest's "optimizer" entry: its kind, the run's hyper-parameters, and what
/// `Optimizer` shows of itself (its step count, Adam's betas).
template <class Optimizer>
[[nodiscard]] nlohmann::json optimizer_meta(const Optimizer& opt, const train_options& o) {
  nlohmann::json m{{"kind", std::string(Optimizer::kind)},
                   {"lr", o.lr.peak},
                   {"weight_decay", o.weight_decay},
                   {"clip", o.clip}};
  if constexpr (requires { opt.steps(); })
    m["steps"] = opt.steps();
  if constexpr (requires { opt.beta1; })
    m.update({{"beta1", opt.beta1}, {"beta2", opt.beta2}, {"eps", opt.eps}});
  return m;
}

/// The manifest's run entries after `step` steps (see the file comment).
/// `graph_hash`: synth::graph_hash of the model's graph (a run computes it once: it serializes
/// the graph, a millisecond or more a save).
[[nodiscard]] inline nlohmann::json checkpoint_meta(std::uint64_t graph_hash,
                                                    const train_options& o, const synth::plan* plan,
                                                    nlohmann::json optimizer, std::size_t step,
                                                    const dynamic_loss_scale* loss_scale) {
  nlohmann::json m;
  m["model"] = {{"name", o.name}, {"hash", to_hex(graph_hash)}};
  if (plan != nullptr)
    m["plan"] = {{"strategy", plan->strategy},
                 {"ratios", plan->ratios},
                 {"cluster_fingerprint", to_hex(plan->cluster_fingerprint)}};
  m["ranks"] =
      plan != nullptr && !plan->ratios.empty() ? plan->ratios.front().size() : std::size_t{1};
  m["optimizer"] = std::move(optimizer);
  m["schedule"] = {{"shape", o.lr.shape == lr_schedule::kind::constant ? "constant" : "cosine"},
                   {"peak", o.lr.peak},
                   {"warmup", o.lr.warmup},
                   {"floor", o.lr.floor},
                   {"steps", o.steps},
                   {"next_step", step}};
  m["data"] = {
      {"next_micro_batch", step * o.accumulate}, {"batch", o.batch}, {"accumulate", o.accumulate}};
  m["rng"] = {{"seed", o.seed},
              {"kind", "counter-based: initial values by seed, dropout by seed and micro-batch "
                       "index; nothing else to restore"}};
  m["options"] = nlohmann::json::object(); // every option the ranks agree on, as its flag's text
  for (const auto& [option, text] : recorded_train_options(o))
    m["options"][option] = text;
  m["precision"] = std::string(name(o.precision));
  m["recompute"] = o.recompute;
  if (loss_scale != nullptr) {
    const auto ls = loss_scale->save();
    m["loss_scale"] = {{"scale", ls.scale}, {"clean_steps", ls.clean}, {"skipped", ls.skipped}};
  }
  return m;
}

/// Checks that the checkpoint `info` was saved from this model, by an optimizer of
/// `optimizer_kind` and (when `o` is given) with the same micro-batch and accumulation -- the
/// data of a step follows the micro-batch index, so another split would resume on other data
/// -- and restores f16's loss scale from it. Returns the optimizer step count it holds, if any.
inline std::optional<std::size_t> check_resumed(const checkpoint_info& info, const graph::graph& g,
                                                std::string_view optimizer_kind,
                                                dynamic_loss_scale* loss_scale,
                                                const train_options* o = nullptr) {
  const auto& m = info.meta;
  const std::string file = (info.dir / "manifest.json").string();
  if (o != nullptr && m.contains("data") && m["data"].contains("batch") &&
      m["data"].contains("accumulate")) {
    const auto batch = m["data"]["batch"].get<std::size_t>();
    const auto accumulate = m["data"]["accumulate"].get<std::size_t>();
    if (batch != o->batch || accumulate != o->accumulate)
      throw config_error(file,
                         "was saved by a run of --batch " + std::to_string(batch) +
                             " --accumulate " + std::to_string(accumulate) +
                             "; this run has --batch " + std::to_string(o->batch) +
                             " --accumulate " + std::to_string(o->accumulate) +
                             ": a step's data follows its micro-batches, so the run would go on "
                             "with other data",
                         "resume with the checkpoint's --batch and --accumulate");
  }
  const std::string hash = to_hex(synth::graph_hash(g));
  if (m.contains("model") && m["model"].value("hash", hash) != hash)
    throw config_error(file,
                       "was saved from another model (graph hash " +
                           m["model"].value("hash", std::string("?")) + ", this one " + hash + ")",
                       "resume with the model and batch the checkpoint was saved with");
  const std::string kind(optimizer_kind);
  if (m.contains("optimizer") && m["optimizer"].value("kind", kind) != kind)
    throw config_error(file,
                       "holds the state of optimizer " +
                           m["optimizer"].value("kind", std::string()) + ", this run uses " + kind,
                       "resume with the optimizer the checkpoint was saved with");
  if (loss_scale != nullptr && m.contains("loss_scale"))
    loss_scale->restore({m["loss_scale"].value("scale", 1.0),
                         m["loss_scale"].value("clean_steps", std::size_t{0}),
                         m["loss_scale"].value("skipped", std::size_t{0})});
  if (m.contains("optimizer") && m["optimizer"].contains("steps"))
    return m["optimizer"]["steps"].get<std::size_t>();
  return std::nullopt;
}

} // namespace hspmd::train
