#pragma once
// A cluster of one node for tests, built through the real parser: devices d0, d1, ... with the
// given speeds (flop/s) and memory (bytes), one intra-node link.
#include <hspmd/cluster/cluster_file.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace hspmd::test {

inline cluster make_cluster(const std::vector<double>& speeds, double bandwidth = 1e8,
                            double memory = 1e12, double latency = 1e-6) {
  std::string devices;
  for (std::size_t d = 0; d < speeds.size(); ++d)
    devices += std::string(d == 0 ? "" : ",") + R"({"name": "d)" + std::to_string(d) +
               R"(", "kind": "test", "speed": )" + std::to_string(speeds[d]) + R"(, "memory": )" +
               std::to_string(memory) + "}";
  return parse_cluster(R"({"version": 1, "name": "test", "links": {"intra_node": {"bandwidth": )" +
                           std::to_string(bandwidth) + R"(, "latency": )" +
                           std::to_string(latency) + R"(}}, "devices": [)" + devices + "]}",
                       "test-cluster");
}

} // namespace hspmd::test
