// Builds every code path of the NCCL backend (all operations, algorithms and element types)
// and, when run, reports the NCCL and CUDA runtime versions it linked against. It needs no GPU:
// the collectives are instantiated, not called.
#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/nccl/communicator.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>

namespace nccl_link {
template <class T>
void instantiate(hspmd::nccl_communicator& c, std::span<T> a, std::span<T> b,
                 std::span<const std::size_t> counts) {
  c.barrier();
  c.broadcast(a, 0);
  c.all_reduce(std::span<const T>(a), b, hspmd::reduce_op::sum);
  c.all_reduce(a, hspmd::reduce_op::max);
  c.all_gather_v(std::span<const T>(a), b, counts, hspmd::uneven_algorithm::padded);
  c.all_gather_v(b, counts, hspmd::uneven_algorithm::grouped);
  c.reduce_scatter_v(std::span<const T>(a), b, counts, hspmd::reduce_op::sum,
                     hspmd::uneven_algorithm::native);
  c.reduce_scatter_v(a, counts, hspmd::reduce_op::max, hspmd::uneven_algorithm::padded);
  c.all_to_all_v(std::span<const T>(a), counts, b, counts);
  c.send(std::span<const T>(a), 0, 0);
  c.recv(b, 0, 0);
  (void)c.all_reduce(T{}, hspmd::reduce_op::sum);
}

// The concept states what the library calls; NCCL moves device buffers of numeric types, so
// the distributed executor (which also exchanges host text: traces) refuses it at its
// constraint instead of failing inside.
static_assert(hspmd::communicator<hspmd::nccl_communicator, float>);
static_assert(hspmd::communicator<hspmd::nccl_communicator, double>);
static_assert(!hspmd::communicator<hspmd::nccl_communicator, char>);
} // namespace nccl_link

template void nccl_link::instantiate<float>(hspmd::nccl_communicator&, std::span<float>,
                                            std::span<float>, std::span<const std::size_t>);
template void nccl_link::instantiate<double>(hspmd::nccl_communicator&, std::span<double>,
                                             std::span<double>, std::span<const std::size_t>);
template void nccl_link::instantiate<std::int32_t>(hspmd::nccl_communicator&,
                                                   std::span<std::int32_t>, std::span<std::int32_t>,
                                                   std::span<const std::size_t>);

int main() {
  int nccl = 0;
  if (ncclGetVersion(&nccl) != ncclSuccess) {
    std::printf("ncclGetVersion failed\n");
    return 1;
  }
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::printf("hspmd NCCL backend linked: NCCL %d.%d.%d, CUDA runtime %d.%d\n", nccl / 10000,
              nccl / 100 % 100, nccl % 100, runtime / 1000, runtime % 1000 / 10);
  return nccl >= 22800 ? 0 : 1;
}
