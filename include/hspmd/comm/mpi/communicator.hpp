#pragma once
// The MPI backend's communicator: host buffers, a private duplicate of the user's MPI
// communicator (so hspmd's messages never match the user's), MPI_ERRORS_RETURN on it, and every
// call checked (failures throw `comm_error` with the rank and MPI's error text).
//
// All operations but rank(), size(), send() and recv() are collective: every rank of the
// communicator calls them in the same order with matching arguments. Uneven all-gather and
// reduce-scatter take an algorithm tag (core/collectives.hpp); `automatic` asks the cost model,
// which must be the same on every rank (it is unless set_cost_model is called unevenly).
//
// Every blocking wait is watched (comm/watchdog.hpp): with HSPMD_TIMEOUT=<seconds> (or
// `set_timeout`), a call that has not completed in time ends the process with a line naming the
// call, its sequence number, the phase and the last completed call, and mpirun ends the job.

#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/debug.hpp>
#include <hspmd/comm/mpi/check.hpp>
#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/comm/uneven_algorithms.hpp>
#include <hspmd/comm/watchdog.hpp>
#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd {

/// Element types the MPI backend moves.
template <class T>
concept mpi_element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, std::uint64_t> || std::is_same_v<T, std::byte> || std::is_same_v<T, char>;

/// The MPI datatype of element type T (for code that calls MPI next to the communicator, as the
/// collectives benchmark does).
template <mpi_element T>
[[nodiscard]] MPI_Datatype mpi_datatype() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return MPI_UINT64_T;
  else
    return MPI_BYTE;
}

namespace detail {
[[nodiscard]] inline MPI_Op mpi_op(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::max:
    return MPI_MAX;
  case reduce_op::min:
    return MPI_MIN;
  case reduce_op::sum:
    break;
  }
  return MPI_SUM;
}
} // namespace detail

/// A communicator over MPI with host buffers. Satisfies `communicator`.
class mpi_communicator {
public:
  /// Duplicates `comm` (collective over `comm`), sets MPI_ERRORS_RETURN on the duplicate, reads
  /// HSPMD_DEBUG (which every rank must set alike: checked here) and HSPMD_TIMEOUT (no limit
  /// when unset), and starts from default costs for a shared-memory link (2 us, 5 GB/s) until
  /// `set_cost_model` or `calibrate_collectives` provides measured ones.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD) {
    const int world = detail::world_rank();
    HSPMD_MPI_CHECK(MPI_Comm_dup(comm, &comm_), world);
    try {
      HSPMD_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), world);
      HSPMD_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), world);
      HSPMD_MPI_CHECK(MPI_Comm_size(comm_, &size_), rank_);
      // Read on every rank before any check can throw, so that all ranks take part below.
      std::exception_ptr env_error;
      try {
        debug_ = debug_collectives_from_env();
        watchdog_ = std::make_unique<collective_watchdog>(rank_, timeout_from_env());
      } catch (const config_error&) {
        env_error = std::current_exception();
      }
      agree_on_environment(env_error != nullptr);
      if (env_error != nullptr)
        std::rethrow_exception(env_error);
      watchdog_->set_members(world, world_ranks());
    } catch (...) {
      release();
      throw;
    }
    model_ = collective_cost_model::from_link(size_, 2e-6, 5e9);
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  mpi_communicator(mpi_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_),
        debug_(o.debug_), sequence_(o.sequence_), model_(o.model_), scratch_(std::move(o.scratch_)),
        watchdog_(std::move(o.watchdog_)) {}
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      debug_ = o.debug_;
      sequence_ = o.sequence_;
      model_ = o.model_;
      scratch_ = std::move(o.scratch_);
      watchdog_ = std::move(o.watchdog_);
    }
    return *this;
  }
  ~mpi_communicator() { release(); }

  /// This process's rank, 0 .. size() - 1.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The ranks that pass the same `color`, numbered in `key` order (collective over this
  /// communicator; e.g. the ranks of one node, or the ranks at one position of every node).
  [[nodiscard]] mpi_communicator split(int color, int key) const {
    MPI_Comm part = MPI_COMM_NULL;
    HSPMD_MPI_CHECK(MPI_Comm_split(comm_, color, key, &part), rank_);
    try {
      mpi_communicator out(part); // its own duplicate
      MPI_Comm_free(&part);
      return out;
    } catch (...) {
      MPI_Comm_free(&part);
      throw;
    }
  }
  /// The underlying (duplicated) MPI communicator.
  [[nodiscard]] MPI_Comm native_handle() const noexcept { return comm_; }
  /// True when HSPMD_DEBUG=detail: every collective first compares fingerprints.
  [[nodiscard]] bool debug() const noexcept { return debug_; }

  /// The limit on each blocking wait in seconds (0: none); see comm/watchdog.hpp.
  [[nodiscard]] double timeout() const { return watchdog_ ? watchdog_->timeout() : 0.0; }
  /// Sets the limit on each blocking wait (0: none). The library trainer sets
  /// `timeout_from_env(default_training_timeout)`.
  void set_timeout(double seconds) {
    if (watchdog_)
      watchdog_->set_timeout(seconds);
  }
  /// What this rank is doing, named when a wait times out ("training step 5").
  void set_phase(std::string phase) {
    if (watchdog_)
      watchdog_->set_phase(std::move(phase));
  }

  /// The cost model `automatic` consults. Set it to the same model on every rank.
  [[nodiscard]] const collective_cost_model& cost_model() const noexcept { return model_; }
  void set_cost_model(const collective_cost_model& m) noexcept { model_ = m; }
  /// The algorithm `automatic` resolves to for `counts` of `elem_bytes`-byte elements.
  [[nodiscard]] uneven_algorithm choose(collective op, std::span<const std::size_t> counts,
                                        std::size_t elem_bytes) const {
    return model_.choose(op, counts, elem_bytes);
  }

  /// Collective: returns when every rank has called it.
  void barrier() {
    const auto w =
        watch(precheck<char>(collective::barrier, 0, {}, -1, -1, uneven_algorithm::native));
    HSPMD_MPI_CHECK(MPI_Barrier(comm_), rank_);
  }

  /// Collective: copies `data` of rank `root` into `data` on every rank (same size everywhere).
  template <mpi_element T>
  void broadcast(std::span<T> data, int root) {
    const auto w = watch(
        precheck<T>(collective::broadcast, data.size(), {}, root, -1, uneven_algorithm::native));
    HSPMD_MPI_CHECK(
        MPI_Bcast(data.data(), count_of(data.size(), "MPI_Bcast"), mpi_datatype<T>(), root, comm_),
        rank_);
  }

  /// Collective: `out[i] = op over ranks of in[i]`; `in` and `out` have the same size on every
  /// rank; they may be the same span (in place).
  template <mpi_element T>
  void all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    if (in.size() != out.size())
      throw comm_error(rank_, "all_reduce",
                       "in has " + std::to_string(in.size()) + " elements, out " +
                           std::to_string(out.size()),
                       "pass buffers of equal size");
    const auto w = watch(precheck<T>(collective::all_reduce, out.size(), {}, -1,
                                     static_cast<int>(op), uneven_algorithm::native));
    const void* send = in.data() == out.data() ? MPI_IN_PLACE : static_cast<const void*>(in.data());
    HSPMD_MPI_CHECK(MPI_Allreduce(send, out.data(), count_of(out.size(), "MPI_Allreduce"),
                                  mpi_datatype<T>(), detail::mpi_op(op), comm_),
                    rank_);
  }
  /// In-place `all_reduce`.
  template <mpi_element T>
  void all_reduce(std::span<T> data, reduce_op op) {
    all_reduce(std::span<const T>(data), data, op);
  }
  /// `all_reduce` of one value.
  template <mpi_element T>
  [[nodiscard]] T all_reduce(T value, reduce_op op) {
    T out{};
    all_reduce(std::span<const T>(&value, 1), std::span<T>(&out, 1), op);
    return out;
  }

  /// Collective: concatenates every rank's `in` in rank order into `out` on every rank.
  /// `counts[r]` is rank r's number of elements; `in.size()` must be counts[rank()] and
  /// `out.size()` their sum.
  template <mpi_element T>
  void all_gather_v(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                    uneven_algorithm alg = uneven_algorithm::automatic) {
    const layout l = layout_of(counts, "all_gather_v");
    check_sizes("all_gather_v", in.size(), counts[me()], out.size(), l.total);
    alg = resolve(collective::all_gather_v, alg, counts, sizeof(T));
    const auto w = watch(precheck<T>(collective::all_gather_v, l.total, counts, -1, -1, alg));
    gather(in.data(), out, counts, l, alg);
  }
  /// In-place `all_gather_v`: this rank's part is already at its place in `data`.
  template <mpi_element T>
  void all_gather_v(std::span<T> data, std::span<const std::size_t> counts,
                    uneven_algorithm alg = uneven_algorithm::automatic) {
    const layout l = layout_of(counts, "all_gather_v");
    check_sizes("all_gather_v", counts[me()], counts[me()], data.size(), l.total);
    alg = resolve(collective::all_gather_v, alg, counts, sizeof(T));
    const auto w = watch(precheck<T>(collective::all_gather_v, l.total, counts, -1, -1, alg));
    gather(static_cast<const T*>(nullptr), data, counts, l, alg);
  }

  /// Collective: reduces `in` (sum of counts elements, the same layout on every rank) over
  /// ranks and leaves segment r (counts[r] elements at offset counts[0] + .. + counts[r-1]) on
  /// rank r, in `out` (counts[rank()] elements).
  template <mpi_element T>
  void reduce_scatter_v(std::span<const T> in, std::span<T> out,
                        std::span<const std::size_t> counts, reduce_op op,
                        uneven_algorithm alg = uneven_algorithm::automatic) {
    const layout l = layout_of(counts, "reduce_scatter_v");
    check_sizes("reduce_scatter_v", out.size(), counts[me()], in.size(), l.total);
    alg = resolve(collective::reduce_scatter_v, alg, counts, sizeof(T));
    const auto w = watch(
        precheck<T>(collective::reduce_scatter_v, l.total, counts, -1, static_cast<int>(op), alg));
    scatter(in, out, counts, l, op, alg, false);
  }
  /// In-place `reduce_scatter_v`: reduces the whole of `data` and leaves this rank's segment at
  /// its own place in `data` (the rest of `data` is unspecified afterwards). Followed by an
  /// in-place `all_gather_v` with the same counts, it is an all-reduce.
  template <mpi_element T>
  void reduce_scatter_v(std::span<T> data, std::span<const std::size_t> counts, reduce_op op,
                        uneven_algorithm alg = uneven_algorithm::automatic) {
    const layout l = layout_of(counts, "reduce_scatter_v");
    check_sizes("reduce_scatter_v", counts[me()], counts[me()], data.size(), l.total);
    alg = resolve(collective::reduce_scatter_v, alg, counts, sizeof(T));
    const auto w = watch(
        precheck<T>(collective::reduce_scatter_v, l.total, counts, -1, static_cast<int>(op), alg));
    scatter(std::span<const T>(data),
            data.subspan(static_cast<std::size_t>(l.displs[me()]), counts[me()]), counts, l, op,
            alg, true);
  }

  /// Collective: sends send_counts[r] consecutive elements of `in` to rank r and receives
  /// recv_counts[r] from rank r into `out`, both in rank order. Rank r's send_counts[s] must equal
  /// rank s's recv_counts[r] (checked in debug mode).
  template <mpi_element T>
  void all_to_all_v(std::span<const T> in, std::span<const std::size_t> send_counts,
                    std::span<T> out, std::span<const std::size_t> recv_counts) {
    const layout s = layout_of(send_counts, "all_to_all_v");
    const layout r = layout_of(recv_counts, "all_to_all_v");
    if (in.size() != s.total || out.size() != r.total)
      throw comm_error(rank_, "all_to_all_v",
                       "buffer sizes (in " + std::to_string(in.size()) + ", out " +
                           std::to_string(out.size()) + ") do not match the counts (send " +
                           std::to_string(s.total) + ", receive " + std::to_string(r.total) + ")",
                       "in.size() == sum of send_counts and out.size() == sum of recv_counts");
    const auto w =
        watch(precheck<T>(collective::all_to_all_v, 0, {}, -1, -1, uneven_algorithm::native));
    if (debug_)
      check_all_to_all_counts(send_counts, recv_counts);
    HSPMD_MPI_CHECK(MPI_Alltoallv(in.data(), s.counts.data(), s.displs.data(), mpi_datatype<T>(),
                                  out.data(), r.counts.data(), r.displs.data(), mpi_datatype<T>(),
                                  comm_),
                    rank_);
  }

  /// A collective started by a `start_*` call and not yet known to be complete. Its buffer must
  /// stay valid and unread until `test` returns true or `wait` returns. Move-only.
  class request {
  public:
    request() = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    request(request&& o) noexcept : r_(std::exchange(o.r_, MPI_REQUEST_NULL)), call_(o.call_) {}
    request& operator=(request&& o) noexcept {
      std::swap(r_, o.r_);
      std::swap(call_, o.call_);
      return *this;
    }
    /// An unfinished request is cancelled by freeing it (MPI completes it in the background);
    /// only an error path drops one.
    ~request() {
      if (r_ != MPI_REQUEST_NULL)
        MPI_Request_free(&r_);
    }
    /// True once `test` or `wait` saw it complete (or it was never started).
    [[nodiscard]] bool done() const noexcept { return r_ == MPI_REQUEST_NULL; }

  private:
    friend class mpi_communicator;
    MPI_Request r_ = MPI_REQUEST_NULL;
    pending_call call_; // what `wait` reports when it times out
  };

  /// Collective, non-blocking: starts the in-place sum (or max, min) of `data` over the ranks.
  /// Ranks start their non-blocking and blocking collectives in the same order. Open MPI moves
  /// the data only inside MPI calls: call `test` between pieces of work to keep it going.
  template <mpi_element T>
  [[nodiscard]] request start_all_reduce(std::span<T> data, reduce_op op) {
    request r;
    r.call_ = precheck<T>(collective::all_reduce, data.size(), {}, -1, static_cast<int>(op),
                          uneven_algorithm::native);
    HSPMD_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data.data(),
                                   count_of(data.size(), "MPI_Iallreduce"), mpi_datatype<T>(),
                                   detail::mpi_op(op), comm_, &r.r_),
                    rank_);
    return r;
  }
  /// Advances `r`; true when it has completed (its buffer then holds the result).
  bool test(request& r) {
    if (r.done())
      return true;
    int flag = 0;
    HSPMD_MPI_CHECK(MPI_Test(&r.r_, &flag, MPI_STATUS_IGNORE), rank_);
    return flag != 0;
  }
  /// Blocks until `r` has completed (watched like a blocking collective).
  void wait(request& r) {
    if (r.done())
      return;
    const auto w = watch(r.call_);
    HSPMD_MPI_CHECK(MPI_Wait(&r.r_, MPI_STATUS_IGNORE), rank_);
  }

  /// Point to point: sends `data` to rank `dest` with `tag` (blocking).
  template <mpi_element T>
  void send(std::span<const T> data, int dest, int tag) {
    const auto w = watch({{}, "send to", dest, tag});
    HSPMD_MPI_CHECK(MPI_Send(data.data(), count_of(data.size(), "MPI_Send"), mpi_datatype<T>(),
                             dest, tag, comm_),
                    rank_);
  }
  /// Point to point, non-blocking: starts sending `data` to rank `dest` with `tag`; `data` must
  /// stay as it is until `wait` (or `test`) says the request completed. What a pipeline's stages
  /// send forward and back (exec/pipeline.hpp): a blocking send there can wait for a receive
  /// that the peer posts only after its own send completes.
  template <mpi_element T>
  [[nodiscard]] request start_send(std::span<const T> data, int dest, int tag) {
    request r;
    r.call_ = {{}, "send to", dest, tag};
    HSPMD_MPI_CHECK(MPI_Isend(data.data(), count_of(data.size(), "MPI_Isend"), mpi_datatype<T>(),
                              dest, tag, comm_, &r.r_),
                    rank_);
    return r;
  }
  /// Point to point, non-blocking: starts receiving up to `data.size()` elements from rank `src`
  /// with `tag` into `data`, which must stay untouched until the request completed (the RAM
  /// tier's peer copies, train/ram_tier.hpp: a step's shards move while the next step computes).
  template <mpi_element T>
  [[nodiscard]] request start_recv(std::span<T> data, int src, int tag) {
    request r;
    r.call_ = {{}, "receive from", src, tag};
    HSPMD_MPI_CHECK(MPI_Irecv(data.data(), count_of(data.size(), "MPI_Irecv"), mpi_datatype<T>(),
                              src, tag, comm_, &r.r_),
                    rank_);
    return r;
  }
  /// Point to point: receives exactly `data.size()` elements from rank `src` with `tag`;
  /// throws `comm_error` when the message has another size.
  template <mpi_element T>
  void recv(std::span<T> data, int src, int tag) {
    MPI_Status status{};
    const auto w = watch({{}, "receive from", src, tag});
    HSPMD_MPI_CHECK(MPI_Recv(data.data(), count_of(data.size(), "MPI_Recv"), mpi_datatype<T>(), src,
                             tag, comm_, &status),
                    rank_);
    int got = 0;
    HSPMD_MPI_CHECK(MPI_Get_count(&status, mpi_datatype<T>(), &got), rank_);
    if (static_cast<std::size_t>(got) != data.size())
      throw comm_error(rank_, "recv",
                       "expected " + std::to_string(data.size()) + " elements from rank " +
                           std::to_string(src) + ", got " + std::to_string(got),
                       "send and receive the same number of elements");
  }

private:
  struct layout {
    std::vector<int> counts;
    std::vector<int> displs;
    std::size_t total = 0;
    std::size_t largest = 0;
  };

  [[nodiscard]] std::size_t me() const noexcept { return static_cast<std::size_t>(rank_); }

  // MPI 3 counts are ints: refuse what does not fit rather than wrap around.
  [[nodiscard]] int count_of(std::size_t n, const char* call) const {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw comm_error(rank_, call, std::to_string(n) + " elements exceed MPI's int count limit",
                       "split the buffer into chunks of at most 2^31 - 1 elements");
    return static_cast<int>(n);
  }

  [[nodiscard]] layout layout_of(std::span<const std::size_t> counts, const char* call) const {
    if (counts.size() != static_cast<std::size_t>(size_))
      throw comm_error(rank_, call,
                       std::to_string(counts.size()) + " counts for " + std::to_string(size_) +
                           " ranks",
                       "pass one count per rank");
    layout l;
    l.counts.reserve(counts.size());
    l.displs.reserve(counts.size());
    for (std::size_t c : counts) {
      l.displs.push_back(count_of(l.total, call));
      l.counts.push_back(count_of(c, call));
      l.total += c;
      l.largest = std::max(l.largest, c);
    }
    (void)count_of(l.total, call);
    (void)count_of(l.largest * counts.size(), call); // the padded algorithm's buffer
    return l;
  }

  void check_sizes(const char* call, std::size_t part, std::size_t part_expected, std::size_t whole,
                   std::size_t whole_expected) const {
    if (part != part_expected || whole != whole_expected)
      throw comm_error(rank_, call,
                       "buffer sizes (this rank's part " + std::to_string(part) + ", whole " +
                           std::to_string(whole) + ") do not match the counts (this rank " +
                           std::to_string(part_expected) + ", total " +
                           std::to_string(whole_expected) + ")",
                       "the part has counts[rank] elements and the whole their sum");
  }

  [[nodiscard]] uneven_algorithm resolve(collective op, uneven_algorithm alg,
                                         std::span<const std::size_t> counts,
                                         std::size_t elem_bytes) const {
    return alg == uneven_algorithm::automatic ? model_.choose(op, counts, elem_bytes) : alg;
  }

  // The members' ranks in MPI_COMM_WORLD, in this communicator's order (local: no messages).
  [[nodiscard]] std::vector<int> world_ranks() const {
    MPI_Group mine = MPI_GROUP_NULL;
    MPI_Group world = MPI_GROUP_NULL;
    std::vector<int> local(static_cast<std::size_t>(size_));
    std::vector<int> global(local.size(), -1);
    for (std::size_t i = 0; i < local.size(); ++i)
      local[i] = static_cast<int>(i);
    if (MPI_Comm_group(comm_, &mine) == MPI_SUCCESS &&
        MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS)
      MPI_Group_translate_ranks(mine, size_, local.data(), world, global.data());
    if (mine != MPI_GROUP_NULL)
      MPI_Group_free(&mine);
    if (world != MPI_GROUP_NULL)
      MPI_Group_free(&world);
    return global;
  }

  // What the call is (for the watchdog), after comparing it across ranks in debug mode.
  template <class T>
  [[nodiscard]] pending_call precheck(collective op, std::size_t count,
                                      std::span<const std::size_t> counts, int root, int reduction,
                                      uneven_algorithm alg) {
    const std::uint64_t seq = sequence_++;
    pending_call p;
    p.call = fingerprint_of<T>(seq, op, count, counts, root, reduction, alg);
    if (!debug_)
      return p;
    const auto w = watch(p);
    const auto words = p.call.words();
    std::vector<std::uint64_t> all(words.size() * me_count());
    HSPMD_MPI_CHECK(MPI_Allgather(words.data(), static_cast<int>(words.size()), MPI_UINT64_T,
                                  all.data(), static_cast<int>(words.size()), MPI_UINT64_T, comm_),
                    rank_);
    check_fingerprints(unpack_fingerprints(all), rank_);
    return p;
  }

  // Watches a blocking wait for `p` until the returned scope ends.
  [[nodiscard]] collective_watchdog::scope watch(const pending_call& p) {
    return watchdog_ ? watchdog_->watch(p) : collective_watchdog::scope(nullptr);
  }

  // HSPMD_DEBUG must be alike on every rank (debug mode adds a collective before each call, so
  // a difference would hang at the first one); a bad environment value on any rank ends every
  // rank. Collective, at construction.
  void agree_on_environment(bool bad_here) {
    std::array<int, 3> v = {debug_ ? 1 : 0, debug_ ? 0 : 1, bad_here ? 1 : 0};
    HSPMD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), 3, MPI_INT, MPI_MAX, comm_), rank_);
    if (v[2] != 0 && !bad_here)
      throw comm_error(rank_, "environment",
                       "another rank has a bad HSPMD_DEBUG or HSPMD_TIMEOUT (see its message)",
                       "give every rank valid values");
    if (!bad_here && v[0] != 0 && v[1] != 0)
      throw comm_error(rank_, "environment variable HSPMD_DEBUG",
                       std::string("differs between ranks: detail on some, off on others (this "
                                   "rank: ") +
                           (debug_ ? "detail" : "off") + ")",
                       "set it alike on every rank, e.g. mpirun -x HSPMD_DEBUG=detail");
  }
  [[nodiscard]] std::size_t me_count() const noexcept { return static_cast<std::size_t>(size_); }

  void check_all_to_all_counts(std::span<const std::size_t> send_counts,
                               std::span<const std::size_t> recv_counts) {
    std::vector<std::uint64_t> mine(send_counts.begin(), send_counts.end());
    std::vector<std::uint64_t> all(mine.size() * me_count());
    HSPMD_MPI_CHECK(
        MPI_Allgather(mine.data(), size_, MPI_UINT64_T, all.data(), size_, MPI_UINT64_T, comm_),
        rank_);
    for (std::size_t s = 0; s < me_count(); ++s)
      if (all[s * me_count() + me()] != recv_counts[s])
        throw comm_error(rank_, "collective mismatch (HSPMD_DEBUG=detail)",
                         "all_to_all_v: rank " + std::to_string(s) + " sends " +
                             std::to_string(all[s * me_count() + me()]) + " elements to rank " +
                             std::to_string(rank_) + ", which expects " +
                             std::to_string(recv_counts[s]),
                         "rank r's send_counts[s] must equal rank s's recv_counts[r]");
  }

  void wait_all(std::vector<MPI_Request>& requests) { // inside a watched call
    HSPMD_MPI_CHECK(
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
        rank_);
  }

  // Scratch memory for the padded algorithm, reused across calls.
  template <class T>
  [[nodiscard]] std::span<T> scratch(std::size_t elements) {
    const std::size_t bytes = elements * sizeof(T);
    if (scratch_.size() < bytes)
      scratch_.resize(bytes);
    return {reinterpret_cast<T*>(scratch_.data()), elements}; // NOLINT: storage reuse
  }

  // The primitives of the padded and grouped algorithms (comm/uneven_algorithms.hpp) on MPI.
  template <mpi_element T>
  struct uneven_primitives {
    mpi_communicator& c;
    MPI_Datatype type = mpi_datatype<T>();
    std::vector<MPI_Request> requests = {};

    T* scratch(std::size_t n) { return c.scratch<T>(n).data(); }
    void copy(T* to, const T* from, std::size_t n) {
      if (n > 0 && to != from)
        std::copy_n(from, n, to);
    }
    void zero(T* at, std::size_t n) { std::fill_n(at, n, T{}); }
    void all_gather_blocks(const T* mine, T* all, std::size_t m) {
      const int k = c.count_of(m, "MPI_Allgather");
      HSPMD_MPI_CHECK(MPI_Allgather(mine, k, type, all, k, type, c.comm_), c.rank_);
    }
    void reduce_scatter_blocks(const T* all, T* mine, std::size_t m, reduce_op op) {
      HSPMD_MPI_CHECK(MPI_Reduce_scatter_block(all, mine, c.count_of(m, "MPI_Reduce_scatter_block"),
                                               type, detail::mpi_op(op), c.comm_),
                      c.rank_);
    }
    template <class F>
    void group(F&& f) {
      requests.clear();
      f();
      c.wait_all(requests);
    }
    void broadcast(T* data, std::size_t n, std::size_t root) {
      requests.emplace_back();
      HSPMD_MPI_CHECK(MPI_Ibcast(data, c.count_of(n, "MPI_Ibcast"), type, static_cast<int>(root),
                                 c.comm_, &requests.back()),
                      c.rank_);
    }
    void reduce(const T* in, T* out, std::size_t n, reduce_op op, std::size_t root) {
      requests.emplace_back();
      const void* send = in == out ? MPI_IN_PLACE : static_cast<const void*>(in);
      HSPMD_MPI_CHECK(MPI_Ireduce(send, out, c.count_of(n, "MPI_Ireduce"), type, detail::mpi_op(op),
                                  static_cast<int>(root), c.comm_, &requests.back()),
                      c.rank_);
    }
  };

  // all_gather_v body; `in` == nullptr means this rank's part is already in place in `out`.
  template <mpi_element T>
  void gather(const T* in, std::span<T> out, std::span<const std::size_t> counts, const layout& l,
              uneven_algorithm alg) {
    const std::vector<std::size_t> offsets(l.displs.begin(), l.displs.end());
    const T* own = in != nullptr ? in : out.data() + offsets[me()];
    uneven_primitives<T> p{*this};
    switch (alg) {
    case uneven_algorithm::padded:
      detail::padded_all_gather(p, own, out, counts, std::span<const std::size_t>(offsets), me());
      return;
    case uneven_algorithm::grouped:
      detail::grouped_all_gather(p, own, out, counts, std::span<const std::size_t>(offsets), me());
      return;
    case uneven_algorithm::native:
    case uneven_algorithm::automatic:
      break;
    }
    const void* send = in != nullptr ? static_cast<const void*>(in) : MPI_IN_PLACE;
    HSPMD_MPI_CHECK(MPI_Allgatherv(send, l.counts[me()], p.type, out.data(), l.counts.data(),
                                   l.displs.data(), p.type, comm_),
                    rank_);
  }

  // reduce_scatter_v body; `in_place`: `out` is this rank's segment inside `in`.
  template <mpi_element T>
  void scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
               const layout& l, reduce_op op, uneven_algorithm alg, bool in_place) {
    const std::vector<std::size_t> offsets(l.displs.begin(), l.displs.end());
    uneven_primitives<T> p{*this};
    switch (alg) {
    case uneven_algorithm::padded:
      detail::padded_reduce_scatter(p, in.data(), out.data(), counts,
                                    std::span<const std::size_t>(offsets), me(), op);
      return;
    case uneven_algorithm::grouped:
      detail::grouped_reduce_scatter(p, in.data(), out.data(), counts,
                                     std::span<const std::size_t>(offsets), me(), op);
      return;
    case uneven_algorithm::native:
    case uneven_algorithm::automatic:
      break;
    }
    const MPI_Op mop = detail::mpi_op(op);
    if (!in_place) {
      HSPMD_MPI_CHECK(
          MPI_Reduce_scatter(in.data(), out.data(), l.counts.data(), p.type, mop, comm_), rank_);
      return;
    }
    // MPI's in-place form leaves the result at the start of the buffer: move it to its place.
    T* whole = const_cast<T*>(in.data()); // NOLINT: `in` is the caller's mutable `data`
    HSPMD_MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, whole, l.counts.data(), p.type, mop, comm_),
                    rank_);
    std::copy_backward(whole, whole + out.size(), out.data() + out.size());
  }

  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && finalized == 0)
      MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool debug_ = false;
  std::uint64_t sequence_ = 0;
  collective_cost_model model_;
  std::vector<std::byte> scratch_;
  std::unique_ptr<collective_watchdog> watchdog_;
};

static_assert(communicator<mpi_communicator, float> &&
              communicator<mpi_communicator, std::int32_t>);

} // namespace hspmd
