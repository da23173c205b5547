#pragma once
// The padded and grouped algorithms of the uneven collectives (all_gather_v, reduce_scatter_v;
// core/collectives.hpp `uneven_algorithm`), written once over the few primitives every
// communicator offers. A communicator implements the primitives on its own memory and calls
// (comm/mpi: host memory, MPI; comm/nccl: device memory, NCCL on its stream) and runs its native
// form itself:
//
//   padded  every shard padded to the largest in a scratch buffer, one even collective
//           (all-gather / reduce-scatter of blocks), the padding dropped;
//   grouped one broadcast (reduce) per non-empty shard from (to) its owner, issued together.
//
// The primitives `P` offers for element type T (every call collective where it says so):
//   T* scratch(std::size_t n)                    a reusable buffer of n elements
//   void copy(T* to, const T* from, std::size_t n)
//   void zero(T* at, std::size_t n)
//   void all_gather_blocks(const T* mine, T* all, std::size_t m)         collective: every rank's
//                                                m elements, in rank order
//   void reduce_scatter_blocks(const T* all, T* mine, std::size_t m, reduce_op)   collective
//   void group(F&& f)                            the broadcasts and reduces `f` issues run
//                                                together and are complete when it returns
//   void broadcast(T* data, std::size_t n, std::size_t root)             inside `group`
//   void reduce(const T* in, T* out, std::size_t n, reduce_op, std::size_t root)  inside
//                                                `group`; `out` is the root's (others' is
//                                                ignored); `in == out` on the root: in place

#include <hspmd/comm/reduce_op.hpp>

#include <algorithm>
#include <cstddef>
#include <span>

namespace hspmd::detail {

/// The largest of `counts` (0 for none).
[[nodiscard]] inline std::size_t largest_count(std::span<const std::size_t> counts) {
  std::size_t m = 0;
  for (std::size_t c : counts)
    m = std::max(m, c);
  return m;
}

/// all_gather_v, padded: `own` is this rank's (rank `me`'s) shard; `out` the whole, shard r at
/// `offsets[r]`.
template <class T, class P>
void padded_all_gather(P& p, const T* own, std::span<T> out, std::span<const std::size_t> counts,
                       std::span<const std::size_t> offsets, std::size_t me) {
  const std::size_t m = largest_count(counts);
  if (m == 0)
    return;
  const std::size_t n = counts.size();
  T* buf = p.scratch(m * (n + 1)); // [n blocks of m | my block of m]
  T* send = buf + m * n;
  p.copy(send, own, counts[me]);
  p.zero(send + counts[me], m - counts[me]);
  p.all_gather_blocks(send, buf, m);
  for (std::size_t r = 0; r < n; ++r)
    p.copy(out.data() + offsets[r], buf + r * m, counts[r]);
}

/// all_gather_v, grouped: one broadcast per non-empty shard from its owner (every rank knows the
/// counts, so an empty shard needs no message).
template <class T, class P>
void grouped_all_gather(P& p, const T* own, std::span<T> out, std::span<const std::size_t> counts,
                        std::span<const std::size_t> offsets, std::size_t me) {
  p.copy(out.data() + offsets[me], own, counts[me]);
  p.group([&] {
    for (std::size_t r = 0; r < counts.size(); ++r)
      if (counts[r] > 0)
        p.broadcast(out.data() + offsets[r], counts[r], r);
  });
}

/// reduce_scatter_v, padded: `in` is this rank's whole (segment r at `offsets[r]`); `out` gets
/// the reduction of segment `me` (the padding is reduced, then dropped).
template <class T, class P>
void padded_reduce_scatter(P& p, const T* in, T* out, std::span<const std::size_t> counts,
                           std::span<const std::size_t> offsets, std::size_t me, reduce_op op) {
  const std::size_t m = largest_count(counts);
  if (m == 0)
    return;
  const std::size_t n = counts.size();
  T* buf = p.scratch(m * (n + 1)); // [n padded segments | my result]
  for (std::size_t r = 0; r < n; ++r) {
    p.copy(buf + r * m, in + offsets[r], counts[r]);
    p.zero(buf + r * m + counts[r], m - counts[r]);
  }
  T* result = buf + m * n;
  p.reduce_scatter_blocks(buf, result, m, op);
  p.copy(out, result, counts[me]);
}

/// reduce_scatter_v, grouped: one reduce per non-empty segment to its owner. `out` may be this
/// rank's segment inside `in` (in place).
template <class T, class P>
void grouped_reduce_scatter(P& p, const T* in, T* out, std::span<const std::size_t> counts,
                            std::span<const std::size_t> offsets, std::size_t me, reduce_op op) {
  p.group([&] {
    for (std::size_t r = 0; r < counts.size(); ++r)
      if (counts[r] > 0)
        p.reduce(in + offsets[r], r == me ? out : nullptr, counts[r], op, r);
  });
}

} // namespace hspmd::detail
