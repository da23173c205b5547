#pragma once
// The device communicator of the deferred backend (deferred_backend.hpp) over MPI: it reads the
// backend's buffers directly and starts a non-blocking all-reduce after the queued work of the
// stream it is given (exec/distributed.hpp's stream-ordered gradient buckets), like NCCL's
// `start_all_reduce(data, op, stream)` after the CUDA backend's stream.
#include "deferred_backend.hpp"

#include <hspmd/comm/mpi/communicator.hpp>

#include <span>

namespace hspmd::test {

/// MPI as a device communicator of the deferred backend's buffers (see the file comment): its
/// blocking collectives read the buffers as they are (the executor waits for the queue first),
/// and gradient buckets start after the queue by `start_all_reduce(data, op, stream)`. Control
/// traffic goes over the same MPI communicator (`bootstrap()`).
class stream_communicator : public mpi_communicator {
public:
  static constexpr bool device_buffers = true;
  using mpi_communicator::mpi_communicator;

  [[nodiscard]] mpi_communicator& bootstrap() noexcept { return *this; }

  /// Runs the stream's queued work (the device would wait for it on the communication stream),
  /// then starts the all-reduce. It hides the base's two-argument form: buckets can only start
  /// ordered after the stream.
  template <class T>
  [[nodiscard]] request start_all_reduce(std::span<T> data, reduce_op op,
                                         deferred_backend::stream_handle after) {
    ++after.q->stream_waits;
    after.q->run();
    return mpi_communicator::start_all_reduce(data, op);
  }
};

} // namespace hspmd::test
