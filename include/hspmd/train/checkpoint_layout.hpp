#pragma once
// What a checkpoint (train/checkpoint.hpp) holds and where it lies: the pieces a rank saves and
// the boxes it loads, the step directories' names, the files written atomically, the local
// versions of a lowered program's parameters, and the tensors of a run's state.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/reshard.hpp>
#include <hspmd/io/crc32.hpp>
#include <hspmd/io/safetensors.hpp>
#include <hspmd/train/namespace.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::train {

/// One tensor as this rank holds it, to save.
template <class T>
struct checkpoint_piece {
  std::string name;
  std::vector<std::size_t> shape; ///< the whole tensor's
  std::vector<box> boxes;         ///< every rank's box: replicas equal, pieces disjoint
  std::span<const T> data;        ///< this rank's box, row-major
};

/// One tensor to load into this rank's box.
template <class T>
struct checkpoint_target {
  std::string name;
  std::vector<std::size_t> shape; ///< the whole tensor's; must equal the saved one
  box mine;                       ///< what this rank holds
  std::span<T> out;               ///< mine.size() elements, row-major
};

struct checkpoint_options {
  std::size_t keep = 0;                           ///< newest checkpoints kept (0: all)
  std::size_t block_bytes = std::size_t{1} << 20; ///< bytes per checksum block
  /// Called at the points of a save where a crash leaves it half done ("shards", "written",
  /// "manifest", "latest": train/fault.hpp), for fault injection in tests.
  std::function<void(std::string_view point)> at_point;
};

/// A committed checkpoint.
struct checkpoint_info {
  std::filesystem::path dir;
  std::size_t step = 0;
  nlohmann::json meta; ///< what the saver passed
  /// What the load passed over (newer folders, train/checkpoint.hpp search_checkpoints) or could
  /// not verify (a manifest written before checksums), one line each.
  std::vector<std::string> notes;
};

/// "step-00000005".
[[nodiscard]] inline std::string checkpoint_name(std::size_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08zu", step);
  return b;
}

namespace detail {

[[nodiscard]] inline std::string rank_file(std::size_t r) {
  char b[40];
  std::snprintf(b, sizeof b, "rank-%05zu.safetensors", r);
  return b;
}

template <class T>
[[nodiscard]] constexpr dtype checkpoint_dtype() noexcept {
  return sizeof(T) == 8 ? dtype::f64 : dtype::f32;
}

inline void fsync_dir(const std::filesystem::path& dir) {
  const int f = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (f >= 0) {
    (void)::fsync(f);
    ::close(f);
  }
}

// Writes `text` to `path` through a temporary file and a rename, flushed before and after.
// `before_rename`: called between the two (fault injection).
inline void write_atomically(const std::filesystem::path& path, const std::string& text,
                             const std::function<void()>& before_rename = {}) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    const io::detail::fd f(tmp, O_WRONLY | O_CREAT | O_TRUNC, "written");
    f.write_all(std::as_bytes(std::span<const char>(text)), 0);
    f.sync();
  }
  if (before_rename)
    before_rename();
  std::filesystem::rename(tmp, path);
  fsync_dir(path.parent_path());
}

[[nodiscard]] inline std::optional<std::size_t> step_of(const std::filesystem::path& dir) {
  const std::string s = dir.filename().string();
  if (s.size() != 13 || s.rfind("step-", 0) != 0 ||
      !std::all_of(s.begin() + 5, s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return static_cast<std::size_t>(std::stoull(s.substr(5)));
}

// The committed checkpoints under `root` (a manifest present), oldest first.
[[nodiscard]] inline std::vector<std::pair<std::size_t, std::filesystem::path>>
committed(const std::filesystem::path& root) {
  std::vector<std::pair<std::size_t, std::filesystem::path>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec))
    if (const auto s = step_of(e.path());
        s && e.is_directory() && std::filesystem::exists(e.path() / "manifest.json"))
      out.emplace_back(*s, e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Every rank learns every rank's `text`. Collective.
template <class Comm>
[[nodiscard]] std::vector<std::string> all_gather_text(Comm& comm, const std::string& text) {
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> sizes(n, 0);
  std::vector<std::uint64_t> mine{static_cast<std::uint64_t>(text.size())};
  comm.all_gather_v(std::span<const std::uint64_t>(mine), std::span<std::uint64_t>(sizes),
                    std::vector<std::size_t>(n, 1));
  std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::string all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), '\0');
  comm.all_gather_v(std::span<const char>(text), std::span<char>(all), counts);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t c : counts) {
    out.push_back(all.substr(at, c));
    at += c;
  }
  return out;
}

// Every rank throws the first failing rank's error, or none does. Collective.
template <class Comm>
void agree_on_error(Comm& comm, const std::string& error) {
  const auto all = all_gather_text(comm, error);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty())
      throw config_error("rank " + std::to_string(r), all[r]);
}

[[nodiscard]] inline std::string crc_hex(std::uint32_t c) {
  char b[9];
  std::snprintf(b, sizeof b, "%08x", c);
  return b;
}

[[nodiscard]] inline std::vector<std::size_t> json_sizes(const nlohmann::json& j) {
  std::vector<std::size_t> v;
  for (const auto& x : j)
    v.push_back(x.get<std::size_t>());
  return v;
}

} // namespace detail

/// The local version of each parameter of a lowered program that a checkpoint stores (the
/// first, where a plan holds several), as indices into `prog.local.parameters()` (the order of
/// the executor's parameters and an optimizer's slots).
[[nodiscard]] inline std::vector<std::size_t>
stored_parameters(const program::local_program& prog) {
  const auto params = prog.local.parameters();
  std::vector<std::size_t> out;
  std::vector<graph::node_id> seen;
  for (std::size_t j = 0; j < params.size(); ++j)
    if (std::ranges::find(seen, prog.global[params[j]]) == seen.end()) {
      seen.push_back(prog.global[params[j]]);
      out.push_back(j);
    }
  return out;
}

/// The pieces of every parameter of `prog` (a rank's lowering of graph `g`), named
/// `prefix` + the parameter's name; `values(j)`: this rank's elements of parameter j of
/// `prog.local.parameters()` (its value, or an optimizer slot of it).
template <class T, class Values>
[[nodiscard]] std::vector<checkpoint_piece<T>>
program_pieces(const graph::graph& g, const program::local_program& prog, Values&& values,
               const std::string& prefix = "") {
  const auto params = prog.local.parameters();
  std::vector<checkpoint_piece<T>> out;
  for (std::size_t j : stored_parameters(prog)) {
    const graph::node_id id = params[j];
    out.push_back({prefix + g[prog.global[id]].name, prog.layouts.at(id).global, boxes_of(prog, id),
                   std::span<const T>(values(j))});
  }
  return out;
}

/// The targets to load every version of every parameter of `prog` into (all of a plan's
/// versions of a tensor take the same values); `values(j)` as for `program_pieces`, writable.
template <class T, class Values>
[[nodiscard]] std::vector<checkpoint_target<T>>
program_targets(const graph::graph& g, const program::local_program& prog, Values&& values,
                const std::string& prefix = "") {
  const auto params = prog.local.parameters();
  std::vector<checkpoint_target<T>> out;
  for (std::size_t j = 0; j < params.size(); ++j) {
    const graph::node_id id = params[j];
    out.push_back({prefix + g[prog.global[id]].name, prog.layouts.at(id).global,
                   boxes_of(prog, id).at(prog.rank), std::span<T>(values(j))});
  }
  return out;
}

/// The communicator of a single process (rank 0 of 1), for checkpoints of a run without MPI.
struct solo_communicator {
  [[nodiscard]] static int rank() noexcept { return 0; }
  [[nodiscard]] static int size() noexcept { return 1; }
  template <class X>
  void all_gather_v(std::span<const X> in, std::span<X> out, const std::vector<std::size_t>&) {
    std::copy(in.begin(), in.end(), out.begin());
  }
};

/// One tensor of a training run's state as this rank holds it: a parameter or one of an
/// optimizer's slots of it ("optimizer.<slot>.<parameter>").
template <class T>
struct training_tensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<box> boxes; ///< every rank's
  std::span<T> data;      ///< this rank's box
  bool stored = true;     ///< false: another version of the same tensor is the one saved
  bool optimizer = false; ///< an optimizer's slot, not a parameter
};

} // namespace hspmd::train
