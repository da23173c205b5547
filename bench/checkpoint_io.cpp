// Checkpoint save and load of one process next to plain write and read calls on the same bytes:
//
//   build/release/bench/bench.checkpoint_io [MiB per round, default 1024] [rounds, default 5] [dir]
//
// Each round, alternating: hspmd save_checkpoint of MiB of floats in 64 tensors (write, fsync,
// CRC-32 blocks, manifest, commit by rename), then plain pwrite calls of 8 MiB of the same buffer
// into a new file and one fsync; hspmd load_checkpoint of every tensor into its place (CRC
// verified), then plain pread calls of 8 MiB into a buffer of the same size. Prints each round
// and the medians with the ratios. The directory (default: the system's temporary one) decides
// the file system measured.
#include <hspmd/train/checkpoint.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;
namespace fs = std::filesystem;

double since(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr std::size_t chunk = std::size_t{8} << 20U;

double plain_write(const fs::path& file, const std::vector<float>& v) {
  const auto t = clk::now();
  const int f = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const auto* p = reinterpret_cast<const char*>(v.data());
  const std::size_t n = v.size() * sizeof(float);
  for (std::size_t at = 0; at < n;) {
    const ssize_t w = ::pwrite(f, p + at, std::min(chunk, n - at), static_cast<off_t>(at));
    if (w <= 0) {
      std::perror("pwrite");
      std::exit(1);
    }
    at += static_cast<std::size_t>(w);
  }
  ::fsync(f);
  ::close(f);
  return since(t);
}

double plain_read(const fs::path& file, std::vector<float>& v) {
  const auto t = clk::now();
  const int f = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  auto* p = reinterpret_cast<char*>(v.data());
  const std::size_t n = v.size() * sizeof(float);
  for (std::size_t at = 0; at < n;) {
    const ssize_t r = ::pread(f, p + at, std::min(chunk, n - at), static_cast<off_t>(at));
    if (r <= 0) {
      std::perror("pread");
      std::exit(1);
    }
    at += static_cast<std::size_t>(r);
  }
  ::close(f);
  return since(t);
}

} // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const std::size_t rounds = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 5;
  const fs::path dir = fs::path(argc > 3 ? argv[3] : fs::temp_directory_path().string()) /
                       ("hspmd-checkpoint-bench-" + std::to_string(::getpid()));
  constexpr std::size_t tensors = 64;
  const std::size_t each = (mib << 20U) / sizeof(float) / tensors;
  std::vector<float> v(each * tensors);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i % 1000) * 1e-3F;
  std::vector<float> back(v.size());
  std::vector<hspmd::train::checkpoint_piece<float>> pieces;
  std::vector<hspmd::train::checkpoint_target<float>> targets;
  for (std::size_t k = 0; k < tensors; ++k) {
    const std::vector<std::size_t> shape{each};
    const auto whole = hspmd::exec::box::whole(shape);
    pieces.push_back({"t" + std::to_string(k),
                      shape,
                      {whole},
                      std::span<const float>(v).subspan(k * each, each)});
    targets.push_back(
        {"t" + std::to_string(k), shape, whole, std::span<float>(back).subspan(k * each, each)});
  }
  const double mb = static_cast<double>(v.size() * sizeof(float)) / 1e6;
  std::vector<double> save;
  std::vector<double> write;
  std::vector<double> load;
  std::vector<double> read;
  hspmd::train::solo_communicator solo;
  hspmd::train::checkpoint_options co;
  co.keep = 1;
  fs::create_directories(dir);
  for (std::size_t r = 0; r < rounds; ++r) {
    auto t = clk::now();
    (void)hspmd::train::save_checkpoint<float>(
        solo, dir / "ckpt", r, std::span<const hspmd::train::checkpoint_piece<float>>(pieces), {},
        co);
    save.push_back(since(t));
    write.push_back(plain_write(dir / ("plain-" + std::to_string(r)), v));
    std::fill(back.begin(), back.end(), 0.0F);
    t = clk::now();
    (void)hspmd::train::load_checkpoint<float>(
        solo, dir / "ckpt", std::span<const hspmd::train::checkpoint_target<float>>(targets));
    load.push_back(since(t));
    if (back != v) {
      std::fprintf(stderr, "bench.checkpoint_io: the load differs from what was saved\n");
      return 1;
    }
    read.push_back(plain_read(dir / ("plain-" + std::to_string(r)), back));
    fs::remove(dir / ("plain-" + std::to_string(r)));
    std::printf("round %zu: %.0f MB: save %.0f ms, plain write+fsync %.0f ms; load %.0f ms, plain "
                "read %.0f ms\n",
                r + 1, mb, 1e3 * save.back(), 1e3 * write.back(), 1e3 * load.back(),
                1e3 * read.back());
  }
  fs::remove_all(dir);
  std::printf("median MB/s: save %.0f vs plain write+fsync %.0f (%.2fx); load %.0f vs plain read "
              "%.0f (%.2fx)\n",
              mb / median(save), mb / median(write), median(write) / median(save),
              mb / median(load), mb / median(read), median(read) / median(load));
  return 0;
}
