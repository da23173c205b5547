#pragma once
// The MPI backend's communicator: host buffers, a private duplicate of the user's MPI
// communicator (so hspmd's messages never match the user's), MPI_ERRORS_RETURN on it, and every
// call checked (failures throw `comm_error` with the rank and MPI's error text).
//
// All collectives are collective: every rank of the communicator must call them in the same
// order with matching arguments.

#include <hspmd/comm/mpi/check.hpp>
#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/core/error.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd {

namespace detail {
template <class T>
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
  else if constexpr (std::is_same_v<T, std::byte> || std::is_same_v<T, char>)
    return MPI_BYTE;
  else
    static_assert(sizeof(T) == 0, "hspmd: no MPI datatype for this element type");
}

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

/// Element types the MPI backend moves.
template <class T>
concept mpi_element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, std::uint64_t> || std::is_same_v<T, std::byte> || std::is_same_v<T, char>;

/// A communicator over MPI with host buffers.
class mpi_communicator {
public:
  /// Duplicates `comm` (collective over `comm`) and sets MPI_ERRORS_RETURN on the duplicate.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD) {
    HSPMD_MPI_CHECK(MPI_Comm_dup(comm, &comm_), detail::world_rank());
    HSPMD_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), detail::world_rank());
    HSPMD_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), detail::world_rank());
    HSPMD_MPI_CHECK(MPI_Comm_size(comm_, &size_), rank_);
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  mpi_communicator(mpi_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_) {}
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
    }
    return *this;
  }
  ~mpi_communicator() { release(); }

  /// This process's rank, 0 .. size() - 1.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The underlying (duplicated) MPI communicator.
  [[nodiscard]] MPI_Comm native_handle() const noexcept { return comm_; }

  /// Collective: returns when every rank has called it.
  void barrier() const { HSPMD_MPI_CHECK(MPI_Barrier(comm_), rank_); }

  /// Collective: copies `data` of rank `root` into `data` on every rank (same size everywhere).
  template <mpi_element T>
  void broadcast(std::span<T> data, int root) const {
    HSPMD_MPI_CHECK(MPI_Bcast(data.data(), count_of(data.size(), "MPI_Bcast"),
                              detail::mpi_datatype<T>(), root, comm_),
                    rank_);
  }

  /// Collective: `out[i] = op over ranks of in[i]`; `in` and `out` have the same size on every
  /// rank. `in` and `out` may be the same span (in place).
  template <mpi_element T>
  void all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) const {
    if (in.size() != out.size())
      throw comm_error(rank_, "all_reduce",
                       "in has " + std::to_string(in.size()) + " elements, out " +
                           std::to_string(out.size()),
                       "pass buffers of equal size");
    const void* send = in.data() == out.data() ? MPI_IN_PLACE : static_cast<const void*>(in.data());
    HSPMD_MPI_CHECK(MPI_Allreduce(send, out.data(), count_of(out.size(), "MPI_Allreduce"),
                                  detail::mpi_datatype<T>(), detail::mpi_op(op), comm_),
                    rank_);
  }
  /// In-place `all_reduce`.
  template <mpi_element T>
  void all_reduce(std::span<T> data, reduce_op op) const {
    all_reduce(std::span<const T>(data), data, op);
  }
  /// `all_reduce` of one value.
  template <mpi_element T>
  [[nodiscard]] T all_reduce(T value, reduce_op op) const {
    T out{};
    all_reduce(std::span<const T>(&value, 1), std::span<T>(&out, 1), op);
    return out;
  }

  /// Collective: concatenates every rank's `in` in rank order into `out` on every rank.
  /// `counts[r]` is rank r's number of elements (the same vector on every rank; zeros are
  /// legal); `in.size()` must be counts[rank()] and `out.size()` their sum.
  template <mpi_element T>
  void all_gather_v(std::span<const T> in, std::span<T> out,
                    std::span<const std::size_t> counts) const {
    const auto [cnt, displs, total] = counts_and_displacements(counts, "all_gather_v");
    if (in.size() != counts[static_cast<std::size_t>(rank_)] || out.size() != total)
      throw comm_error(rank_, "all_gather_v",
                       "buffer sizes (in " + std::to_string(in.size()) + ", out " +
                           std::to_string(out.size()) + ") do not match counts (this rank " +
                           std::to_string(counts[static_cast<std::size_t>(rank_)]) + ", total " +
                           std::to_string(total) + ")",
                       "in.size() == counts[rank] and out.size() == sum of counts");
    HSPMD_MPI_CHECK(MPI_Allgatherv(in.data(), cnt[static_cast<std::size_t>(rank_)],
                                   detail::mpi_datatype<T>(), out.data(), cnt.data(), displs.data(),
                                   detail::mpi_datatype<T>(), comm_),
                    rank_);
  }

private:
  struct layout {
    std::vector<int> counts;
    std::vector<int> displs;
    std::size_t total = 0;
  };

  // MPI 3 counts are ints: refuse what does not fit rather than wrap around.
  [[nodiscard]] int count_of(std::size_t n, const char* call) const {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw comm_error(rank_, call, std::to_string(n) + " elements exceed MPI's int count limit",
                       "split the buffer into chunks of at most 2^31 - 1 elements");
    return static_cast<int>(n);
  }

  [[nodiscard]] layout counts_and_displacements(std::span<const std::size_t> counts,
                                                const char* call) const {
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
    }
    (void)count_of(l.total, call);
    return l;
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
};

} // namespace hspmd
