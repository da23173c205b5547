#pragma once
// Pipeline execution: a model cut into stages (graph/stages.hpp), each stage on a device of the
// communicator, a step of m micro-batches run in a schedule's order (program/pipeline.hpp).
// Device d of the schedule is rank d; it holds the stages of its chunks (stage(d, c) = c p + d:
// one stage, or v for the interleaved schedule), each in an executor of its own whose
// activation slots (exec/executor_memory.hpp) keep the micro-batches in flight -- as many as
// the schedule has at once on that stage, so 1F1B's stage 0 holds p where GPipe's holds m.
//
// A forward receives the boundary values from the previous stage's rank, runs, and sends its
// own to the next stage's; a backward receives their gradients from the next stage (the
// seeded loss of graph/stages.hpp turns them into the stage's backward) and sends the
// gradients of what it received back. Sends are non-blocking (a blocking one can wait on a
// receive that its peer posts after its own send), receives block where the value is needed:
// any order `program::check` accepts completes. Parameters' gradients accumulate over the
// micro-batches, scaled by 1/m at the last stage's seed, so after `forward_backward` each rank
// holds its stages' gradients of the whole batch's mean loss; the optimizer steps each stage's
// executor.
//
//     exec::pipeline_executor<float, mpi_communicator> px(g, cuts, schedule, comm, seed);
//     px.set_input("tokens", whole_batch);   // every rank passes the whole batch
//     const float loss = px.forward_backward();
//     px.update(optimizers);                 // one optimizer per chunk of this rank
//
// ZB-H1's weight-gradient pass runs with its input-gradient pass here (the backward is one
// pass): the order is the schedule's, the bubble that splitting buys is not yet.

#include <hspmd/comm/communicator.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/emulation.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/trace.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/program/pipeline.hpp>
#include <hspmd/synth/cost.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// A communicator that sends without blocking (`start_send` and its request).
template <class C, class T>
concept async_sender = requires(C& c, std::span<const T> data, typename C::request& r) {
  { c.start_send(data, 0, 0) } -> std::same_as<typename C::request>;
  { c.test(r) } -> std::convertible_to<bool>;
  c.wait(r);
};

/// The micro-batches in flight at once on each chunk of device `d` under schedule `s`: a
/// forward takes a slot, its (input-gradient) backward gives it back.
[[nodiscard]] inline std::vector<std::size_t>
in_flight_per_chunk(const program::pipeline_schedule& s, std::size_t d) {
  std::vector<std::size_t> now(s.chunks, 0), peak(s.chunks, 0);
  for (const program::pipeline_op& op : s.order.at(d)) {
    if (op.what == program::pass::forward)
      peak[op.chunk] = std::max(peak[op.chunk], ++now[op.chunk]);
    else if (op.what != program::pass::backward_weight && now[op.chunk] > 0)
      --now[op.chunk];
  }
  return peak;
}

/// One rank's stages of a pipeline (see the file comment).
template <std::floating_point T, class Comm>
requires communicator<Comm, T> && communicator<Comm, double> && async_sender<Comm, T>
class pipeline_executor {
public:
  /// Rank d of `comm` runs device d of `s` (`comm.size()` must be `s.devices`); `cuts` are the
  /// stages of `g` (s.devices * s.chunks of them, graph::stages_at_blocks or balanced_stages).
  /// Parameters are materialized from `seed` as the single process's are.
  pipeline_executor(const graph::graph& g, std::span<const graph::node_range> cuts,
                    program::pipeline_schedule s, Comm& comm, std::uint64_t seed = 0)
      : g_(g), cuts_(cuts.begin(), cuts.end()), s_(std::move(s)), comm_(&comm) {
    program::check(s_);
    const std::string where = "pipeline";
    if (static_cast<std::size_t>(comm.size()) != s_.devices)
      throw config_error(where,
                         "the schedule has " + std::to_string(s_.devices) + " devices and the " +
                             "communicator " + std::to_string(comm.size()) + " ranks",
                         "run one rank per pipeline device");
    if (cuts_.size() != s_.devices * s_.chunks)
      throw config_error(where,
                         std::to_string(cuts_.size()) + " stages for a schedule of " +
                             std::to_string(s_.devices) + " devices x " +
                             std::to_string(s_.chunks) + " chunks",
                         "cut the model into devices x chunks stages");
    d_ = static_cast<std::size_t>(comm.rank());
    find_boundaries();
    const std::vector<std::size_t> slots = in_flight_per_chunk(s_, d_);
    // Random masks (dropout) are drawn by element index in the whole batch's tensor: a value
    // whose outermost dimension runs along the batch starts at micro-batch j's first row
    // (exec/hierarchical.hpp does the same for a node's rows), so every schedule and m draw
    // the single process's masks.
    const synth::segment_map seg(g_, synth::segment_policy::one);
    for (std::size_t c = 0; c < s_.chunks; ++c) {
      auto st = std::make_unique<stage>();
      st->index = s_.stage(d_, c);
      st->sg = graph::extract_stage(g_, cuts_, st->index);
      std::vector<program::node_layout> layouts(st->sg.g.size());
      for (graph::node_id i = 0; i < st->sg.g.size(); ++i) {
        const graph::node& v = st->sg.g[i];
        layouts[i].global = v.out.dims;
        if (!v.out.dims.empty() && v.type != dtype::i64 && seg.is_batch(st->sg.global[i], 0))
          st->batch_nodes.emplace_back(i, v.out.size());
      }
      st->ex = std::make_unique<executor<T>>(st->sg.g, seed, std::move(layouts));
      executor<T>& e = *st->ex;
      e.set_activation_slots(std::max<std::size_t>(slots[c], 1));
      e.set_accumulate_parameter_gradients(true);
      e.keep_element_order(st->sg.sent);
      std::vector<graph::node_id> keep;
      for (const auto& r : st->sg.received)
        keep.push_back(r.first);
      e.reuse_gradient_buffers(keep);
      if (st->index + 1 == stages()) // the mean over micro-batches, seeded once
        e.set_loss_scale(1.0 / static_cast<double>(s_.micro));
      st->slot_of.assign(s_.micro, none);
      st->free_slots.resize(e.activation_slots());
      for (std::size_t k = 0; k < st->free_slots.size(); ++k)
        st->free_slots[k] = st->free_slots.size() - 1 - k;
      stages_.push_back(std::move(st));
    }
    // tags: (producer, consumer, direction, value)
    if (stages() * stages() * 2 * values_per_boundary_ > 32767)
      throw config_error(where,
                         "too many stages and boundary values for MPI's guaranteed tag range",
                         "cut the model into fewer stages");
  }
  pipeline_executor(const pipeline_executor&) = delete;
  pipeline_executor& operator=(const pipeline_executor&) = delete;

  [[nodiscard]] std::size_t stages() const noexcept { return cuts_.size(); }
  [[nodiscard]] const program::pipeline_schedule& schedule() const noexcept { return s_; }
  /// This rank's chunks: the executor of chunk c (stage `stage_of_chunk(c)`).
  [[nodiscard]] std::size_t chunks() const noexcept { return stages_.size(); }
  [[nodiscard]] executor<T>& local(std::size_t c) { return *stages_.at(c)->ex; }
  [[nodiscard]] const graph::stage_graph& stage_graph(std::size_t c) const {
    return stages_.at(c)->sg;
  }
  [[nodiscard]] std::size_t stage_of_chunk(std::size_t c) const { return stages_.at(c)->index; }
  /// The micro-batches chunk c holds at once (its executor's activation slots).
  [[nodiscard]] std::size_t slots(std::size_t c) const {
    return stages_.at(c)->ex->activation_slots();
  }

  /// Emulation of a slower device: every local compute takes `s` times as long.
  void set_slowdown(double s) noexcept { device_.set_slowdown(s); }
  void set_step(std::uint64_t step) {
    for (auto& st : stages_)
      st->ex->set_step(step);
  }
  void set_training(bool on) {
    for (auto& st : stages_)
      st->ex->set_training(on);
  }

  /// The whole batch of data input `name` (every rank passes the same); micro-batch j is its
  /// j-th of m equal parts along the first dimension.
  void set_input(std::string_view name, std::span<const T> whole) {
    values_[std::string(name)].assign(whole.begin(), whole.end());
  }
  void set_input(std::string_view name, std::span<const std::int64_t> whole) {
    ids_[std::string(name)].assign(whole.begin(), whole.end());
  }

  /// Every micro-batch's forward and backward in the schedule's order; returns the batch's loss
  /// (the mean of the micro-batches') on every rank (collective). Afterwards each rank holds its
  /// stages' parameters' gradients of that loss.
  T forward_backward() {
    const auto begin = trace_recorder::clock::now();
    busy_seconds_ = 0.0;
    for (auto& st : stages_)
      st->ex->zero_parameter_gradients();
    double loss = 0.0;
    for (const program::pipeline_op& op : s_.order[d_]) {
      stage& st = *stages_[op.chunk];
      if (op.what == program::pass::forward)
        loss += run_forward(st, op.micro);
      else if (op.what != program::pass::backward_weight)
        run_backward(st, op.micro);
      progress();
    }
    for (pending& p : sends_)
      comm_->wait(p.request);
    sends_.clear();
    std::array<double, 1> l{loss / static_cast<double>(s_.micro)};
    comm_->broadcast(std::span<double>(l), static_cast<int>((stages() - 1) % s_.devices));
    step_seconds_ = std::chrono::duration<double>(trace_recorder::clock::now() - begin).count();
    return static_cast<T>(l[0]);
  }

  /// Seconds the last `forward_backward` took on this rank, and the part of them it computed
  /// (the rest: waiting for boundary values, the bubble).
  [[nodiscard]] double step_seconds() const noexcept { return step_seconds_; }
  [[nodiscard]] double busy_seconds() const noexcept { return busy_seconds_; }

  /// Squared L2 norm of the whole gradient (collective: each parameter lives on one rank).
  [[nodiscard]] double grad_norm_squared() {
    double s = 0.0;
    for (auto& st : stages_)
      for (graph::node_id p : st->sg.g.parameters())
        s += sum_of_squares(std::span<const T>(st->ex->grad(p)));
    std::array<double, 1> v{s};
    comm_->all_reduce(std::span<double>(v), reduce_op::sum);
    return v[0];
  }
  /// Steps chunk c's parameters with `opts[c]` (one optimizer per chunk: its state follows the
  /// chunk's parameters); `grad_scale` as `exec::step_scaled`.
  template <class Optimizer>
  void update(std::span<Optimizer> opts, double grad_scale = 1.0) {
    if (opts.size() != stages_.size())
      throw config_error("pipeline update",
                         std::to_string(opts.size()) + " optimizers for " +
                             std::to_string(stages_.size()) + " chunks on rank " +
                             std::to_string(d_),
                         "give one optimizer per chunk");
    for (std::size_t c = 0; c < stages_.size(); ++c)
      compute([&] { step_scaled(opts[c], *stages_[c]->ex, grad_scale); });
  }

  /// The whole value (or gradient) of the model's parameter `name` on every rank (collective):
  /// its stage's rank sends it.
  [[nodiscard]] std::vector<T> gather_parameter(std::string_view name, bool gradient = false) {
    const auto id = g_.find(name);
    if (!id || g_[*id].kind != graph::op::parameter)
      throw plan_error("pipeline", "no parameter named \"" + std::string(name) + "\"",
                       "use the model's qualified name, e.g. layers.0.fc1.weight");
    std::size_t k = 0;
    while (*id > cuts_[k].second)
      ++k;
    std::vector<T> v(g_[*id].out.size());
    const std::size_t owner = k % s_.devices;
    if (owner == d_) {
      executor<T>& e = *stages_[k / s_.devices]->ex;
      v = gradient ? e.grad_to_host(e.parameter(name)) : e.value_to_host(e.parameter(name));
    }
    comm_->broadcast(std::span<T>(v), static_cast<int>(owner));
    return v;
  }

  /// The rank's recorder: forward and backward spans per stage and micro-batch, and the waits
  /// for boundary values.
  [[nodiscard]] trace_recorder& trace() noexcept { return trace_; }

private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  struct stage {
    std::size_t index = 0; // in the pipeline
    graph::stage_graph sg;
    std::unique_ptr<executor<T>> ex;
    std::vector<std::size_t> slot_of; // per micro-batch: its activation slot, or none
    std::vector<std::size_t> free_slots;
    std::vector<std::pair<graph::node_id, std::size_t>> batch_nodes; // (node, its elements)
  };
  // Micro-batch j's values start at its first row of the whole batch (see the constructor).
  static void at_micro(stage& st, std::size_t j) {
    for (const auto& [i, n] : st.batch_nodes)
      st.ex->set_element_base(i, j * n);
  }
  struct pending {
    typename Comm::request request;
    std::vector<T> data;
  };

  // Every stage's boundary values, on every rank alike (as graph::extract_stage finds them):
  // per stage, the values it sends (whole-graph nodes in node order) and per value the later
  // stages that read it.
  void find_boundaries() {
    std::vector<std::size_t> stage_of(g_.size());
    for (std::size_t k = 0; k < stages(); ++k)
      for (graph::node_id i = cuts_[k].first; i <= cuts_[k].second; ++i)
        stage_of[i] = k;
    sent_.assign(stages(), {});
    readers_.assign(stages(), {});
    std::vector<std::vector<std::size_t>> readers(g_.size());
    for (graph::node_id j = 0; j < g_.size(); ++j)
      for (graph::node_id in : g_[j].inputs)
        if (stage_of[j] != stage_of[in] && g_[in].kind != graph::op::input &&
            std::ranges::find(readers[in], stage_of[j]) == readers[in].end())
          readers[in].push_back(stage_of[j]);
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (!readers[i].empty()) {
        sent_[stage_of[i]].push_back(i);
        readers_[stage_of[i]].push_back(readers[i]);
      }
    for (const auto& v : sent_)
      values_per_boundary_ = std::max(values_per_boundary_, v.size());
    producer_of_ = [stage_of = std::move(stage_of), this](graph::node_id global) {
      const std::size_t k = stage_of[global];
      const auto at = std::ranges::find(sent_[k], global) - sent_[k].begin();
      return std::pair{k, static_cast<std::size_t>(at)};
    };
  }
  [[nodiscard]] int rank_of(std::size_t k) const { return static_cast<int>(k % s_.devices); }
  // Value q of stage `producer` read by stage `consumer`, forward or its gradient back.
  [[nodiscard]] int tag(std::size_t producer, std::size_t consumer, bool backward,
                        std::size_t q) const {
    return static_cast<int>(
        ((producer * stages() + consumer) * 2 + (backward ? 1 : 0)) * values_per_boundary_ + q);
  }

  template <class F>
  void compute(F&& f) {
    const auto begin = trace_recorder::clock::now();
    device_.compute(std::forward<F>(f), [this] { progress(); });
    busy_seconds_ += std::chrono::duration<double>(trace_recorder::clock::now() - begin).count();
  }
  // Drives the sends in flight; forgets the finished ones.
  void progress() {
    while (!sends_.empty() && comm_->test(sends_.front().request))
      sends_.pop_front();
  }
  void send(std::span<const T> v, std::size_t to_stage, int tag_) {
    sends_.push_back({{}, std::vector<T>(v.begin(), v.end())});
    pending& p = sends_.back();
    p.request = comm_->start_send(std::span<const T>(p.data), rank_of(to_stage), tag_);
  }
  void receive(std::span<T> into, std::size_t from_stage, int tag_, std::string_view what) {
    trace_.span(what, trace_kind::communication, {{"from", rank_of(from_stage)}},
                [&] { comm_->recv(into, rank_of(from_stage), tag_); });
  }
  // Micro-batch j's part of the whole batch `whole` of input node `n`'s name.
  template <class E>
  std::span<const E> micro_part(const std::vector<E>& whole, std::size_t j,
                                const graph::node& n) const {
    const std::size_t part = n.out.size();
    if (whole.size() != part * s_.micro)
      throw shape_error("pipeline input \"" + n.name + "\"",
                        std::to_string(whole.size()) + " elements for " + std::to_string(s_.micro) +
                            " micro-batches of " + n.out.to_string(),
                        "pass the whole batch: micro-batches x the stage graph's input");
    return std::span<const E>(whole).subspan(j * part, part);
  }
  void feed(stage& st, std::size_t j) {
    for (graph::node_id i : st.sg.g.inputs()) {
      const graph::node& n = st.sg.g[i];
      if (n.name.starts_with("recv:") || n.name.starts_with("grad:"))
        continue;
      if (n.type == dtype::i64) {
        const auto it = ids_.find(n.name);
        if (it == ids_.end())
          throw config_error("pipeline input \"" + n.name + "\"", "not set",
                             "call set_input for every input of the model");
        st.ex->set_input(n.name, micro_part(it->second, j, n));
      } else {
        const auto it = values_.find(n.name);
        if (it == values_.end())
          throw config_error("pipeline input \"" + n.name + "\"", "not set",
                             "call set_input for every input of the model");
        st.ex->set_input(n.name, micro_part(it->second, j, n));
      }
    }
  }

  double run_forward(stage& st, std::size_t j) {
    executor<T>& e = *st.ex;
    if (st.free_slots.empty())
      throw plan_error("pipeline", "stage " + std::to_string(st.index) + " has no free slot",
                       "report this: the slots were counted from the schedule");
    st.slot_of[j] = st.free_slots.back();
    st.free_slots.pop_back();
    e.use_activation_slot(st.slot_of[j]);
    at_micro(st, j);
    feed(st, j);
    const std::string m = " m" + std::to_string(j);
    for (const auto& [local, global] : st.sg.received) {
      const auto [k, q] = producer_of_(global);
      receive(e.value(local), k, tag(k, st.index, false, q),
              "recv s" + std::to_string(k) + ">s" + std::to_string(st.index) + m);
    }
    for (graph::node_id gi : st.sg.gradient_inputs) // (read by the backward only)
      std::ranges::fill(e.value(gi), T{});
    T loss{};
    trace_.span("F s" + std::to_string(st.index) + " m" + std::to_string(j), trace_kind::compute,
                {{"stage", st.index}, {"micro", j}, {"pass", "forward"}},
                [&] { compute([&] { loss = e.forward(); }); });
    for (std::size_t q = 0; q < st.sg.sent.size(); ++q)
      for (std::size_t to : readers_[st.index][q])
        send(e.value(st.sg.sent[q]), to, tag(st.index, to, false, q));
    return st.index + 1 == stages() ? static_cast<double>(loss) : 0.0;
  }

  void run_backward(stage& st, std::size_t j) {
    executor<T>& e = *st.ex;
    if (st.slot_of.at(j) == none)
      throw plan_error("pipeline",
                       "stage " + std::to_string(st.index) + " runs micro-batch " +
                           std::to_string(j) + "'s backward before its forward",
                       "check the schedule (program::check)");
    e.use_activation_slot(st.slot_of[j]);
    at_micro(st, j);
    const std::string m = " m" + std::to_string(j);
    for (std::size_t q = 0; q < st.sg.gradient_inputs.size(); ++q) {
      // the sum over the stages that read the value of what each sends back
      const std::span<T> into = e.value(st.sg.gradient_inputs[q]);
      const auto& from = readers_[st.index][q];
      for (std::size_t r = 0; r < from.size(); ++r) {
        const std::string what =
            "recv grad s" + std::to_string(from[r]) + ">s" + std::to_string(st.index) + m;
        if (r == 0) {
          receive(into, from[r], tag(st.index, from[r], true, q), what);
          continue;
        }
        scratch_.resize(into.size());
        receive(std::span<T>(scratch_), from[r], tag(st.index, from[r], true, q), what);
        for (std::size_t x = 0; x < into.size(); ++x)
          into[x] += scratch_[x];
      }
    }
    trace_.span("B s" + std::to_string(st.index) + " m" + std::to_string(j), trace_kind::compute,
                {{"stage", st.index}, {"micro", j}, {"pass", "backward"}},
                [&] { compute([&] { e.backward(); }); });
    for (const auto& [local, global] : st.sg.received) {
      const auto [k, q] = producer_of_(global);
      send(e.grad(local), k, tag(k, st.index, true, q));
    }
    st.free_slots.push_back(st.slot_of[j]);
    st.slot_of[j] = none;
  }

  const graph::graph& g_;
  std::vector<graph::node_range> cuts_;
  program::pipeline_schedule s_;
  Comm* comm_;
  std::size_t d_ = 0;
  std::vector<std::unique_ptr<stage>> stages_;
  std::size_t values_per_boundary_ = 1;
  std::vector<std::vector<graph::node_id>> sent_;              // per stage (see find_boundaries)
  std::vector<std::vector<std::vector<std::size_t>>> readers_; // per stage, per sent value
  std::function<std::pair<std::size_t, std::size_t>(graph::node_id)> producer_of_;
  std::vector<T> scratch_;
  std::map<std::string, std::vector<T>> values_;
  std::map<std::string, std::vector<std::int64_t>> ids_;
  std::deque<pending> sends_;
  emulated_device device_;
  trace_recorder trace_;
  double step_seconds_ = 0.0, busy_seconds_ = 0.0;
};

} // namespace hspmd::exec
