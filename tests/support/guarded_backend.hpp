#pragma once
// A test backend whose memory the host cannot touch outside backend calls, as with a GPU: every
// buffer lives in pages of its own, left PROT_NONE except while one of the backend's calls runs,
// so a host read or write of a "device" buffer anywhere else ends the test with a segmentation
// fault at that line instead of passing silently where a GPU would have failed. Its compute is
// the host backend's (host_compute.hpp), each call wrapped in opening the pages.

#include "host_compute.hpp"

#include <hspmd/kernels/backend.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::test {

// The pages of every live buffer, opened (read/write) only inside backend calls.
struct guarded_pages {
  std::vector<std::pair<void*, std::size_t>> regions;
  int depth = 0;
  std::size_t calls = 0;

  void protect(void* p, std::size_t bytes, bool open) const {
    // Checked without counting an assertion: this runs for every buffer at every call.
    if (::mprotect(p, bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
      FAIL("mprotect of a guarded buffer failed");
  }
  void enter() {
    ++calls;
    if (depth++ == 0)
      for (const auto& [p, n] : regions)
        protect(p, n, true);
  }
  void leave() {
    if (--depth == 0)
      for (const auto& [p, n] : regions)
        protect(p, n, false);
  }
};

class guarded_backend : public host_compute<guarded_backend> {
public:
  template <class T>
  class buffer {
  public:
    buffer() = default;
    buffer(std::shared_ptr<guarded_pages> pages, std::size_t n) : pages_(std::move(pages)), n_(n) {
      if (n == 0)
        return;
      const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
      bytes_ = (n * sizeof(T) + page - 1) / page * page;
      void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) // zero-filled, like the host backend's buffers
        FAIL("mmap of a guarded buffer failed");
      data_ = static_cast<T*>(p);
      pages_->regions.emplace_back(p, bytes_);
      if (pages_->depth == 0)
        pages_->protect(p, bytes_, false);
    }
    buffer(buffer&& o) noexcept
        : pages_(std::move(o.pages_)), data_(std::exchange(o.data_, nullptr)),
          n_(std::exchange(o.n_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
    buffer& operator=(buffer&& o) noexcept {
      if (this != &o) {
        release();
        pages_ = std::move(o.pages_);
        data_ = std::exchange(o.data_, nullptr);
        n_ = std::exchange(o.n_, 0);
        bytes_ = std::exchange(o.bytes_, 0);
      }
      return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() { release(); }

    [[nodiscard]] T* data() const noexcept { return data_; }
    [[nodiscard]] std::size_t size() const noexcept { return n_; }
    [[nodiscard]] T* begin() const noexcept { return data_; }
    [[nodiscard]] T* end() const noexcept { return data_ + n_; }

  private:
    void release() noexcept {
      if (data_ != nullptr) {
        auto& r = pages_->regions;
        r.erase(std::find(r.begin(), r.end(), std::pair<void*, std::size_t>{data_, bytes_}));
        ::munmap(data_, bytes_);
      }
      data_ = nullptr;
      n_ = bytes_ = 0;
    }
    std::shared_ptr<guarded_pages> pages_;
    T* data_ = nullptr;
    std::size_t n_ = 0;
    std::size_t bytes_ = 0;
  };

  [[nodiscard]] std::string_view name() const { return "guarded host memory"; }
  [[nodiscard]] std::size_t calls() const { return pages_->calls; }

  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t n) {
    return buffer<T>(pages_, n);
  }
  struct open {
    guarded_pages& p;
    explicit open(guarded_pages& pages) : p(pages) { p.enter(); }
    ~open() { p.leave(); }
    open(const open&) = delete;
    open& operator=(const open&) = delete;
  };
  /// Opens every buffer's pages for the duration of a call (host_compute wraps each in it).
  [[nodiscard]] open guard() { return open(*pages_); }

private:
  std::shared_ptr<guarded_pages> pages_ = std::make_shared<guarded_pages>();
};
static_assert(hspmd::exec::backend<guarded_backend>);
static_assert(!hspmd::exec::host_memory_v<guarded_backend>);

} // namespace hspmd::test
