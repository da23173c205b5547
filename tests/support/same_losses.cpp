// Compares the per-step losses of two metrics files written by the library trainer
// (train_options::metrics, one JSON line per step or evaluation):
//   same_losses A.jsonl B.jsonl RELATIVE_TOLERANCE
// Exits 0 when both have the same steps and every loss agrees within the tolerance, and, where a
// file records a device allocator's reserved bytes per step, they stay flat after step 2. A file
// that a resumed run appended to may hold a step twice: its later line counts.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {
// 0 when the reserved bytes (if recorded) are the same at every step from the second on.
int flat_memory(const char* path) {
  std::ifstream in(path);
  std::vector<double> reserved;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("step") && j.contains("reserved_bytes"))
      reserved.push_back(j.at("reserved_bytes").get<double>());
  }
  for (std::size_t s = 2; s < reserved.size(); ++s)
    if (reserved[s] != reserved[1]) {
      std::printf("same_losses: %s: reserved device memory %.0f B at step %zu, %.0f B at step 2\n",
                  path, reserved[s], s + 1, reserved[1]);
      return 1;
    }
  return 0;
}

std::vector<double> losses(const char* path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "same_losses: cannot read %s\n", path);
    std::exit(2);
  }
  std::map<std::size_t, double> by_step; // the later line of a step written twice
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("step"))
      by_step[j.at("step").get<std::size_t>()] = j.at("loss").get<double>();
  }
  std::vector<double> v;
  std::size_t expected = 1;
  for (const auto& [step, loss] : by_step) {
    if (step != expected) {
      std::printf("same_losses: %s: step %zu missing\n", path, expected);
      std::exit(1);
    }
    v.push_back(loss);
    ++expected;
  }
  return v;
}
} // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: same_losses A.jsonl B.jsonl RELATIVE_TOLERANCE\n");
    return 2;
  }
  const auto a = losses(argv[1]);
  const auto b = losses(argv[2]);
  const double tol = std::strtod(argv[3], nullptr);
  if (a.size() != b.size() || a.empty()) {
    std::printf("same_losses: %zu steps vs %zu steps\n", a.size(), b.size());
    return 1;
  }
  double worst = 0.0;
  for (std::size_t s = 0; s < a.size(); ++s)
    worst = std::max(worst, std::abs(a[s] - b[s]) / std::max(std::abs(b[s]), 1e-30));
  std::printf("same_losses: %zu steps, largest relative difference %.3g (tolerance %.3g)\n",
              a.size(), worst, tol);
  if (flat_memory(argv[1]) != 0 || flat_memory(argv[2]) != 0)
    return 1;
  return worst <= tol ? 0 : 1;
}
