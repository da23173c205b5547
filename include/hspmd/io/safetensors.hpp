#pragma once
// The safetensors file format (what PyTorch and Hugging Face read and write): an 8-byte
// little-endian header length N, N bytes of JSON (padded with spaces), then the tensors' bytes.
// The header maps each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the data after the header) and may hold "__metadata__", an object of strings. Checkpoints
// (train/checkpoint.hpp) store each rank's pieces in one such file.
//
// The reader checks everything the format promises before anything is used: the header's length
// against the file's, its JSON, every dtype and shape, and that the tensors' byte ranges tile the
// data without gaps or overlaps (as the reference implementation requires). A problem is a
// `config_error` naming the file and the tensor.

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace hspmd::io {

/// The format's name of an element type ("F32", "BF16", ...).
[[nodiscard]] constexpr std::string_view safetensors_dtype(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
    return "F32";
  case dtype::f64:
    return "F64";
  case dtype::i32:
    return "I32";
  case dtype::i64:
    return "I64";
  case dtype::bf16:
    return "BF16";
  case dtype::f16:
    return "F16";
  }
  return "F32";
}

/// Inverse of `safetensors_dtype`; nothing for a type hspmd does not hold.
[[nodiscard]] constexpr std::optional<dtype> parse_safetensors_dtype(std::string_view s) noexcept {
  for (dtype t : {dtype::f32, dtype::f64, dtype::i32, dtype::i64, dtype::bf16, dtype::f16})
    if (safetensors_dtype(t) == s)
      return t;
  return std::nullopt;
}

/// One tensor of a file's header.
struct safetensors_entry {
  dtype type = dtype::f32;
  std::vector<std::size_t> shape;
  std::uint64_t begin = 0; ///< absolute byte offset in the file
  std::uint64_t bytes = 0;
};

/// A file's header, checked.
struct safetensors_header {
  std::map<std::string, safetensors_entry> tensors;
  std::map<std::string, std::string> metadata;
  std::uint64_t file_size = 0;
};

namespace detail {

// An open file descriptor, closed on destruction.
class fd {
public:
  fd(const std::filesystem::path& path, int flags, const char* doing) : path_(path.string()) {
    f_ = ::open(path_.c_str(), flags | O_CLOEXEC, 0644);
    if (f_ < 0)
      throw config_error(path_, std::string("cannot be ") + doing + ": " + std::strerror(errno),
                         "check the path and its permissions");
  }
  fd(const fd&) = delete;
  fd& operator=(const fd&) = delete;
  ~fd() {
    if (f_ >= 0)
      ::close(f_);
  }
  [[nodiscard]] int get() const noexcept { return f_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  // Calls of at most 8 MiB: one call of a GiB into a new file took 2.2-2.5 s here (ext4), 128
  // calls of 8 MiB 0.23 s; reads gain less but the same.
  static constexpr std::size_t chunk = std::size_t{8} << 20U;

  void write_all(std::span<const std::byte> b, std::uint64_t at) const {
    while (!b.empty()) {
      const ssize_t n = ::pwrite(f_, b.data(), std::min(b.size(), chunk), static_cast<off_t>(at));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        throw config_error(path_, std::string("write failed: ") + std::strerror(errno),
                           "free space on its file system or choose another directory");
      b = b.subspan(static_cast<std::size_t>(n));
      at += static_cast<std::uint64_t>(n);
    }
  }
  void read_all(std::span<std::byte> b, std::uint64_t at) const {
    const std::uint64_t want = b.size();
    const std::uint64_t start = at;
    while (!b.empty()) {
      const ssize_t n = ::pread(f_, b.data(), std::min(b.size(), chunk), static_cast<off_t>(at));
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        throw config_error(path_, std::string("read failed: ") + std::strerror(errno),
                           "check the file system");
      if (n == 0)
        throw config_error(path_,
                           "is truncated: " + std::to_string(want) + " bytes expected at offset " +
                               std::to_string(start) + ", the file ends at " + std::to_string(at),
                           "restore the file, or load an earlier checkpoint");
      b = b.subspan(static_cast<std::size_t>(n));
      at += static_cast<std::uint64_t>(n);
    }
  }
  void sync() const {
    if (::fsync(f_) != 0)
      throw config_error(path_, std::string("fsync failed: ") + std::strerror(errno),
                         "check the file system");
  }
  [[nodiscard]] std::uint64_t size() const {
    struct stat st {};
    if (::fstat(f_, &st) != 0)
      throw config_error(path_, std::string("fstat failed: ") + std::strerror(errno));
    return static_cast<std::uint64_t>(st.st_size);
  }

private:
  std::string path_;
  int f_ = -1;
};

} // namespace detail

/// A tensor to write: its name, element type, shape and bytes (row-major).
struct safetensors_tensor {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::size_t> shape;
  std::span<const std::byte> data;
};

/// A safetensors file's bytes before its data: the 8-byte header length and the header (padded
/// so the data starts 8-byte aligned), for `tensors` in this order; and each tensor's absolute
/// byte offset in the file. `where` names the file in errors.
struct safetensors_layout {
  std::string prefix;
  std::vector<std::uint64_t> offsets;
  std::uint64_t total = 0; ///< the file's bytes
};
[[nodiscard]] inline safetensors_layout
layout_safetensors(const std::string& where, std::span<const safetensors_tensor> tensors,
                   const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty())
    h["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const safetensors_tensor& t : tensors) {
    std::size_t n = size_of(t.type);
    for (std::size_t d : t.shape)
      n *= d;
    if (n != t.data.size())
      throw config_error(where + ": tensor " + t.name,
                         std::to_string(t.data.size()) + " bytes for a shape of " +
                             std::to_string(n) + " bytes",
                         "pass the tensor's bytes");
    if (h.contains(t.name))
      throw config_error(where + ": tensor " + t.name, "given twice", "unique names");
    h[t.name] = {
        {"dtype", safetensors_dtype(t.type)}, {"shape", t.shape}, {"data_offsets", {at, at + n}}};
    at += n;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' '); // the data starts 8-byte aligned
  safetensors_layout out;
  out.prefix.resize(8);
  for (std::size_t k = 0; k < 8; ++k)
    out.prefix[k] = static_cast<char>((static_cast<std::uint64_t>(text.size()) >> (8 * k)) & 0xFFU);
  out.prefix += text;
  std::uint64_t pos = out.prefix.size();
  for (const safetensors_tensor& t : tensors) {
    out.offsets.push_back(pos);
    pos += t.data.size();
  }
  out.total = pos;
  return out;
}

/// Writes `tensors` (in this order) and `metadata` to `path` and flushes it to disk (fsync).
/// Returns each tensor's absolute byte offset in the file.
/// `before_sync`: called once the bytes are written, while another thread flushes them (work
/// that overlaps the flush, such as checksums; fault injection); the flush is waited for after.
inline std::vector<std::uint64_t>
write_safetensors(const std::filesystem::path& path, std::span<const safetensors_tensor> tensors,
                  const std::map<std::string, std::string>& metadata = {},
                  const std::function<void()>& before_sync = {}) {
  const safetensors_layout lay = layout_safetensors(path.string(), tensors, metadata);
  const detail::fd f(path, O_WRONLY | O_CREAT | O_TRUNC, "written");
  f.write_all(std::as_bytes(std::span<const char>(lay.prefix)), 0);
  for (std::size_t i = 0; i < tensors.size(); ++i)
    f.write_all(tensors[i].data, lay.offsets[i]);
  const std::vector<std::uint64_t>& offsets = lay.offsets;
  if (!before_sync) {
    f.sync();
    return offsets;
  }
  std::exception_ptr flush_failed;
  std::thread flush([&] {
    try {
      f.sync();
    } catch (...) {
      flush_failed = std::current_exception();
    }
  });
  try {
    before_sync();
  } catch (...) {
    flush.join();
    throw;
  }
  flush.join();
  if (flush_failed)
    std::rethrow_exception(flush_failed);
  return offsets;
}

/// Reads and checks the header of the safetensors file `path`.
[[nodiscard]] inline safetensors_header read_safetensors_header(const std::filesystem::path& path) {
  const detail::fd f(path, O_RDONLY, "read");
  const std::string file = path.string();
  safetensors_header out;
  out.file_size = f.size();
  const auto bad = [&](const std::string& what, const std::string& fix) {
    throw config_error(file, what, fix);
  };
  constexpr std::string_view not_one =
      "a safetensors file (8-byte header length, JSON header, data)";
  if (out.file_size < 8)
    bad("is truncated: " + std::to_string(out.file_size) + " bytes, not even a header length",
        "restore the file, or load an earlier checkpoint");
  std::array<std::byte, 8> len{};
  f.read_all(len, 0);
  std::uint64_t n = 0;
  for (std::size_t k = 0; k < 8; ++k)
    n |= static_cast<std::uint64_t>(len[k]) << (8 * k);
  constexpr std::uint64_t max_header = std::uint64_t{100} << 20U;
  if (n > max_header || n > out.file_size - 8)
    bad("header length " + std::to_string(n) + " does not fit the file of " +
            std::to_string(out.file_size) + " bytes",
        std::string(not_one) + "; the file is truncated or not safetensors");
  std::string text(static_cast<std::size_t>(n), '\0');
  f.read_all(std::as_writable_bytes(std::span<char>(text)), 8);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("header is not valid JSON: ") + e.what(), std::string(not_one));
  }
  if (!h.is_object())
    bad("header is not a JSON object", std::string(not_one));
  const std::uint64_t data = out.file_size - 8 - n;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") {
      if (!e.is_object())
        bad("__metadata__ is not an object", "an object of strings");
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string())
          bad("__metadata__." + k + " is not a string", "string values only, as the format says");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor " + name + ": ";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets"))
      bad(where + "not an object with dtype, shape and data_offsets", std::string(not_one));
    safetensors_entry t;
    const auto type = e["dtype"].is_string()
                          ? parse_safetensors_dtype(e["dtype"].get<std::string>())
                          : std::nullopt;
    if (!type)
      bad(where + "dtype " + e["dtype"].dump() + " is not one hspmd holds",
          "F32, F64, BF16, F16, I32 or I64");
    t.type = *type;
    std::uint64_t elements = 1;
    if (!e["shape"].is_array())
      bad(where + "shape is not an array", "an array of whole numbers");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned())
        bad(where + "shape " + e["shape"].dump() + " is not an array of whole numbers",
            "an array of whole numbers");
      t.shape.push_back(d.get<std::size_t>());
      elements *= t.shape.back();
    }
    const auto& o = e["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() ||
        !o[1].is_number_unsigned() || o[0].get<std::uint64_t>() > o[1].get<std::uint64_t>() ||
        o[1].get<std::uint64_t>() > data)
      bad(where + "data_offsets " + o.dump() + " do not lie within the " + std::to_string(data) +
              " bytes of data",
          "restore the file: it is truncated or damaged");
    const std::uint64_t b = o[0].get<std::uint64_t>();
    const std::uint64_t end = o[1].get<std::uint64_t>();
    if (end - b != elements * size_of(t.type))
      bad(where + std::to_string(end - b) + " bytes for shape " + e["shape"].dump() + " of " +
              std::string(safetensors_dtype(t.type)),
          "restore the file: it is damaged");
    t.begin = 8 + n + b;
    t.bytes = end - b;
    ranges.emplace_back(b, end);
    out.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    if (b != at)
      bad("tensors' data " + std::string(b < at ? "overlap" : "leave a gap") + " at byte " +
              std::to_string(std::min(b, at)) + " of the data",
          "restore the file: it is damaged");
    at = e;
  }
  if (at != data)
    bad("has " + std::to_string(data - at) + " bytes after the last tensor's data",
        "restore the file: it is damaged");
  return out;
}

/// `bytes.size()` bytes of `path` from absolute offset `at`; a short file is a `config_error`
/// naming it.
inline void read_file_range(const std::filesystem::path& path, std::uint64_t at,
                            std::span<std::byte> bytes) {
  const detail::fd f(path, O_RDONLY, "read");
  f.read_all(bytes, at);
}

} // namespace hspmd::io
