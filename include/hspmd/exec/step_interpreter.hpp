#pragma once
// The interpreter of a rank's step program (program/step.hpp) under exec/distributed.hpp's
// `distributed_executor`: it owns the rank's executor, transfers, gradient buckets and emulated
// device, and runs the program's instructions one by one -- computes through the executor's
// kernels, transfers and their duals as collectives (exec/transfers.hpp), gradient buckets and
// SFB (exec/gradient_sync.hpp), the loss and the norm -- each traced under its name when a
// trace is recording. `distributed_executor` is its public face.

#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/debug.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/agreement.hpp>
#include <hspmd/exec/comm_span.hpp>
#include <hspmd/exec/emulation.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/gradient_sync.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/trace.hpp>
#include <hspmd/exec/transfers.hpp>
#include <hspmd/program/layout.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/program/step.hpp>
#include <hspmd/synth/cost.hpp>
#include <hspmd/synth/plan.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// Runs rank programs' instructions (see the file comment); `distributed_executor` derives.
template <std::floating_point T, class Comm, backend B>
class step_interpreter {
public:
  /// The name of the program's instruction `k` (as the trace and the simulator name it).
  [[nodiscard]] std::string instruction_name(std::size_t k) const {
    return program::name(sp_.code.at(k), prog_, g_);
  }

protected:
  // Lowers `p` for this rank (after checking that every rank agrees, exec/agreement.hpp) and
  // plans the rank's gradient memory and buckets.
  step_interpreter(const graph::graph& g, const synth::plan& p, Comm& comm, std::uint64_t seed,
                   B backend)
      : g_(g), comm_(&comm), control_(&detail::control_of(comm)),
        prog_(lower_agreed(g, p, *control_)),
        ex_(prog_.local, seed, prog_.layouts, std::move(backend)) {
    ex_.set_row_reduce([this](std::span<T> v, bool max) {
      // (inside a kernel: an emulated slow device first computes what came before, slowly,
      // and then waits for the others only as long as a real one would)
      device_.pause([this] { sync_.progress(); });
      comm_span<T, Comm, B> s(ex_.backend(), v, true);
      comm_->all_reduce(s.get(), max ? reduce_op::max : reduce_op::sum);
      s.written();
      device_.resume();
    });
    // Gradient buffers of intermediate versions are shared across the backward; SFB reads its
    // layer's output gradient after the backward, so that one keeps its own.
    const transfer_buffers tb = transfer_buffers_of(g_, prog_);
    for (graph::node_id id : tb.float_copies)
      ex_.keep_in_float(id);
    ex_.keep_element_order(tb.read_whole);
    std::vector<graph::node_id> keep;
    for (graph::node_id w : sp_.sfb)
      keep.push_back(program::sfb_user(prog_, w));
    gradient_bytes_ = ex_.reuse_gradient_buffers(keep, tb.duals, tb.stored);
    sync_.plan(sp_);
    // FSDP: a parameter kept in shards and all-gathered for use is a working copy (the
    // program's `gathered`, each with its last reader). The copies share one buffer where their
    // lives do not overlap (exec::executor::share_value_buffers); the program gathers each again
    // before its last reader's backward: one layer's parameters at a time instead of the whole
    // model, for one more all-gather per copy (the cost model prices both).
    if (!sp_.gathered.empty())
      gathered_bytes_ = ex_.share_value_buffers(sp_.gathered);
  }
  step_interpreter(const step_interpreter&) = delete;
  step_interpreter& operator=(const step_interpreter&) = delete;
  ~step_interpreter() = default;

  static program::step_options default_options() {
    program::step_options o;
    o.bucket_bytes = static_cast<std::size_t>(synth::gradient_bucket_bytes);
    o.element_bytes = sizeof(T);
    return o;
  }

  // Runs the program's section `s`, instruction by instruction.
  // (`synchronize` false: without the gradient buffers' post, SFB and wait; `part`: a split
  // backward's part, see executor_memory::split_backward -- the inputs part runs the
  // activations' backwards and transfer duals, the weights part the weight-side ones and what
  // reads weights, and synchronizes)
  void run(program::section s, bool synchronize = true, backward_part part = backward_part::whole) {
    using program::code;
    const std::size_t end = sp_.begin(s) + sp_.part(s).size();
    for (std::size_t k = sp_.begin(s); k < end; ++k) {
      const program::instruction& in = sp_.code[k];
      const bool sync = in.op == code::post || in.op == code::sfb || in.op == code::wait;
      if (sync && !synchronize)
        continue;
      if (part != backward_part::whole && s == program::section::backward) {
        const bool weights = part == backward_part::weights;
        if ((in.op == code::backward && !ex_.has_backward_part(in.node, part)) ||
            (in.op == code::move_back && ex_.weight_side(in.node) != weights) ||
            (in.op == code::regather && weights) || (sync && !weights))
          continue;
      }
      execute(k, part);
    }
  }

  // Runs instruction k of the step program, traced under its name.
  void execute(std::size_t k, backward_part part = backward_part::whole) {
    using program::code;
    const program::instruction& in = sp_.code[k];
    switch (in.op) {
    case code::forward:
      traced_compute(k, in.node, "forward");
      break;
    case code::move:
    case code::regather:
      traced_transfer(k, in.node, false);
      break;
    case code::replay:
      if (program::is_moved(prog_, in.node))
        traced_transfer(k, in.node, false);
      else
        traced_compute(k, in.node, "replay");
      break;
    case code::backward:
      traced_compute(k, in.node, "backward", part);
      break;
    case code::move_back:
      ex_.enter_backward(in.node, part);
      traced_transfer(k, in.node, true);
      break;
    case code::loss: {
      T mine{};
      ex_.backend().copy_to_host(&mine, ex_.value(*prog_.local.loss()).data(), 1);
      traced(k, trace_kind::communication, {{"bytes", sizeof(T)}},
             [&] { loss_ = comm_->all_reduce(mine, reduce_op::sum); });
      break;
    }
    case code::post:
      traced(k, trace_kind::communication, sync_.args(in.bucket), [&] { sync_.start(in.bucket); });
      break;
    case code::sfb:
      traced(k, trace_kind::communication, {{"bytes", ex_.grad(in.node).size() * sizeof(T)}},
             [&] { sync_.sfb(prog_, in.node); });
      break;
    case code::wait:
      traced(k, trace_kind::communication, {{"bytes", sync_.bytes()}, {"buckets", sync_.size()}},
             [&] { sync_.finish(); });
      break;
    case code::norm:
      traced(k, trace_kind::communication, {{"bytes", sizeof(double)}},
             [&] { norm_squared_ = comm_->all_reduce(norm_squared_, reduce_op::sum); });
      break;
    case code::update:
      if (!optimizer_step_)
        throw plan_error("distributed executor", "the optimizer instruction has no optimizer",
                         "call update(optimizer)");
      traced(k, trace_kind::compute, {}, [&] { compute(optimizer_step_); });
      break;
    }
    if (k >= sp_.begin(program::section::backward) && k < sp_.begin(program::section::optimizer))
      sync_.progress();
  }

  // Runs f under instruction k's name (with its index in the args) when tracing.
  template <class F>
  void traced(std::size_t k, trace_kind kind, nlohmann::json args, F&& f) {
    if (!trace_.on()) {
      f();
      return;
    }
    args["instruction"] = k;
    trace_.span(instruction_name(k), kind, std::move(args), std::forward<F>(f));
  }

  // Compute of local node i (a forward, backward or replay), traced with its node and op.
  void traced_compute(std::size_t k, graph::node_id i, const char* pass,
                      backward_part part = backward_part::whole) {
    const bool backward = pass[0] == 'b';
    const auto run = [&] {
      compute([&] {
        if (backward)
          ex_.backward_node(i, part);
        else
          ex_.forward_node(i);
      });
    };
    if (!trace_.on()) {
      run();
      return;
    }
    const graph::node& n = prog_.local[i];
    nlohmann::json args{{"op", std::string(graph::name(n.kind))},
                        {"pass", pass},
                        {"slowdown", device_.slowdown()},
                        {"instruction", k}};
    if constexpr (host_memory_v<B>) {
      trace_.span(instruction_name(k), trace_kind::compute, args, run);
    } else {
      // A device's kernels run after the host queued them: the traced node waits for them
      // (events on the backend's stream), so the span is the device's work, its time in args.
      const auto begin = std::chrono::steady_clock::now();
      const double seconds = ex_.backend().timed(run);
      args["device_ms"] = seconds * 1e3;
      trace_.add(instruction_name(k), trace_kind::compute, begin, std::chrono::steady_clock::now(),
                 std::move(args));
    }
  }
  // The transfer making local node i, or its dual, traced with its kind, tensor, bytes and
  // algorithm.
  void traced_transfer(std::size_t k, graph::node_id i, bool backward) {
    const program::lowered_transfer& t = prog_.transfers[*prog_.transfer_of[i]];
    const auto run = [&] {
      if (backward)
        transfer_backward(t);
      else
        transfer_forward(t);
    };
    if (!trace_.on()) {
      run();
      return;
    }
    nlohmann::json args = transfer_trace_args(g_, t, backward);
    args["instruction"] = k;
    trace_.span(instruction_name(k), trace_kind::communication, args, run);
  }

  // Runs f as compute (exec/emulation.hpp), the buckets in flight driven while it waits.
  template <class F>
  void compute(F&& f) {
    device_.compute(std::forward<F>(f), [this] { sync_.progress(); });
  }

  template <class E>
  std::span<E> data_of(graph::node_id id, bool grad) {
    if constexpr (std::is_same_v<E, std::int64_t>) {
      (void)grad;
      return ex_.ids(id);
    } else {
      return grad ? ex_.grad(id) : ex_.value(id);
    }
  }

  template <class E>
  void feed(std::string_view name, std::span<const E> whole, bool same_on_every_rank = true) {
    const graph::node_id gid =
        checked_input(g_, name, whole.size(), std::is_same_v<E, std::int64_t>);
    if (check_inputs_ && same_on_every_rank)
      check_same_input(*control_, name, std::as_bytes(whole), step_);
    for (const program::lowered_transfer& t : prog_.transfers)
      if (t.what.kind == synth::transfer_kind::load && t.what.tensor == gid) {
        const std::span<E> to = data_of<E>(t.target, false);
        if constexpr (host_memory_v<B>) {
          moves_.piece_of(whole.data(), t.target, to.data(), false);
        } else { // the piece is cut on the host and copied once
          std::vector<E> piece(to.size());
          host_backend host;
          moves_.piece_of_on(host, whole.data(), t.target, piece.data(), false);
          ex_.backend().copy_from_host(to.data(), piece.data(), piece.size());
        }
      }
  }

  void transfer_forward(const program::lowered_transfer& t) {
    if (prog_.local[t.target].type == dtype::i64)
      moves_.forward(t, ex_.ids(*t.source), ex_.ids(t.target));
    else
      moves_.forward(t, ex_.value(*t.source), ex_.value(t.target));
  }
  void transfer_backward(const program::lowered_transfer& t) {
    if (prog_.local[t.target].type != dtype::i64)
      moves_.backward(t, ex_.grad(*t.source), ex_.grad(t.target),
                      !ex_.gradient_stored_whole(*t.source));
  }

  // The whole tensor of local version `id` on every rank (collective).
  std::vector<T> assemble(graph::node_id id) {
    return moves_.assemble(id, std::span<const T>(ex_.value(id)));
  }

  const graph::graph& g_;
  Comm* comm_;
  detail::control_t<Comm>* control_;
  program::local_program prog_;
  executor<T, B> ex_;
  transfer_runner<T, Comm, B> moves_{prog_, *comm_, ex_.backend()};
  program::step_options options_ = default_options();
  program::step_program sp_ = program::build(prog_, g_, options_);
  trace_recorder trace_;
  gradient_sync<T, Comm, B> sync_{*comm_, ex_, trace_};
  emulated_device device_; // the slowdown and the compute seconds
  std::uint64_t step_ = 0;
  bool check_inputs_ = true; // every rank feeds (SPMD), so every rank checks
  std::size_t gradient_bytes_ = 0;
  T loss_{};                             // the last forward's global loss
  double norm_squared_ = 0.0;            // the gradient norm's partial, then its sum
  std::function<void()> optimizer_step_; // what the update instruction runs
  std::size_t gathered_bytes_ = 0;
};

} // namespace hspmd::exec
