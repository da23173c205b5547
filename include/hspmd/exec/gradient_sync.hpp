#pragma once
// The gradient synchronization of one rank of a distributed step (exec/distributed.hpp runs it
// from the step program's `post`, `wait` and `sfb` instructions): replicated parameters'
// gradients are partial sums over the ranks, all-reduced in the program's buckets (program/
// step.hpp), each packed into a buffer of its own and started as soon as the backward has made
// it (non-blocking where the communicator has one, ordered by an event on a device stream
// where the communicator takes the backend's); or made whole by sufficient-factor broadcasting
// (comm/sfb.hpp) where the plan says so.

#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/sfb.hpp>
#include <hspmd/exec/comm_span.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/trace.hpp>
#include <hspmd/exec/transfers.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/program/step.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace hspmd::exec {

namespace detail {
// True when communicator C starts an all-reduce ordered after backend B's queued work on the
// device (`start_all_reduce(data, op, be.stream())`: an event, no host wait), so a bucket goes
// out while the backend's stream runs the rest of the backward pass.
template <class C, class T, class B>
inline constexpr bool stream_ordered_v = requires(C& c, std::span<T> b, B& be) {
  c.start_all_reduce(b, reduce_op::sum, be.stream());
};

// The request of a communicator's non-blocking all-reduce (stream-ordered where it has that
// form), or `none` when it has none (then the buckets are all-reduced blocking, each as soon as
// it is ready).
struct no_request {};
template <class C, class T, class B>
struct request_of {
  using type = no_request;
  static constexpr bool nonblocking = false;
};
template <class C, class T, class B>
requires stream_ordered_v<C, T, B>
struct request_of<C, T, B> {
  using type = decltype(std::declval<C&>().start_all_reduce(
      std::declval<std::span<T>>(), reduce_op::sum, std::declval<B&>().stream()));
  static constexpr bool nonblocking = true;
};
template <class C, class T, class B>
requires(!stream_ordered_v<C, T, B> && requires(C & c, std::span<T> b) {
  c.start_all_reduce(b, reduce_op::sum);
}) struct request_of<C, T, B> {
  using type =
      decltype(std::declval<C&>().start_all_reduce(std::declval<std::span<T>>(), reduce_op::sum));
  static constexpr bool nonblocking = true;
};
} // namespace detail

/// The buckets of one rank's gradients in flight (see the file comment).
template <std::floating_point T, class Comm, backend B>
class gradient_sync {
public:
  gradient_sync(Comm& comm, executor<T, B>& ex, trace_recorder& trace)
      : comm_(&comm), ex_(&ex), trace_(&trace) {}

  /// Gives each of `sp`'s buckets a buffer, reused every step (`sp` outlives this).
  void plan(const program::step_program& sp) {
    sp_ = &sp;
    buckets_.clear();
    buckets_.resize(sp_->buckets.size());
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      gradient_bucket& b = buckets_[k];
      b.bytes = sp_->buckets[k].elements * sizeof(T);
      b.flat = ex_->backend().template allocate<T>(sp_->buckets[k].elements);
      if constexpr (staged_comm)
        b.staged.assign(sp_->buckets[k].elements, T{});
    }
    requests_.clear();
    requests_.resize(buckets_.size());
  }

  /// Packs bucket k's gradients and starts their all-reduce.
  void start(std::size_t k) {
    gradient_bucket& b = buckets_[k];
    std::size_t at = 0;
    for (graph::node_id id : sp_->buckets[k].params) {
      const auto gr = ex_->grad(id);
      for_each_index(ex_->backend(), gr.size(),
                     copy_elements<T>{gr.data(), b.flat.data() + at, false});
      at += gr.size();
    }
    std::span<T> moved(b.flat.data(), b.flat.size());
    // A device communicator's stream reads the bucket after the packing kernels: ordered by an
    // event where it takes the backend's stream, else the backend finishes its queue first.
    if constexpr (!staged_comm && !host_memory_v<B> && !stream_ordered)
      ex_->backend().synchronize();
    if constexpr (staged_comm) {
      ex_->backend().copy_to_host(b.staged.data(), b.flat.data(), b.flat.size());
      moved = std::span<T>(b.staged);
    }
    b.started = std::chrono::steady_clock::now();
    b.done = false;
    if constexpr (stream_ordered) {
      requests_[k] = comm_->start_all_reduce(moved, reduce_op::sum, ex_->backend().stream());
      in_flight_ = true;
    } else if constexpr (detail::request_of<Comm, T, B>::nonblocking) {
      requests_[k] = comm_->start_all_reduce(moved, reduce_op::sum);
      in_flight_ = true;
    } else {
      trace_->span("all_reduce gradients", trace_kind::communication, args(k),
                   [&] { comm_->all_reduce(moved, reduce_op::sum); });
      b.done = true;
    }
  }

  /// Drives the collectives in flight (MPI progresses only inside its calls); records each one
  /// that completes.
  void progress() {
    if constexpr (detail::request_of<Comm, T, B>::nonblocking) {
      if (!in_flight_)
        return;
      bool any = false;
      for (std::size_t k = 0; k < buckets_.size(); ++k) {
        gradient_bucket& b = buckets_[k];
        if (b.done || requests_[k].done())
          continue;
        if (comm_->test(requests_[k])) {
          b.done = true;
          trace_in_flight(k);
        } else
          any = true;
      }
      in_flight_ = any;
    }
  }

  /// Waits for every bucket and copies the sums back into the gradients.
  void finish() {
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      gradient_bucket& b = buckets_[k];
      if constexpr (detail::request_of<Comm, T, B>::nonblocking) {
        if (!b.done) {
          comm_->wait(requests_[k]);
          b.done = true;
          trace_in_flight(k);
        }
      }
      if constexpr (staged_comm)
        ex_->backend().copy_from_host(b.flat.data(), b.staged.data(), b.staged.size());
      std::size_t at = 0;
      for (graph::node_id id : sp_->buckets[k].params) {
        auto gr = ex_->grad(id);
        for_each_index(ex_->backend(), gr.size(),
                       copy_elements<T>{b.flat.data() + at, gr.data(), false});
        at += gr.size();
      }
    }
    in_flight_ = false;
  }

  [[nodiscard]] nlohmann::json args(std::size_t k) const {
    return {
        {"bytes", buckets_[k].bytes}, {"parameters", sp_->buckets[k].params.size()}, {"bucket", k}};
  }

  /// SFB for replicated weight `w` read by exactly one matmul / linear with row-split input
  /// (program::sfb_applies): all-gather the input rows and the output gradient, one local GEMM.
  void sfb(const program::local_program& prog, graph::node_id w) {
    const graph::node& op = prog.local[program::sfb_user(prog, w)];
    const graph::node_id x = op.inputs[0];
    const program::node_layout& lx = prog.layouts[x];
    const std::size_t k = lx.global.back();
    const std::size_t n = prog.local[w].out.dims[1];
    std::vector<std::size_t> rows;
    for (std::size_t len : prog.lengths[x]) {
      auto d = lx.global;
      d[*lx.split] = len;
      rows.push_back(detail::product(d) / std::max<std::size_t>(k, 1));
    }
    if constexpr (host_memory_v<B>) {
      sfb_weight_gradient(*comm_, std::span<const T>(ex_->value(x)),
                          std::span<const T>(ex_->grad(program::sfb_user(prog, w))),
                          std::span<const std::size_t>(rows), k, n, ex_->grad(w));
    } else {
      // On the device: both factors gathered into backend buffers (directly or staged, like any
      // transfer), then the product as a functor, one weight element per index summing the rows
      // in global order -- the host loop's order, so every rank holds the same bits.
      B& be = ex_->backend();
      const auto [total, x_counts, dy_counts] =
          sfb_layout_of(std::span<const std::size_t>(rows), k, n);
      auto xs = be.template allocate<T>(total * k);
      auto dys = be.template allocate<T>(total * n);
      const auto gather = [&](std::span<const T> piece, T* whole, std::size_t size,
                              const std::vector<std::size_t>& counts) {
        comm_span<const T, Comm, B> in(be, piece, true);
        comm_span<T, Comm, B> out(be, std::span<T>(whole, size), false);
        comm_->all_gather_v(in.get(), out.get(), std::span<const std::size_t>(counts),
                            uneven_algorithm::automatic);
        out.written();
      };
      gather(std::span<const T>(ex_->value(x)), xs.data(), total * k, x_counts);
      gather(std::span<const T>(ex_->grad(program::sfb_user(prog, w))), dys.data(), total * n,
             dy_counts);
      for_each_index(be, k * n,
                     sfb_outer_product<T>{xs.data(), dys.data(), ex_->grad(w).data(), total, k, n});
    }
  }

  /// Bytes of every bucket together, and how many there are.
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (const gradient_bucket& b : buckets_)
      n += b.bytes;
    return n;
  }
  [[nodiscard]] std::size_t size() const noexcept { return buckets_.size(); }

private:
  // Records completed bucket k's all-reduce: from its start to when the host saw it complete;
  // a device communicator adds the seconds its stream spent on it (event timing).
  void trace_in_flight(std::size_t k) {
    if (!trace_->on())
      return;
    nlohmann::json a = args(k);
    if constexpr (requires { comm_->device_seconds(requests_[k]); })
      a["device_ms"] = comm_->device_seconds(requests_[k]) * 1e3;
    trace_->add("all_reduce gradients", trace_kind::in_flight, buckets_[k].started,
                std::chrono::steady_clock::now(), std::move(a));
  }

  // Device buffers over a communicator of host memory: buckets are all-reduced from host copies.
  static constexpr bool staged_comm = !comm_reads_backend_v<Comm, B>;
  // Buckets start on the communicator's stream after an event on the backend's (see above).
  static constexpr bool stream_ordered = detail::stream_ordered_v<Comm, T, B>;
  static_assert(!(stream_ordered && staged_comm),
                "a communicator that takes the backend's stream must read its buffers");

  Comm* comm_;
  executor<T, B>* ex_;
  trace_recorder* trace_;
  const program::step_program* sp_ = nullptr;
  struct gradient_bucket { // the runtime side of the program's bucket of the same index
    std::size_t bytes = 0;
    typename B::template buffer<T> flat; // the bucket's buffer, reused every step
    std::vector<T> staged;               // its host copy when the communicator needs one
    std::chrono::steady_clock::time_point started;
    bool done = true;
  };
  std::vector<gradient_bucket> buckets_;
  std::vector<typename detail::request_of<Comm, T, B>::type> requests_;
  bool in_flight_ = false;
};

} // namespace hspmd::exec
