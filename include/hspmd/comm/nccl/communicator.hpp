#pragma once
// The NCCL backend's communicator: device buffers, one CUDA stream of its own (the
// communication stream), a non-blocking NCCL communicator bootstrapped over MPI. Every blocking
// call is enqueued on the stream and then waited for while polling NCCL's asynchronous error
// state, so a failure on any rank aborts the communicator and throws `comm_error` instead of
// hanging (HSPMD_TIMEOUT=<seconds> bounds the wait as well). `start_all_reduce` returns at once:
// ordered after a compute stream's queued work by an event, it runs while that stream goes on
// (the distributed executor's gradient buckets overlap the backward pass this way).
//
// Buffers are spans over device memory of the current CUDA device. Collectives are collective
// over the ranks of the bootstrap MPI communicator, in the same order on every rank.
//
// The communication stream is a blocking stream: it waits for work on CUDA's legacy default
// stream, so a buffer a caller filled by cudaMemcpy, cudaMemset or a kernel on stream 0 is
// complete before a collective reads it. (A cudaMemcpy from pageable host memory returns before
// its DMA has landed; on a non-blocking stream the first H200 run read half-copied inputs:
// 785k wrong elements at 1-4 MiB in hspmd-collectives --backend nccl.) Work on another
// non-blocking stream -- a backend's -- is ordered by an event (`start_all_reduce`) or by the
// caller's synchronizing first.
//
// Uneven algorithms on NCCL (NCCL has no v-collectives):
//   padded  : pad to the largest shard in a scratch buffer, ncclAllGather / ncclReduceScatter,
//             trim with device copies
//   grouped : one ncclBroadcast / ncclReduce per non-empty shard, in one NCCL group
//   native  : grouped ncclSend/ncclRecv; reduce-scatter then sums the received segments on the
//             device with cuBLAS axpy (floating-point types; for integer types `automatic`
//             picks padded or grouped and an explicit `native` is refused)

#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/debug.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/nccl/check.hpp>
#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/comm/uneven_algorithms.hpp>
#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd {

/// Element types the NCCL backend moves.
template <class T>
concept nccl_element =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>;

namespace detail {
template <nccl_element T>
[[nodiscard]] constexpr ncclDataType_t nccl_datatype() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ncclInt64;
  else
    return ncclUint64;
}

[[nodiscard]] inline ncclRedOp_t nccl_op(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::max:
    return ncclMax;
  case reduce_op::min:
    return ncclMin;
  case reduce_op::sum:
    break;
  }
  return ncclSum;
}

} // namespace detail

/// Selects this rank's GPU: its rank among the ranks on its node (MPI_COMM_TYPE_SHARED), modulo
/// the node's GPUs. Throws `comm_error` naming CUDA's error and `fix` when the rank sees no GPU.
inline void select_local_device(mpi_communicator& comm,
                                const std::string& fix = "run one process per GPU on GPU nodes") {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm.native_handle(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL,
                      &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    throw comm_error(
        comm.rank(), "cudaGetDeviceCount",
        e != cudaSuccess ? std::string(cudaGetErrorString(e)) : std::string("no CUDA device"), fix);
  }
  HSPMD_CUDA_CHECK(cudaSetDevice(local % count), comm.rank());
}

/// A communicator over NCCL with device buffers. Satisfies `communicator`.
class nccl_communicator {
public:
  /// Buffers are device memory (exec/comm_span.hpp).
  static constexpr bool device_buffers = true;

  /// Collective over `bootstrap`: rank 0 creates the NCCL id and broadcasts it over MPI; every
  /// rank joins with its current CUDA device. Waits are bounded by the bootstrap's timeout
  /// (HSPMD_TIMEOUT, or what the trainer set). `bootstrap` must outlive this communicator (debug
  /// fingerprints travel over it).
  explicit nccl_communicator(mpi_communicator& bootstrap)
      : mpi_(&bootstrap), rank_(bootstrap.rank()), size_(bootstrap.size()),
        debug_(bootstrap.debug()), timeout_(bootstrap.timeout()), model_(bootstrap.cost_model()) {
    ncclUniqueId id{};
    if (rank_ == 0)
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast(std::span<char>(reinterpret_cast<char*>(&id), sizeof id),
                        0); // NOLINT: raw bytes
    HSPMD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault), rank_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    wait_ready("ncclCommInitRankConfig");
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator(nccl_communicator&&) = delete;
  nccl_communicator& operator=(nccl_communicator&&) = delete;
  ~nccl_communicator() {
    if (comm_ != nullptr) {
      if (healthy_) {
        ncclCommFinalize(comm_);
        ncclResult_t state = ncclInProgress;
        while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress)
          std::this_thread::yield();
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (blas_ != nullptr)
      cublasDestroy(blas_);
    if (scratch_ != nullptr)
      cudaFree(scratch_);
    if (stream_ != nullptr)
      cudaStreamDestroy(stream_);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The MPI communicator it was bootstrapped over: host-memory control traffic goes there
  /// (exec/distributed.hpp's plan agreement, input checks and traces).
  [[nodiscard]] mpi_communicator& bootstrap() const noexcept { return *mpi_; }
  /// The stream every operation runs on; calls return after it has finished.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return comm_; }
  [[nodiscard]] const collective_cost_model& cost_model() const noexcept { return model_; }
  void set_cost_model(const collective_cost_model& m) { model_ = m; }
  [[nodiscard]] uneven_algorithm choose(collective op, std::span<const std::size_t> counts,
                                        std::size_t elem_bytes) const {
    return model_.choose(op, counts, elem_bytes);
  }

  /// Collective: returns when every rank has called it (a one-element all-reduce).
  void barrier() {
    precheck<std::int32_t>(collective::barrier, 0, {}, -1, -1, uneven_algorithm::native);
    auto* one = device_scratch<std::int32_t>(1);
    HSPMD_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(std::int32_t), stream_), rank_);
    check(ncclAllReduce(one, one, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce");
    wait("barrier");
  }

  template <nccl_element T>
  void broadcast(std::span<T> data, int root) {
    precheck<T>(collective::broadcast, data.size(), {}, root, -1, uneven_algorithm::native);
    check(ncclBroadcast(data.data(), data.data(), data.size(), detail::nccl_datatype<T>(), root,
                        comm_, stream_),
          "ncclBroadcast");
    wait("broadcast");
  }

  template <nccl_element T>
  void all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    if (in.size() != out.size())
      throw comm_error(rank_, "all_reduce", "in and out differ in size", "equal sizes");
    precheck<T>(collective::all_reduce, out.size(), {}, -1, static_cast<int>(op),
                uneven_algorithm::native);
    check(ncclAllReduce(in.data(), out.data(), out.size(), detail::nccl_datatype<T>(),
                        detail::nccl_op(op), comm_, stream_),
          "ncclAllReduce");
    wait("all_reduce");
  }
  template <nccl_element T>
  void all_reduce(std::span<T> data, reduce_op op) {
    all_reduce(std::span<const T>(data), data, op);
  }
  /// A non-blocking all-reduce in flight (`start_all_reduce`): events recorded on the
  /// communication stream before and after it. Move-only; destroys its events.
  class request {
  public:
    request() = default;
    request(request&& o) noexcept
        : start_(std::exchange(o.start_, nullptr)), done_(std::exchange(o.done_, nullptr)),
          finished_(o.finished_) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        release();
        start_ = std::exchange(o.start_, nullptr);
        done_ = std::exchange(o.done_, nullptr);
        finished_ = o.finished_;
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { release(); }
    /// True when nothing is in flight (never started, or seen complete by test/wait).
    [[nodiscard]] bool done() const noexcept { return done_ == nullptr || finished_; }

  private:
    friend class nccl_communicator;
    void release() noexcept {
      if (start_ != nullptr)
        (void)cudaEventDestroy(start_);
      if (done_ != nullptr)
        (void)cudaEventDestroy(done_);
      start_ = done_ = nullptr;
    }
    cudaEvent_t start_ = nullptr;
    cudaEvent_t done_ = nullptr;
    bool finished_ = false;
  };

  /// Collective, non-blocking: starts the in-place sum (or max, min) of `data` on the
  /// communication stream and returns at once. `after`: a compute stream whose queued work (the
  /// kernels that wrote `data`) the all-reduce waits for on the device (an event), so the host
  /// goes on queueing work there while the all-reduce runs; without one the caller must have
  /// finished writing `data`. Ranks start their collectives in the same order.
  template <nccl_element T>
  [[nodiscard]] request start_all_reduce(std::span<T> data, reduce_op op,
                                         cudaStream_t after = nullptr) {
    precheck<T>(collective::all_reduce, data.size(), {}, -1, static_cast<int>(op),
                uneven_algorithm::native);
    request r;
    HSPMD_CUDA_CHECK(cudaEventCreate(&r.start_), rank_);
    HSPMD_CUDA_CHECK(cudaEventCreate(&r.done_), rank_);
    if (after != nullptr) {
      // `start_` first marks the compute stream's position; then it is re-recorded on ours.
      HSPMD_CUDA_CHECK(cudaEventRecord(r.start_, after), rank_);
      HSPMD_CUDA_CHECK(cudaStreamWaitEvent(stream_, r.start_, 0), rank_);
    }
    HSPMD_CUDA_CHECK(cudaEventRecord(r.start_, stream_), rank_);
    check(ncclAllReduce(data.data(), data.data(), data.size(), detail::nccl_datatype<T>(),
                        detail::nccl_op(op), comm_, stream_),
          "ncclAllReduce");
    HSPMD_CUDA_CHECK(cudaEventRecord(r.done_, stream_), rank_);
    return r;
  }
  /// True when `r` has completed (its buffer then holds the result); polls NCCL's asynchronous
  /// error state, so a failed peer throws here instead of hanging.
  bool test(request& r) {
    if (r.done())
      return true;
    const cudaError_t q = cudaEventQuery(r.done_);
    if (q == cudaSuccess)
      return r.finished_ = true;
    if (q != cudaErrorNotReady)
      detail::cuda_check(q, "cudaEventQuery", rank_);
    poll_async_error("all_reduce");
    return false;
  }
  /// Blocks until `r` has completed, within HSPMD_TIMEOUT.
  void wait(request& r) {
    const auto start = std::chrono::steady_clock::now();
    while (!test(r)) {
      if (timed_out(start))
        fail("all_reduce",
             "did not finish within " + std::to_string(timeout_) + " s (HSPMD_TIMEOUT)",
             "another rank may be stuck, gone, or calling a different collective");
      std::this_thread::yield();
    }
  }
  /// The seconds the communication stream spent on completed request `r` (event timing; the
  /// trace's in-flight span on a device).
  [[nodiscard]] double device_seconds(const request& r) const {
    float ms = 0;
    if (r.start_ == nullptr || !r.finished_ ||
        cudaEventElapsedTime(&ms, r.start_, r.done_) != cudaSuccess)
      return 0.0;
    return static_cast<double>(ms) * 1e-3;
  }

  /// One host value reduced over the ranks (through the device scratch buffer).
  template <nccl_element T>
  [[nodiscard]] T all_reduce(T value, reduce_op op) {
    auto* d = device_scratch<T>(1);
    HSPMD_CUDA_CHECK(cudaMemcpyAsync(d, &value, sizeof(T), cudaMemcpyHostToDevice, stream_), rank_);
    all_reduce(std::span<T>(d, 1), op);
    HSPMD_CUDA_CHECK(cudaMemcpy(&value, d, sizeof(T), cudaMemcpyDeviceToHost), rank_);
    return value;
  }

  /// See mpi_communicator::all_gather_v; buffers are device memory.
  template <nccl_element T>
  void all_gather_v(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                    uneven_algorithm alg = uneven_algorithm::automatic) {
    const auto offsets = check_counts(counts, in.size(), out.size(), "all_gather_v");
    alg = resolve<T>(collective::all_gather_v, alg, counts, reduce_op::sum);
    precheck<T>(collective::all_gather_v, out.size(), counts, -1, -1, alg);
    gather(in.data(), out, counts, offsets, alg);
  }
  template <nccl_element T>
  void all_gather_v(std::span<T> data, std::span<const std::size_t> counts,
                    uneven_algorithm alg = uneven_algorithm::automatic) {
    const auto offsets = offsets_of(counts, data.size(), "all_gather_v");
    alg = resolve<T>(collective::all_gather_v, alg, counts, reduce_op::sum);
    precheck<T>(collective::all_gather_v, data.size(), counts, -1, -1, alg);
    gather(static_cast<const T*>(nullptr), data, counts, offsets, alg);
  }

  /// See mpi_communicator::reduce_scatter_v; buffers are device memory.
  template <nccl_element T>
  void reduce_scatter_v(std::span<const T> in, std::span<T> out,
                        std::span<const std::size_t> counts, reduce_op op,
                        uneven_algorithm alg = uneven_algorithm::automatic) {
    const auto offsets = check_counts(counts, out.size(), in.size(), "reduce_scatter_v");
    alg = resolve<T>(collective::reduce_scatter_v, alg, counts, op);
    precheck<T>(collective::reduce_scatter_v, in.size(), counts, -1, static_cast<int>(op), alg);
    scatter(in, out, counts, offsets, op, alg);
  }

  /// In-place form (see mpi_communicator): this rank's segment stays at its place in `data`.
  template <nccl_element T>
  void reduce_scatter_v(std::span<T> data, std::span<const std::size_t> counts, reduce_op op,
                        uneven_algorithm alg = uneven_algorithm::automatic) {
    const auto offsets = offsets_of(counts, data.size(), "reduce_scatter_v");
    alg = resolve<T>(collective::reduce_scatter_v, alg, counts, op);
    precheck<T>(collective::reduce_scatter_v, data.size(), counts, -1, static_cast<int>(op), alg);
    // Reduce into a separate buffer, then copy back: NCCL's own in-place layouts differ.
    T* result = nullptr;
    HSPMD_CUDA_CHECK(
        cudaMallocAsync(&result, std::max<std::size_t>(counts[me()], 1) * sizeof(T), stream_),
        rank_);
    scatter(std::span<const T>(data), std::span<T>(result, counts[me()]), counts, offsets, op, alg);
    copy(data.data() + offsets[me()], static_cast<const T*>(result), counts[me()]);
    HSPMD_CUDA_CHECK(cudaFreeAsync(result, stream_), rank_);
    wait("reduce_scatter_v");
  }

  /// See mpi_communicator::all_to_all_v; grouped ncclSend/ncclRecv.
  template <nccl_element T>
  void all_to_all_v(std::span<const T> in, std::span<const std::size_t> send_counts,
                    std::span<T> out, std::span<const std::size_t> recv_counts) {
    const auto so = offsets_of(send_counts, in.size(), "all_to_all_v");
    const auto ro = offsets_of(recv_counts, out.size(), "all_to_all_v");
    precheck<T>(collective::all_to_all_v, 0, {}, -1, -1, uneven_algorithm::native);
    group([&] {
      for (std::size_t p = 0; p < me_count(); ++p) {
        if (send_counts[p] > 0)
          check(ncclSend(in.data() + so[p], send_counts[p], detail::nccl_datatype<T>(),
                         static_cast<int>(p), comm_, stream_),
                "ncclSend");
        if (recv_counts[p] > 0)
          check(ncclRecv(out.data() + ro[p], recv_counts[p], detail::nccl_datatype<T>(),
                         static_cast<int>(p), comm_, stream_),
                "ncclRecv");
      }
    });
    wait("all_to_all_v");
  }

  /// Point to point (blocking until the transfer is done). `tag` must be 0: NCCL matches
  /// messages by order, not by tag.
  template <nccl_element T>
  void send(std::span<const T> data, int dest, int tag) {
    require_tag_zero(tag);
    check(ncclSend(data.data(), data.size(), detail::nccl_datatype<T>(), dest, comm_, stream_),
          "ncclSend");
    wait("send");
  }
  template <nccl_element T>
  void recv(std::span<T> data, int src, int tag) {
    require_tag_zero(tag);
    check(ncclRecv(data.data(), data.size(), detail::nccl_datatype<T>(), src, comm_, stream_),
          "ncclRecv");
    wait("recv");
  }

private:
  [[nodiscard]] std::size_t me() const noexcept { return static_cast<std::size_t>(rank_); }
  [[nodiscard]] std::size_t me_count() const noexcept { return static_cast<std::size_t>(size_); }

  void require_tag_zero(int tag) const {
    if (tag != 0)
      throw comm_error(rank_, "send/recv", "tag " + std::to_string(tag) + " on NCCL",
                       "tag 0: NCCL matches point-to-point messages in order");
  }

  // NCCL call results: ncclInProgress means "wait until the communicator is ready".
  void check(ncclResult_t r, const char* call) {
    if (r == ncclInProgress) {
      wait_ready(call);
      return;
    }
    if (r != ncclSuccess) {
      healthy_ = false;
      throw comm_error(rank_, call, detail::nccl_error_text(r, comm_));
    }
  }

  template <class F>
  void group(F&& enqueue) {
    check(ncclGroupStart(), "ncclGroupStart");
    enqueue();
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  [[nodiscard]] bool timed_out(std::chrono::steady_clock::time_point start) const {
    return timeout_ > 0.0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
               timeout_;
  }

  [[noreturn]] void fail(const char* call, const std::string& why, const std::string& fix) {
    healthy_ = false;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw comm_error(rank_, call, why, fix);
  }

  // Waits until NCCL leaves ncclInProgress (non-blocking init, group end).
  void wait_ready(const char* call) {
    const auto start = std::chrono::steady_clock::now();
    ncclResult_t state = ncclInProgress;
    while (true) {
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess)
        fail(call, detail::nccl_error_text(r, comm_), {});
      if (state == ncclSuccess)
        return;
      if (state != ncclInProgress)
        fail(call, detail::nccl_error_text(state, comm_), "another rank may have failed");
      if (timed_out(start))
        fail(call, "not ready after " + std::to_string(timeout_) + " s (HSPMD_TIMEOUT)",
             "another rank may be stuck or gone");
      std::this_thread::yield();
    }
  }

  // Throws (aborting the communicator) when NCCL reports an asynchronous error.
  void poll_async_error(const char* call) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess ||
        (state != ncclSuccess && state != ncclInProgress))
      fail(call, detail::nccl_error_text(state, comm_), "another rank may have failed");
  }

  // Waits for the stream while polling NCCL's asynchronous error state.
  void wait(const char* call) {
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess)
        return;
      if (q != cudaErrorNotReady)
        detail::cuda_check(q, "cudaStreamQuery", rank_);
      poll_async_error(call);
      if (timed_out(start))
        fail(call, "did not finish within " + std::to_string(timeout_) + " s (HSPMD_TIMEOUT)",
             "another rank may be stuck, gone, or calling a different collective");
      std::this_thread::yield();
    }
  }

  [[nodiscard]] std::vector<std::size_t> offsets_of(std::span<const std::size_t> counts,
                                                    std::size_t whole, const char* call) const {
    if (counts.size() != me_count())
      throw comm_error(rank_, call,
                       std::to_string(counts.size()) + " counts for " + std::to_string(size_) +
                           " ranks",
                       "pass one count per rank");
    std::vector<std::size_t> offsets(counts.size());
    std::size_t total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = total;
      total += counts[r];
    }
    if (whole != total)
      throw comm_error(rank_, call,
                       "buffer of " + std::to_string(whole) + " elements for counts summing to " +
                           std::to_string(total),
                       "size buffers by the counts");
    return offsets;
  }

  [[nodiscard]] std::vector<std::size_t> check_counts(std::span<const std::size_t> counts,
                                                      std::size_t part, std::size_t whole,
                                                      const char* call) const {
    auto offsets = offsets_of(counts, whole, call);
    if (part != counts[me()])
      throw comm_error(rank_, call,
                       "this rank's part has " + std::to_string(part) + " elements, counts say " +
                           std::to_string(counts[me()]),
                       "the part has counts[rank] elements");
    return offsets;
  }

  template <nccl_element T>
  [[nodiscard]] uneven_algorithm resolve(collective op, uneven_algorithm alg,
                                         std::span<const std::size_t> counts, reduce_op rop) {
    const bool int_sum = op == collective::reduce_scatter_v && !std::is_floating_point_v<T>;
    if (alg == uneven_algorithm::automatic) {
      alg = model_.choose(op, counts, sizeof(T));
      if (int_sum && alg == uneven_algorithm::native) // no integer axpy in cuBLAS
        alg = model_.estimate(op, uneven_algorithm::padded, counts, sizeof(T)) <=
                      model_.estimate(op, uneven_algorithm::grouped, counts, sizeof(T))
                  ? uneven_algorithm::padded
                  : uneven_algorithm::grouped;
    }
    if (op == collective::reduce_scatter_v && alg == uneven_algorithm::native &&
        (int_sum || rop != reduce_op::sum))
      throw comm_error(rank_, "reduce_scatter_v",
                       "the native algorithm on NCCL sums received segments with cuBLAS axpy: "
                       "floating-point sums only",
                       "use padded, grouped or automatic for integer types and max/min");
    return alg;
  }

  // Debug fingerprints travel over the bootstrap MPI communicator (host memory).
  template <nccl_element T>
  void precheck(collective op, std::size_t count, std::span<const std::size_t> counts, int root,
                int reduction, uneven_algorithm alg) {
    const std::uint64_t seq = sequence_++;
    if (!debug_)
      return;
    const auto words = fingerprint_of<T>(seq, op, count, counts, root, reduction, alg).words();
    std::vector<std::uint64_t> all(words.size() * me_count());
    mpi_->all_gather_v(std::span<const std::uint64_t>(words), std::span<std::uint64_t>(all),
                       std::vector<std::size_t>(me_count(), words.size()),
                       uneven_algorithm::native);
    check_fingerprints(unpack_fingerprints(all), rank_);
  }

  template <class T>
  [[nodiscard]] T* device_scratch(std::size_t elements) {
    const std::size_t bytes = elements * sizeof(T);
    if (bytes > scratch_bytes_) {
      HSPMD_CUDA_CHECK(cudaStreamSynchronize(stream_), rank_);
      if (scratch_ != nullptr)
        HSPMD_CUDA_CHECK(cudaFree(scratch_), rank_);
      scratch_ = nullptr;
      HSPMD_CUDA_CHECK(cudaMalloc(&scratch_, bytes), rank_);
      scratch_bytes_ = bytes;
    }
    return static_cast<T*>(scratch_);
  }

  template <class T>
  void copy(T* to, const T* from, std::size_t n) {
    if (n > 0 && to != from)
      HSPMD_CUDA_CHECK(cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_),
                       rank_);
  }

  // The primitives of the padded and grouped algorithms (comm/uneven_algorithms.hpp) on NCCL:
  // device memory, calls enqueued on the communicator's stream.
  template <nccl_element T>
  struct uneven_primitives {
    nccl_communicator& c;
    ncclDataType_t type = detail::nccl_datatype<T>();
    T* sink = nullptr; // non-roots' receive buffer of a reduce (NCCL ignores it)

    T* scratch(std::size_t n) { return c.device_scratch<T>(n); }
    void copy(T* to, const T* from, std::size_t n) { c.copy(to, from, n); }
    void zero(T* at, std::size_t n) {
      if (n > 0)
        HSPMD_CUDA_CHECK(cudaMemsetAsync(at, 0, n * sizeof(T), c.stream_), c.rank_);
    }
    void all_gather_blocks(const T* mine, T* all, std::size_t m) {
      c.check(ncclAllGather(mine, all, m, type, c.comm_, c.stream_), "ncclAllGather");
    }
    void reduce_scatter_blocks(const T* all, T* mine, std::size_t m, reduce_op op) {
      c.check(ncclReduceScatter(all, mine, m, type, detail::nccl_op(op), c.comm_, c.stream_),
              "ncclReduceScatter");
    }
    template <class F>
    void group(F&& f) {
      sink = c.device_scratch<T>(1); // (before the group: no allocation inside it)
      c.group(f);
    }
    void broadcast(T* data, std::size_t n, std::size_t root) {
      c.check(ncclBroadcast(data, data, n, type, static_cast<int>(root), c.comm_, c.stream_),
              "ncclBroadcast");
    }
    void reduce(const T* in, T* out, std::size_t n, reduce_op op, std::size_t root) {
      c.check(ncclReduce(in, out != nullptr ? out : sink, n, type, detail::nccl_op(op),
                         static_cast<int>(root), c.comm_, c.stream_),
              "ncclReduce");
    }
  };

  template <nccl_element T>
  void gather(const T* in, std::span<T> out, std::span<const std::size_t> counts,
              const std::vector<std::size_t>& offsets, uneven_algorithm alg) {
    const ncclDataType_t type = detail::nccl_datatype<T>();
    const std::size_t mine = counts[me()];
    const T* own = in != nullptr ? in : out.data() + offsets[me()];
    uneven_primitives<T> prims{*this};
    switch (alg) {
    case uneven_algorithm::padded:
      detail::padded_all_gather(prims, own, out, counts, std::span<const std::size_t>(offsets),
                                me());
      break;
    case uneven_algorithm::grouped:
      detail::grouped_all_gather(prims, own, out, counts, std::span<const std::size_t>(offsets),
                                 me());
      break;
    case uneven_algorithm::native:
    case uneven_algorithm::automatic:
      copy(out.data() + offsets[me()], own, mine);
      group([&] {
        for (std::size_t p = 0; p < me_count(); ++p) {
          if (p == me())
            continue;
          if (mine > 0)
            check(ncclSend(own, mine, type, static_cast<int>(p), comm_, stream_), "ncclSend");
          if (counts[p] > 0)
            check(ncclRecv(out.data() + offsets[p], counts[p], type, static_cast<int>(p), comm_,
                           stream_),
                  "ncclRecv");
        }
      });
      break;
    }
    wait("all_gather_v");
  }

  template <nccl_element T>
  void scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
               const std::vector<std::size_t>& offsets, reduce_op op, uneven_algorithm alg) {
    const ncclDataType_t type = detail::nccl_datatype<T>();
    const std::size_t mine = counts[me()];
    uneven_primitives<T> prims{*this};
    switch (alg) {
    case uneven_algorithm::padded:
      detail::padded_reduce_scatter(prims, in.data(), out.data(), counts,
                                    std::span<const std::size_t>(offsets), me(), op);
      break;
    case uneven_algorithm::grouped:
      detail::grouped_reduce_scatter(prims, in.data(), out.data(), counts,
                                     std::span<const std::size_t>(offsets), me(), op);
      break;
    case uneven_algorithm::native:
    case uneven_algorithm::automatic: {
      if constexpr (std::is_floating_point_v<T>) {
        // Receive every other rank's copy of my segment, then sum them into `out` on the device.
        T* staging = device_scratch<T>(mine * me_count());
        copy(out.data(), in.data() + offsets[me()], mine);
        group([&] {
          for (std::size_t p = 0; p < me_count(); ++p) {
            if (p == me())
              continue;
            if (counts[p] > 0)
              check(ncclSend(in.data() + offsets[p], counts[p], type, static_cast<int>(p), comm_,
                             stream_),
                    "ncclSend");
            if (mine > 0)
              check(ncclRecv(staging + p * mine, mine, type, static_cast<int>(p), comm_, stream_),
                    "ncclRecv");
          }
        });
        if (mine > static_cast<std::size_t>(INT_MAX))
          throw comm_error(rank_, "reduce_scatter_v", "segment too large for cuBLAS",
                           "use the padded or grouped algorithm");
        const T one = 1;
        for (std::size_t p = 0; p < me_count() && mine > 0; ++p) {
          if (p == me())
            continue;
          cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
          if constexpr (std::is_same_v<T, float>)
            s = cublasSaxpy(blas(), static_cast<int>(mine), &one, staging + p * mine, 1, out.data(),
                            1);
          else
            s = cublasDaxpy(blas(), static_cast<int>(mine), &one, staging + p * mine, 1, out.data(),
                            1);
          if (s != CUBLAS_STATUS_SUCCESS)
            throw comm_error(rank_, "cublasAxpy", "cuBLAS status " + std::to_string(s));
        }
      }
      break;
    }
    }
    wait("reduce_scatter_v");
  }

  [[nodiscard]] cublasHandle_t blas() {
    if (blas_ == nullptr) {
      if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS)
        throw comm_error(rank_, "cublasCreate", "cannot create a cuBLAS handle");
      cublasSetStream(blas_, stream_);
      cublasSetPointerMode(blas_, CUBLAS_POINTER_MODE_HOST);
    }
    return blas_;
  }

  mpi_communicator* mpi_;
  int rank_;
  int size_;
  bool debug_;
  double timeout_;
  collective_cost_model model_;
  std::uint64_t sequence_ = 0;
  bool healthy_ = true;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

static_assert(communicator<nccl_communicator, float> &&
              communicator<nccl_communicator, std::int32_t>);

} // namespace hspmd
