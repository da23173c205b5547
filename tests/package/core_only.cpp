// Uses the installed hspmd::core: typed tensors and a cluster file, no MPI.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/tensor_ops.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: core_only CLUSTER.json\n");
    return 2;
  }
  const hspmd::cluster c = hspmd::load_cluster(argv[1]);
  hspmd::tensor<float, hspmd::extents<hspmd::batch, 3>> x(2);
  hspmd::tensor<float, hspmd::extents<3, 4>> w;
  hspmd::fill_normal(x, {1, 0}, 1.0);
  hspmd::fill_normal(w, {1, 1}, 1.0);
  const auto y = hspmd::matmul(x, w);
  std::printf("core_only: cluster %s with %zu devices; y is %s\n", c.name.c_str(), c.size(),
              y.shape().to_string().c_str());
  return y.size() == 8 && c.size() == 2 ? 0 : 1;
}
