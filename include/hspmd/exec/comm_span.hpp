#pragma once
// Collectives on a backend's buffers: direct where the communicator reads that memory (host
// buffers with MPI, device buffers with NCCL), staged through host copies where it does not
// (device buffers over MPI: the copies go through the backend, one each way). A device
// communicator (NCCL) gets the buffer after the backend's stream has finished its queued work
// (these blocking collectives are waited for anyway; the gradient buckets, which overlap the
// backward pass, are ordered by events instead: exec/distributed.hpp).
//
//     comm_span<const T, Comm, B> in(be, piece, true);    // read by the collective
//     comm_span<T, Comm, B> out(be, whole, false);        // written by it
//     comm.all_gather_v(in.get(), out.get(), counts, alg);
//     out.written();                                      // staged: copied back to the device

#include <hspmd/comm/communicator.hpp>
#include <hspmd/kernels/backend.hpp>

#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// True when communicator `Comm` moves `B`'s buffers as they are.
template <class Comm, class B>
inline constexpr bool comm_reads_backend_v =
    host_memory_v<B> ? !device_buffers_v<Comm> : device_buffers_v<Comm>;

/// A backend buffer as communicator `Comm` sees it (see the file comment).
template <class E, class Comm, class B>
class comm_span {
  static_assert(!(host_memory_v<B> && device_buffers_v<Comm>),
                "a communicator of device buffers cannot move a host backend's buffers");
  static constexpr bool direct = comm_reads_backend_v<Comm, B>;

public:
  /// `read`: the collective reads the data (a staged buffer is copied to the host first).
  comm_span(B& be, std::span<E> data, bool read) : be_(&be), data_(data) {
    // A device communicator runs on a stream of its own: the backend's queued work on the
    // buffer finishes first (the communicator's calls return when its stream has finished).
    if constexpr (direct && !host_memory_v<B>)
      be.synchronize();
    if constexpr (!direct) {
      host_.resize(data.size());
      if (read && !data.empty())
        be.copy_to_host(host_.data(), data.data(), data.size());
    }
  }
  [[nodiscard]] std::span<E> get() {
    if constexpr (direct)
      return data_;
    else
      return std::span<E>(host_);
  }
  /// After the collective wrote it: a staged buffer goes back to the backend.
  void written() {
    if constexpr (!direct && !std::is_const_v<E>)
      if (!data_.empty())
        be_->copy_from_host(data_.data(), host_.data(), host_.size());
  }

private:
  B* be_;
  std::span<E> data_;
  std::vector<std::remove_const_t<E>> host_;
};

namespace detail {
// The communicator of host-memory control traffic (plan agreement, input checks, traces): a
// device communicator's bootstrap (NCCL's MPI communicator), else the communicator itself.
template <class C>
auto& control_of(C& c) {
  if constexpr (requires { c.bootstrap(); })
    return c.bootstrap();
  else
    return c;
}
template <class C>
using control_t = std::remove_reference_t<decltype(control_of(std::declval<C&>()))>;
} // namespace detail

} // namespace hspmd::exec
