// The NCCL backend on a real GPU: one rank (a single GPU hosts a one-rank communicator), every
// operation and algorithm on device buffers against a host reference. Exits with 77 (CTest:
// skipped) and says why when no CUDA device is present.
#define CATCH_CONFIG_RUNNER
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/nccl/communicator.hpp>
#include <hspmd/core/partition.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

using namespace hspmd;

namespace {
template <class T>
struct device_buffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit device_buffer(const std::vector<T>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(&ptr, (n == 0 ? 1 : n) * sizeof(T)) == cudaSuccess);
    if (n > 0)
      REQUIRE(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(ptr); }
  std::span<T> span() { return {ptr, n}; }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n > 0)
      REQUIRE(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

// Elements that differ (a count, so that a failure does not print a million elements).
template <class T>
std::size_t mismatches(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return std::max(got.size(), want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]))
      ++bad;
  return bad;
}

template <class T>
std::vector<T> iota(std::size_t n, int start) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(start + static_cast<int>(i % 1000));
  return v;
}
} // namespace

TEMPLATE_TEST_CASE("NCCL collectives on one GPU match the host reference", "", float, double,
                   std::int32_t) {
  mpi_communicator mpi;
  nccl_communicator comm(mpi);
  REQUIRE(comm.size() == 1);
  for (std::size_t n : {0UL, 1UL, 1000UL, 1UL << 20U}) {
    const auto host = iota<TestType>(n, 3);
    const std::vector<std::size_t> counts{n};
    { // all_reduce on one rank is a copy
      device_buffer<TestType> in{host};
      device_buffer<TestType> out{std::vector<TestType>(n)};
      comm.all_reduce(std::span<const TestType>(in.span()), out.span(), reduce_op::sum);
      CHECK(mismatches(out.host(), host) == 0);
    }
    for (uneven_algorithm alg : {uneven_algorithm::automatic, uneven_algorithm::padded,
                                 uneven_algorithm::grouped, uneven_algorithm::native}) {
      device_buffer<TestType> in{host};
      device_buffer<TestType> out{std::vector<TestType>(n)};
      comm.all_gather_v(std::span<const TestType>(in.span()), out.span(), counts, alg);
      CAPTURE(n, name(alg));
      CHECK(mismatches(out.host(), host) == 0);
      const bool refused = alg == uneven_algorithm::native && !std::is_floating_point_v<TestType>;
      device_buffer<TestType> red{std::vector<TestType>(n)};
      if (refused) {
        CHECK_THROWS_AS(comm.reduce_scatter_v(std::span<const TestType>(in.span()), red.span(),
                                              counts, reduce_op::sum, alg),
                        comm_error);
      } else {
        comm.reduce_scatter_v(std::span<const TestType>(in.span()), red.span(), counts,
                              reduce_op::sum, alg);
        CHECK(mismatches(red.host(), host) == 0);
      }
    }
    device_buffer<TestType> b{host};
    comm.broadcast(b.span(), 0);
    CHECK(mismatches(b.host(), host) == 0);
  }
  comm.barrier();
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (%s); the NCCL runtime tests need a GPU\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    MPI_Finalize();
    return 77;
  }
  const int rc = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return rc;
}
