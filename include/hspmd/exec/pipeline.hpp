#pragma once
// Pipeline execution of a pipeline plan (program/pipeline_plan.hpp): the model cut into stages,
// each pipeline device a group of ranks with a communicator of its own, each stage run by a
// distributed_executor of its graph and SPMD plan on its group (uneven ratios included), a step
// of m micro-batches in the schedule's order (program/pipeline.hpp). A group holds the stages
// of its chunks (stage(d, c) = c p + d: one stage, or v for the interleaved schedule), each
// executor's activation slots (exec/executor_storage.hpp) keeping the micro-batches in flight --
// as many as the schedule has at once on that stage, so 1F1B's stage 0 holds p where GPipe's
// holds m.
//
// A forward receives its boundary values from the producing stages, runs, and sends its own
// on; a backward receives their gradients from the stages that read them (the seeded loss of
// graph/stages.hpp turns them into the stage's backward) and sends the gradients of what it
// received back. A boundary value moves rank to rank, box to box (exec/pipeline_transfers.hpp):
// each reading rank receives only the box its plan loads, from the ranks that computed it, and
// a gradient goes back the same way. Sends are non-blocking, receives block where the value is
// needed: any order `program::check` accepts completes.
// Parameters' gradients accumulate over the micro-batches, scaled by 1/m at the last stage's
// seed, and are synchronized inside the group once a step, during the stage's last backward.
// The zero-bubble schedule (ZB-H1) splits each backward (distributed_executor::split_backward):
// the input gradients go back to the previous stage at once, the weight gradients run later,
// where the device would otherwise wait; a micro-batch's slot (and the output gradients of
// what reads weights) stays taken until then, and the last weight part synchronizes.
//
//     exec::pipeline_executor<float, mpi_communicator> px(micro_graph, plan, world, seed);
//     px.set_input("tokens", whole_batch);   // every rank passes the whole batch
//     const float loss = px.forward_backward();
//     px.update(std::span(optimizers));      // one optimizer per chunk of this rank
//
// Not yet: plans with SFB are refused (their weight gradients come from one backward's factors),
// and a split backward refuses FSDP and recomputation in its stages.

#include <hspmd/comm/communicator.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/micro_batches.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/pipeline_boundaries.hpp>
#include <hspmd/exec/pipeline_checks.hpp>
#include <hspmd/exec/pipeline_transfers.hpp>
#include <hspmd/exec/trace.hpp>
#include <hspmd/exec/whole_tensors.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/program/pipeline.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/synth/cost.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// One rank's stages of a pipeline (see the file comment).
template <std::floating_point T, class Comm>
requires communicator<Comm, T> && communicator<Comm, double> && communicator<Comm, std::uint64_t> &&
    communicator<Comm, char> && async_sender<Comm, T> && requires(const Comm& c) {
  { c.split(0, 0) } -> std::same_as<Comm>;
}
class pipeline_executor {
public:
  using stage_executor = distributed_executor<T, Comm>;

  /// Runs `plan` on the ranks of `world` (as many as its groups hold): this rank's group of
  /// pipeline device d gets a communicator of its own, and each of d's stages a
  /// distributed_executor of the stage's graph and plan on it (collective over `world`).
  /// `g` is the model traced for one micro-batch; parameters are materialized from `seed` as
  /// the single process's are.
  pipeline_executor(const graph::graph& g, const program::pipeline_plan& plan, Comm& world,
                    std::uint64_t seed = 0)
      : g_(g), plan_(plan), s_(plan.make()), world_(&world) {
    check_pipeline(g_, plan_, world);
    cuts_ = plan_.cuts(g_);
    d_ = plan_.group_of(static_cast<std::size_t>(world.rank()));
    leader_ = static_cast<int>(plan_.first_rank(d_)) == world.rank();
    group_.emplace(world.split(static_cast<int>(d_), world.rank()));
    b_ = pipeline_boundaries(g_, cuts_);
    xfer_ = boundary_transfers<T, Comm>(world, plan_, boundary_layouts(g_, cuts_, plan_));
    const std::vector<std::size_t> slots = program::in_flight_per_chunk(s_, d_);
    // Random masks (dropout) are drawn by element index in the whole batch's tensor: a value
    // whose outermost dimension runs along the batch starts at micro-batch j's first row
    // (exec/hierarchical.hpp does the same for a node's rows), so every schedule and m draw
    // the single process's masks.
    const synth::segment_map seg(g_, synth::segment_policy::one);
    for (std::size_t c = 0; c < s_.chunks; ++c) {
      auto st = std::make_unique<stage>();
      st->index = s_.stage(d_, c);
      st->sg = graph::extract_stage(g_, cuts_, st->index);
      st->dx = std::make_unique<stage_executor>(st->sg.g, plan_.stages[st->index], *group_, seed);
      stage_executor& dx = *st->dx;
      executor<T>& e = dx.local();
      const program::local_program& lp = dx.program();
      for (graph::node_id i = 0; i < lp.local.size(); ++i) {
        const graph::node& v = lp.local[i];
        const graph::node_id micro_node = st->sg.global[lp.global[i]];
        if (!v.out.dims.empty() && v.type != dtype::i64 && e.layout(i) != nullptr &&
            seg.is_batch(micro_node, 0))
          st->batch_nodes.emplace_back(i, e.layout(i)->global_size());
      }
      e.set_activation_slots(std::max<std::size_t>(slots[c], 1));
      e.set_accumulate_parameter_gradients(true);
      std::vector<graph::node_id> whole_read; // sent values: read whole by the gather
      for (graph::node_id x : st->sg.sent)
        for (graph::node_id i = 0; i < lp.local.size(); ++i)
          if (lp.global[i] == x)
            whole_read.push_back(i);
      e.keep_element_order(whole_read);
      for (const auto& r : st->sg.received) // their gradients go back after the backward
        for (graph::node_id v : loaded_versions(dx, st->sg.g[r.first].name))
          e.keep_gradient(v);
      if (s_.split_backward()) // zero bubble: input gradients first, weight gradients later
        dx.split_backward();
      if (plan_.stages[st->index].recompute) // (its memory was counted with it)
        (void)recompute(*st);
      if (st->index + 1 == stages()) // the mean over micro-batches, seeded once
        e.set_loss_scale(1.0 / static_cast<double>(s_.micro));
      st->slot_of.assign(s_.micro, none);
      st->free_slots.resize(e.activation_slots());
      for (std::size_t k = 0; k < st->free_slots.size(); ++k)
        st->free_slots[k] = st->free_slots.size() - 1 - k;
      for (std::size_t k = 0; k < s_.order[d_].size(); ++k) // its last backward synchronizes
        if (s_.order[d_][k].chunk == c && (s_.order[d_][k].what == program::pass::backward ||
                                           s_.order[d_][k].what == program::pass::backward_weight))
          st->last_backward = k;
      stages_.push_back(std::move(st));
    }
    if (!b_.tags_fit())
      throw config_error("pipeline",
                         "too many stages and boundary values for MPI's guaranteed tag range",
                         "cut the model into fewer stages");
  }
  pipeline_executor(const pipeline_executor&) = delete;
  pipeline_executor& operator=(const pipeline_executor&) = delete;

  [[nodiscard]] std::size_t stages() const noexcept { return cuts_.size(); }
  [[nodiscard]] const program::pipeline_plan& plan() const noexcept { return plan_; }
  [[nodiscard]] const program::pipeline_schedule& schedule() const noexcept { return s_; }
  /// This rank's pipeline device (its group) and whether it is the group's first rank.
  [[nodiscard]] std::size_t device() const noexcept { return d_; }
  [[nodiscard]] bool leader() const noexcept { return leader_; }
  /// This rank's chunks: chunk c's executor (stage `stage_of_chunk(c)`).
  [[nodiscard]] std::size_t chunks() const noexcept { return stages_.size(); }
  [[nodiscard]] stage_executor& local(std::size_t c) { return *stages_.at(c)->dx; }
  [[nodiscard]] const graph::stage_graph& stage_graph(std::size_t c) const {
    return stages_.at(c)->sg;
  }
  [[nodiscard]] std::size_t stage_of_chunk(std::size_t c) const { return stages_.at(c)->index; }
  /// The micro-batches chunk c holds at once (its executor's activation slots).
  [[nodiscard]] std::size_t slots(std::size_t c) const {
    return stages_.at(c)->dx->local().activation_slots();
  }

  /// Activation recomputation in every stage (distributed_executor::recompute over the plan's
  /// blocks; a stage whose plan says `recompute` does it from the start): a micro-batch's slot
  /// keeps its blocks' inputs only, the backward replays each block. Not with a split backward
  /// (ZB-H1). On every rank, before the first step; returns the bytes of the shared buffers.
  std::size_t recompute() {
    std::size_t bytes = 0;
    for (auto& st : stages_)
      bytes += recompute(*st);
    return bytes;
  }
  /// Emulation of a slower device: every local compute takes `s` times as long.
  void set_slowdown(double s) {
    for (auto& st : stages_)
      st->dx->set_slowdown(s);
  }
  void set_step(std::uint64_t step) {
    for (auto& st : stages_)
      st->dx->set_step(step);
  }
  void set_training(bool on) {
    for (auto& st : stages_)
      st->dx->set_training(on);
  }

  /// The whole batch of data input `name` (every rank passes the same); micro-batch j is its
  /// j-th of m equal parts along the first dimension.
  /// Checked here, on every rank alike (a rank that found it wrong later, inside the step,
  /// would leave the others waiting for its values).
  void set_input(std::string_view name, std::span<const T> whole) { batch_.set(name, whole); }
  void set_input(std::string_view name, std::span<const std::int64_t> whole) {
    batch_.set(name, whole);
  }

  /// Every micro-batch's forward and backward in the schedule's order; returns the batch's loss
  /// (the mean of the micro-batches') on every rank (collective). Afterwards each rank holds its
  /// stages' parameters' gradients of that loss, synchronized inside each group (during the
  /// last micro-batch's backward, as a plain step's).
  T forward_backward() {
    const auto begin = trace_recorder::clock::now();
    for (auto& st : stages_) {
      st->dx->local().zero_parameter_gradients();
      (void)st->dx->take_compute_seconds();
    }
    double loss = 0.0;
    for (std::size_t k = 0; k < s_.order[d_].size(); ++k) {
      const program::pipeline_op& op = s_.order[d_][k];
      stage& st = *stages_[op.chunk];
      if (op.what == program::pass::forward)
        loss += run_forward(st, op.micro);
      else if (op.what == program::pass::backward_weight)
        run_weights(st, op.micro, k == st.last_backward);
      else
        run_backward(st, op.micro, k == st.last_backward, op.what == program::pass::backward_input);
      xfer_.progress();
    }
    xfer_.finish();
    busy_seconds_ = 0.0;
    for (auto& st : stages_)
      busy_seconds_ += st->dx->take_compute_seconds();
    std::array<double, 1> l{loss / static_cast<double>(s_.micro)};
    world_->broadcast(std::span<double>(l), leader_of(stages() - 1));
    step_seconds_ = std::chrono::duration<double>(trace_recorder::clock::now() - begin).count();
    return static_cast<T>(l[0]);
  }

  /// Seconds the last `forward_backward` took on this rank, and the part of them it computed
  /// (the rest: waiting for boundary values -- the bubble -- and communicating).
  [[nodiscard]] double step_seconds() const noexcept { return step_seconds_; }
  [[nodiscard]] double busy_seconds() const noexcept { return busy_seconds_; }

  /// Squared L2 norm of the whole gradient (collective over the world).
  [[nodiscard]] double grad_norm_squared() {
    double s = 0.0;
    for (auto& st : stages_) {
      const double group_total = st->dx->grad_norm_squared(); // (collective in the group)
      s += leader_ ? group_total : 0.0;
    }
    std::array<double, 1> v{s};
    world_->all_reduce(std::span<double>(v), reduce_op::sum);
    return v[0];
  }
  /// Steps chunk c's parameters with `opts[c]` (one optimizer per chunk: its state follows the
  /// chunk's parameters); `grad_scale` as `exec::step_scaled`.
  template <class Optimizer>
  void update(std::span<Optimizer> opts, double grad_scale = 1.0) {
    if (opts.size() != stages_.size())
      throw config_error("pipeline update",
                         std::to_string(opts.size()) + " optimizers for " +
                             std::to_string(stages_.size()) + " chunks on group " +
                             std::to_string(d_),
                         "give one optimizer per chunk");
    for (std::size_t c = 0; c < stages_.size(); ++c)
      stages_[c]->dx->update(opts[c], grad_scale);
  }

  /// The whole value of the model's parameter `name` on every rank (collective over the
  /// world): its stage's group gathers it, the group's first rank sends it.
  [[nodiscard]] std::vector<T> gather_parameter(std::string_view name) {
    const auto id = g_.find(name);
    if (!id || g_[*id].kind != graph::op::parameter)
      throw plan_error("pipeline", "no parameter named \"" + std::string(name) + "\"",
                       "use the model's qualified name, e.g. layers.0.fc1.weight");
    std::size_t k = 0;
    while (*id > cuts_[k].second)
      ++k;
    std::vector<T> v(g_[*id].out.size());
    if (k % s_.devices == d_)
      v = stages_[k / s_.devices]->dx->gather(name);
    world_->broadcast(std::span<T>(v), leader_of(k));
    return v;
  }

  /// Elements of boundary values and their gradients this rank has received so far.
  [[nodiscard]] std::size_t boundary_elements_received() const noexcept {
    return xfer_.elements_received();
  }

  /// The rank's recorder: forward and backward spans per stage and micro-batch (args: stage,
  /// micro, pass), and the waits for boundary values.
  [[nodiscard]] trace_recorder& trace() noexcept { return trace_; }
  /// Starts recording on every rank (collective over the world: the clocks start together
  /// after a barrier).
  void start_trace() {
    world_->barrier();
    trace_.start();
  }
  /// Collective: every rank's events; rank 0 returns the whole trace (exec/trace.hpp), the
  /// others an empty object.
  [[nodiscard]] nlohmann::json collect_trace(const std::vector<std::string>& devices = {}) {
    return gather_trace(*world_, trace_, devices);
  }
  /// The model's graph (one micro-batch's).
  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }

private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  struct stage {
    std::size_t index = 0; // in the pipeline
    graph::stage_graph sg;
    std::unique_ptr<stage_executor> dx;
    std::vector<std::size_t> slot_of; // per micro-batch: its activation slot, or none
    std::vector<std::size_t> free_slots;
    std::vector<std::pair<graph::node_id, std::size_t>> batch_nodes; // (local node, elements)
    std::size_t last_backward = 0;      // index in the order of the step's last backward
    std::size_t recompute_bytes = none; // (none: not recomputing)
  };
  std::size_t recompute(stage& st) {
    if (s_.split_backward())
      throw config_error("pipeline schedule " + std::string(program::name(plan_.schedule)),
                         "splits each backward: a block replayed for its input gradients would "
                         "be needed again for its weight gradients",
                         "recompute under 1f1b, interleaved or gpipe");
    if (st.recompute_bytes == none)
      st.recompute_bytes = st.dx->recompute(plan_.block_prefix);
    return st.recompute_bytes;
  }
  // Micro-batch j's values start at its first row of the whole batch (see the constructor).
  static void at_micro(stage& st, std::size_t j) {
    for (const auto& [i, n] : st.batch_nodes)
      st.dx->local().set_element_base(i, j * n);
  }

  // The first rank of stage k's group.
  [[nodiscard]] int leader_of(std::size_t k) const {
    return static_cast<int>(plan_.first_rank(k % s_.devices));
  }
  // Stage st's boundary values for micro-batch j, received (a span of the trace).
  void receive_values(stage& st, std::size_t j) {
    for (const auto& [local, global] : st.sg.received) {
      const auto [k, q] = b_.producer_of(global);
      scratch_.resize(st.sg.g[local].out.size());
      trace_.span("recv s" + std::to_string(k) + ">s" + std::to_string(st.index) + " m" +
                      std::to_string(j),
                  trace_kind::communication, {{"from_stage", k}, {"micro", j}}, [&] {
                    xfer_.receive_value(std::span<T>(scratch_), k, q, global, st.index,
                                        b_.tag(k, st.index, false, q));
                  });
      st.dx->set_received_input(st.sg.g[local].name, std::span<const T>(scratch_));
    }
  }
  // Stage st's values sent on to the stages that read them (after its forward).
  void send_values(stage& st) {
    stage_executor& dx = *st.dx;
    for (std::size_t q = 0; q < st.sg.sent.size(); ++q) {
      std::vector<T> whole;
      std::span<const T> piece;
      if (const auto v = xfer_.version(st.index, q)) {
        if (dx.program().global.at(*v) != st.sg.sent[q] || dx.program().where[*v].is_partial())
          throw plan_error("pipeline",
                           "stage " + std::to_string(st.index) + "'s lowering differs by rank",
                           "report this: every rank of a group lowers the same program");
        piece = dx.local().value(*v);
      } else { // partial sums only: the group adds them up (collective in the group)
        whole = whole_value(dx, st.sg.g[st.sg.sent[q]].name);
        piece = whole;
      }
      if (piece.size() != xfer_.held(st.index, q).size())
        throw plan_error("pipeline", "stage " + std::to_string(st.index) + "'s piece differs",
                         "report this: its box was lowered from the same plan");
      for (std::size_t to : b_.readers[st.index][q])
        xfer_.send_value(piece, st.index, q, b_.sent[st.index][q], to,
                         b_.tag(st.index, to, false, q));
    }
  }

  void feed(stage& st, std::size_t j) {
    for (graph::node_id i : st.sg.g.inputs()) {
      const graph::node& n = st.sg.g[i];
      if (n.name.starts_with("recv:") || n.name.starts_with("grad:"))
        continue;
      if (n.type == dtype::i64)
        st.dx->set_input(n.name, batch_.template part<std::int64_t>(n, j));
      else
        st.dx->set_input(n.name, batch_.template part<T>(n, j));
    }
  }

  double run_forward(stage& st, std::size_t j) {
    stage_executor& dx = *st.dx;
    if (st.free_slots.empty())
      throw plan_error("pipeline", "stage " + std::to_string(st.index) + " has no free slot",
                       "report this: the slots were counted from the schedule");
    st.slot_of[j] = st.free_slots.back();
    st.free_slots.pop_back();
    dx.local().use_activation_slot(st.slot_of[j]);
    at_micro(st, j);
    feed(st, j);
    const std::string m = " m" + std::to_string(j);
    receive_values(st, j);
    for (graph::node_id gi : st.sg.gradient_inputs) { // (read by the backward only)
      scratch_.assign(st.sg.g[gi].out.size(), T{});
      dx.set_received_input(st.sg.g[gi].name, std::span<const T>(scratch_));
    }
    T loss{};
    trace_.span("F s" + std::to_string(st.index) + m, trace_kind::compute,
                {{"stage", st.index}, {"micro", j}, {"pass", "forward"}},
                [&] { loss = dx.forward(); });
    send_values(st);
    return st.index + 1 == stages() ? static_cast<double>(loss) : 0.0;
  }

  // Micro-batch j's backward on stage st (`inputs_only`: a split backward's first part, whose
  // slot stays taken until `run_weights`).
  void run_backward(stage& st, std::size_t j, bool synchronize, bool inputs_only) {
    stage_executor& dx = resume(st, j, "backward");
    const std::string m = " m" + std::to_string(j);
    for (std::size_t q = 0; q < st.sg.gradient_inputs.size(); ++q) {
      // the sum over the stages (and their ranks) that read the value of what each sends back
      const graph::node& gi = st.sg.g[st.sg.gradient_inputs[q]];
      std::vector<T> sum(gi.out.size(), T{});
      for (std::size_t from : b_.readers[st.index][q])
        trace_.span("recv grad s" + std::to_string(from) + ">s" + std::to_string(st.index) + m,
                    trace_kind::communication, {{"from_stage", from}, {"micro", j}}, [&] {
                      xfer_.receive_gradient(std::span<T>(sum), st.index, q, b_.sent[st.index][q],
                                             from, b_.tag(st.index, from, true, q));
                    });
      dx.set_received_input(gi.name, std::span<const T>(sum));
    }
    trace_.span(
        "B s" + std::to_string(st.index) + m, trace_kind::compute,
        {{"stage", st.index}, {"micro", j}, {"pass", inputs_only ? "backward_input" : "backward"}},
        [&] {
          if (inputs_only)
            dx.backward_inputs();
          else if (synchronize)
            dx.backward();
          else
            dx.backward_accumulating();
        });
    for (const auto& [local, global] : st.sg.received) { // this rank's part of their gradients
      const auto [k, q] = b_.producer_of(global);
      std::vector<T> part(st.sg.g[local].out.size(), T{});
      for (graph::node_id v : loaded_versions(dx, st.sg.g[local].name))
        dx.add_gradient_into(v, std::span<T>(part));
      xfer_.send_gradient(std::span<const T>(part), k, q, global, st.index,
                          b_.tag(k, st.index, true, q));
    }
    if (!inputs_only)
      release(st, j);
  }
  // Micro-batch j's weight gradients on stage st (a split backward's second part); the last
  // one of the step synchronizes the group's parameter gradients.
  void run_weights(stage& st, std::size_t j, bool synchronize) {
    stage_executor& dx = resume(st, j, "weight gradients");
    trace_.span("W s" + std::to_string(st.index) + " m" + std::to_string(j), trace_kind::compute,
                {{"stage", st.index}, {"micro", j}, {"pass", "backward_weight"}},
                [&] { dx.backward_weights(synchronize); });
    release(st, j);
  }
  // Micro-batch j's slot on stage st made the active one again (for its `what` after its
  // forward); the stage's executor.
  stage_executor& resume(stage& st, std::size_t j, const char* what) {
    if (st.slot_of.at(j) == none)
      throw plan_error("pipeline",
                       "stage " + std::to_string(st.index) + " runs micro-batch " +
                           std::to_string(j) + "'s " + what + " before its forward",
                       "check the schedule (program::check)");
    st.dx->local().use_activation_slot(st.slot_of[j]);
    at_micro(st, j);
    return *st.dx;
  }
  void release(stage& st, std::size_t j) {
    st.free_slots.push_back(st.slot_of[j]);
    st.slot_of[j] = none;
  }

  const graph::graph& g_;
  program::pipeline_plan plan_;
  program::pipeline_schedule s_;
  Comm* world_;
  std::optional<Comm> group_;
  std::vector<graph::node_range> cuts_;
  std::size_t d_ = 0;
  bool leader_ = false;
  std::vector<std::unique_ptr<stage>> stages_;
  pipeline_boundaries b_;
  micro_batches<T> batch_{g_, s_.micro};
  boundary_transfers<T, Comm> xfer_;
  std::vector<T> scratch_;
  trace_recorder trace_;
  double step_seconds_ = 0.0, busy_seconds_ = 0.0;
};

} // namespace hspmd::exec
