#pragma once
// A file of a fixed size mapped into memory, read and write, shared: what a process writes into
// the mapping is the file's content (on tmpfs, /dev/shm, the memory itself), and it stays when
// the process dies. The RAM tier of checkpoints (train/ram_tier.hpp) copies each step's shards
// into such files. `mapped_input`: an existing file mapped read-only (token datasets,
// data/tokens.hpp): pages are read when first touched.

#include <hspmd/core/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

namespace hspmd::io {

class mapped_file {
public:
  mapped_file() = default;
  /// Creates (or truncates) `path` to `bytes` bytes and maps it.
  mapped_file(const std::filesystem::path& path, std::size_t bytes) : path_(path), size_(bytes) {
    const int f = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f < 0)
      throw config_error(path.string(), std::string("cannot be created: ") + std::strerror(errno),
                         "check the directory and its permissions");
    if (::ftruncate(f, static_cast<off_t>(bytes)) != 0) {
      const int e = errno;
      ::close(f);
      throw config_error(path.string(), std::string("cannot be sized: ") + std::strerror(e),
                         "free memory (a RAM tier lives in /dev/shm) or choose another directory");
    }
    if (bytes > 0) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(f);
        throw config_error(path.string(), std::string("cannot be mapped: ") + std::strerror(e),
                           "free memory or choose another directory");
      }
      data_ = static_cast<std::byte*>(p);
    }
    ::close(f);
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~mapped_file() {
    if (data_ != nullptr)
      ::munmap(data_, size_);
  }
  [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_, size_}; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

private:
  std::filesystem::path path_;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// An existing file mapped read-only; an empty file maps to no bytes.
class mapped_input {
public:
  mapped_input() = default;
  explicit mapped_input(const std::filesystem::path& path) : path_(path) {
    const int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f < 0)
      throw config_error(path.string(), std::string("cannot be opened: ") + std::strerror(errno),
                         "give a readable file");
    const off_t end = ::lseek(f, 0, SEEK_END);
    if (end < 0) {
      const int e = errno;
      ::close(f);
      throw config_error(path.string(), std::string("cannot be sized: ") + std::strerror(e),
                         "give a regular file");
    }
    size_ = static_cast<std::size_t>(end);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(f);
        throw config_error(path.string(), std::string("cannot be mapped: ") + std::strerror(e),
                           "give a regular file");
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(f);
  }
  mapped_input(const mapped_input&) = delete;
  mapped_input& operator=(const mapped_input&) = delete;
  mapped_input(mapped_input&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  mapped_input& operator=(mapped_input&& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~mapped_input() {
    if (data_ != nullptr)
      ::munmap(const_cast<std::byte*>(data_), size_);
  }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

} // namespace hspmd::io
