#pragma once
// A stream-ordered caching allocator for device memory. Asking a device for memory (cudaMalloc)
// synchronizes it and costs tens of microseconds; a training step asks for the same sizes every
// step. So freed blocks are kept, per stream, and handed out again to later requests on that
// stream: work on one stream runs in order, so a block freed there (its last use queued before
// the free) can be reused by work queued after it without waiting. A block is never handed to
// another stream (that would need an event; the backends record one where they share buffers).
//
//     exec::caching_allocator<cuda_memory> pool{cuda_memory{0}, "cuda device 0"};
//     void* p = pool.allocate(1000, stream);   // rounded up to 1024 bytes, from the device
//     pool.deallocate(p);                      // cached for `stream`
//     void* q = pool.allocate(900, stream);    // the same block, no device call
//     pool.stats().reserved_bytes;             // 1024: held from the device
//
// Sizes are rounded up to 512 bytes (2 MiB above 1 MiB) so that requests that differ a little
// share blocks; a cached block serves a request of up to 1.5 times less (no splitting). When the
// device is out of memory the cache is released (after synchronizing) and the request retried
// once; then a `device_error` names the device, the request and the bytes held.
//
// Hardware-free: the memory below is a `raw_memory` policy (exec/backends/cuda.cuh gives the
// CUDA one; tests give a counting host one).

#include <hspmd/core/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// The memory a caching allocator draws from. `allocate(bytes, s)` returns nullptr when out of
/// memory (never throws for that); `synchronize()` waits for all work on every stream, so that
/// blocks can be returned to the device; `device()` is the index used in messages.
template <class R>
concept raw_memory = requires(R& r, std::size_t bytes, void* p, typename R::stream s) {
  typename R::stream;
  { r.allocate(bytes, s) } -> std::same_as<void*>;
  r.deallocate(p, bytes);
  r.synchronize();
  { r.device() } -> std::convertible_to<int>;
};

/// Counters of a caching allocator, in bytes of rounded block sizes.
struct memory_stats {
  std::size_t allocated_bytes = 0;      ///< in blocks handed out and not yet freed
  std::size_t reserved_bytes = 0;       ///< held from the device: allocated + cached
  std::size_t peak_allocated_bytes = 0; ///< the most allocated_bytes has been
  std::size_t peak_reserved_bytes = 0;  ///< the most reserved_bytes has been
  std::size_t device_allocations = 0;   ///< requests that went to the device
  std::size_t cache_hits = 0;           ///< requests served from the cache
  std::size_t cache_releases = 0;       ///< times the cache was returned to satisfy a request
};

/// Caches device blocks per stream (see the file comment). Thread-safe. It must outlive every
/// block it handed out; its destructor returns cached blocks to the device.
template <raw_memory R>
class caching_allocator {
public:
  using stream = typename R::stream;

  static constexpr std::size_t small_granule = 512;
  static constexpr std::size_t large_granule = std::size_t{2} << 20;
  static constexpr std::size_t small_limit = std::size_t{1} << 20;

  explicit caching_allocator(R raw = R{}) : raw_(std::move(raw)) {}
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  ~caching_allocator() { release_cached_locked(); }

  /// The block size a request of `bytes` gets (0 when rounding up would overflow: no block).
  [[nodiscard]] static constexpr std::size_t rounded(std::size_t bytes) noexcept {
    const std::size_t g = bytes <= small_limit ? small_granule : large_granule;
    if (bytes > std::numeric_limits<std::size_t>::max() - (g - 1))
      return 0;
    return bytes == 0 ? 0 : (bytes + g - 1) / g * g;
  }

  /// A block of at least `bytes` for work on stream `s`; nullptr for 0 bytes. Throws
  /// `device_error` when the device cannot provide it even after the cache is released.
  [[nodiscard]] void* allocate(std::size_t bytes, stream s) {
    if (bytes == 0)
      return nullptr;
    const std::size_t size = rounded(bytes);
    if (size == 0)
      throw device_error(raw_.device(), "allocate",
                         "a request of " + std::to_string(bytes) + " bytes is larger than memory",
                         "check the tensor sizes (an overflowed size computation?)");
    const std::lock_guard lock(mutex_);
    if (const auto [cached, have] = take_cached(size, s); cached != nullptr) {
      ++stats_.cache_hits;
      return hand_out(cached, have, s);
    }
    void* p = raw_.allocate(size, s);
    if (p == nullptr && !cache_empty()) {
      ++stats_.cache_releases;
      release_cached_locked();
      p = raw_.allocate(size, s);
    }
    if (p == nullptr)
      throw device_error(raw_.device(), "allocate",
                         "out of memory for " + mib(size) + " (" + mib(stats_.allocated_bytes) +
                             " in use by hspmd, " + mib(stats_.reserved_bytes) + " reserved)",
                         "lower the batch or the model's size, or give this device a smaller share "
                         "(its memory in the cluster file)");
    ++stats_.device_allocations;
    stats_.reserved_bytes += size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    return hand_out(p, size, s);
  }

  /// Returns a block from `allocate` to the cache of the stream it was allocated for. nullptr is
  /// ignored; a pointer this allocator did not hand out is a bug and is ignored too (noexcept).
  void deallocate(void* p) noexcept {
    if (p == nullptr)
      return;
    const std::lock_guard lock(mutex_);
    const auto it = live_.find(p);
    if (it == live_.end())
      return;
    const auto [size, s] = it->second;
    live_.erase(it);
    stats_.allocated_bytes -= size;
    try {
      cache_of(s).emplace(size, p);
    } catch (...) { // no memory for the books: give the block back to the device instead
      give_back(p, size);
    }
  }

  /// Returns every cached block to the device (after synchronizing); live blocks stay.
  void release_cached() {
    const std::lock_guard lock(mutex_);
    release_cached_locked();
  }

  [[nodiscard]] memory_stats stats() const {
    const std::lock_guard lock(mutex_);
    return stats_;
  }

  /// Bytes cached for reuse (reserved and not allocated).
  [[nodiscard]] std::size_t cached_bytes() const {
    const std::lock_guard lock(mutex_);
    return stats_.reserved_bytes - stats_.allocated_bytes;
  }

  [[nodiscard]] R& raw() noexcept { return raw_; }

private:
  using free_list = std::multimap<std::size_t, void*>; // by block size

  [[nodiscard]] static std::string mib(std::size_t bytes) {
    const auto tenths = (bytes * 10 + (std::size_t{1} << 19)) >> 20;
    return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
  }

  free_list& cache_of(stream s) {
    for (auto& [owner, list] : caches_)
      if (owner == s)
        return list;
    return caches_.emplace_back(s, free_list{}).second;
  }

  [[nodiscard]] bool cache_empty() const {
    return std::all_of(caches_.begin(), caches_.end(),
                       [](const auto& c) { return c.second.empty(); });
  }

  // The smallest cached block of this stream that fits and wastes at most a third of itself:
  // {block, its size}, or {nullptr, 0}.
  std::pair<void*, std::size_t> take_cached(std::size_t size, stream s) {
    free_list& list = cache_of(s);
    const auto it = list.lower_bound(size);
    if (it == list.end() || it->first > size + size / 2)
      return {nullptr, 0};
    const std::pair<void*, std::size_t> found{it->second, it->first};
    list.erase(it);
    return found;
  }

  void* hand_out(void* p, std::size_t size, stream s) {
    try {
      live_.emplace(p, std::pair{size, s});
    } catch (...) { // the block would be lost to the books: back to the device, then rethrow
      give_back(p, size);
      throw;
    }
    stats_.allocated_bytes += size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return p;
  }

  // Returns one block to the device once the work that may still use it is done.
  void give_back(void* p, std::size_t size) noexcept {
    raw_.synchronize();
    raw_.deallocate(p, size);
    stats_.reserved_bytes -= size;
  }

  void release_cached_locked() noexcept {
    if (cache_empty())
      return;
    raw_.synchronize();
    for (auto& [owner, list] : caches_) {
      for (const auto& [size, p] : list) {
        raw_.deallocate(p, size);
        stats_.reserved_bytes -= size;
      }
      list.clear();
    }
  }

  R raw_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::pair<std::size_t, stream>> live_;
  std::vector<std::pair<stream, free_list>> caches_;
  memory_stats stats_;
};

/// n elements of T in a block of a caching allocator, returned to it on destruction. Move-only;
/// default-constructed it is empty. The allocator must outlive it.
template <class T, class Allocator>
class pooled_buffer {
public:
  using value_type = T;

  pooled_buffer() = default;
  pooled_buffer(Allocator& pool, std::size_t n, typename Allocator::stream s)
      : pool_(&pool), data_(static_cast<T*>(pool.allocate(bytes_of(n), s))), size_(n) {}
  pooled_buffer(pooled_buffer&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  pooled_buffer& operator=(pooled_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  pooled_buffer(const pooled_buffer&) = delete;
  pooled_buffer& operator=(const pooled_buffer&) = delete;
  ~pooled_buffer() { reset(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// The element range, so that a std::span views it (device memory: never dereferenced on the
  /// host).
  [[nodiscard]] T* begin() const noexcept { return data_; }
  [[nodiscard]] T* end() const noexcept { return data_ + size_; }

  /// Returns the block to the allocator now.
  void reset() noexcept {
    if (pool_ != nullptr)
      pool_->deallocate(data_);
    pool_ = nullptr;
    data_ = nullptr;
    size_ = 0;
  }

private:
  [[nodiscard]] static std::size_t bytes_of(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw error("pooled_buffer", std::to_string(n) + " elements overflow a byte count",
                  "check the tensor sizes");
    return n * sizeof(T);
  }

  Allocator* pool_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

} // namespace hspmd::exec
