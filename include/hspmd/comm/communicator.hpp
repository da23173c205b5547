#pragma once
// The communicator concept: what every backend (MPI on host memory, NCCL on device memory)
// provides. Buffers are contiguous spans; uneven collectives take one element count per rank
// (the same vector on every rank; zeros are legal everywhere) and an algorithm tag.
//
// Every operation except rank()/size()/send()/recv() is collective: all ranks of the
// communicator call it in the same order with matching arguments. With HSPMD_DEBUG=detail the
// backends check that before each call (see comm/debug.hpp).

#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>

#include <concepts>
#include <cstddef>
#include <span>

namespace hspmd {

/// A communicator over which element type `T` can be moved: every operation the library calls
/// (the distributed executor requires it for each element type it moves).
template <class C, class T = float>
concept communicator = requires(C& c, T value, std::span<T> buf, std::span<const T> cbuf,
                                std::span<const std::size_t> counts, reduce_op op,
                                uneven_algorithm alg, int peer) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  c.barrier();
  c.broadcast(buf, peer);
  c.all_reduce(cbuf, buf, op);
  c.all_reduce(buf, op);
  { c.all_reduce(value, op) } -> std::same_as<T>; // one value, returned on every rank
  c.all_gather_v(cbuf, buf, counts, alg);
  c.all_gather_v(buf, counts, alg);
  c.reduce_scatter_v(cbuf, buf, counts, op, alg);
  c.reduce_scatter_v(buf, counts, op, alg);
  c.all_to_all_v(cbuf, counts, buf, counts);
  c.send(cbuf, peer, peer);
  c.recv(buf, peer, peer);
  { c.choose(collective::all_gather_v, counts, sizeof(T)) } -> std::same_as<uneven_algorithm>;
};

/// True for a communicator whose buffers live in device memory (it declares
/// `static constexpr bool device_buffers = true`, as the NCCL one does); MPI moves host memory.
template <class C>
inline constexpr bool device_buffers_v = requires {
  requires C::device_buffers;
};

} // namespace hspmd
