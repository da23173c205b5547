#pragma once
// The RAM tier of checkpoints (docs/checkpoint.md "RAM tier"): every step's state kept in memory
// that outlives the process, and a copy of it in another node's memory.
//
// Each rank keeps two slot files in DIR/<node>/<job>/ (rank-RRRRR.slot0.safetensors, .slot1),
// mapped into memory (io/mapped_file.hpp; DIR on /dev/shm is RAM). A save copies the rank's
// pieces (the same pieces the disk checkpoint gives it) into the older slot -- the only part
// training waits for, with the removal of the slot's record before it -- and starts sending the
// slot to its peer, a rank on the next node, which receives it into its own slot files for that
// rank (DIR/<peer's node>/<job>/rank-RRRRR.slotS.safetensors). The writer thread checksums
// each block as it copies it (the CRC reads the block from cache), and the CRC-32s travel to the
// peer with the slot: the copy is checked against what its sender had, at load. The writer then
// writes each slot's record, rank-RRRRR.slotS.json: the step, the pieces (as a disk manifest
// lists them, with their CRC-32s), the run's metadata and a checksum of its own. A slot's record
// exists only while the slot holds that step: a save removes it before the copy.
//
// A state (job, step) is complete when a record of that step exists for every rank of the job,
// in its own node's folder or in its peer's. `find_ram_state` finds the newest complete state;
// `assemble_ram_checkpoint` makes it a checkpoint directory (links to the slots and a manifest)
// that the resharding loader (train/checkpoint.hpp) loads onto any plan. Losing a whole node
// loses its folder; the peers' copies complete the state. MPI calls stay on the main thread: the
// writer thread only copies, checksums and writes files.
//
// Loading reads the slots through the file system: every rank of the resumed run must see DIR
// (one host, or DIR on a file system the hosts share).

#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/io/crc32.hpp>
#include <hspmd/io/mapped_file.hpp>
#include <hspmd/io/safetensors.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/ram_state.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include <sched.h>
#include <vector>

namespace hspmd::train {

/// One rank's RAM tier for one layout of the run's state (see the file comment). The
/// constructor and `save` are collective in the sense that every rank calls them at the same
/// steps; a layout change (re-balancing) needs a new tier.
template <std::floating_point T, class Comm>
class ram_tier {
public:
  static constexpr int tag = 0x5241; // 'RA'

  ram_tier(Comm& comm, ram_options o, std::span<const training_tensor<T>> tensors)
      : comm_(&comm), o_(std::move(o)) {
    namespace fs = std::filesystem;
    const auto n = static_cast<std::size_t>(comm.size());
    me_ = static_cast<std::size_t>(comm.rank());
    if (o_.nodes.size() != n)
      throw config_error("RAM tier",
                         "has " + std::to_string(o_.nodes.size()) + " node names for " +
                             std::to_string(n) + " ranks",
                         "one node name per rank");
    // This rank's pieces, as the disk checkpoint assigns them, and the slot's layout.
    std::vector<checkpoint_piece<T>> pieces;
    std::vector<std::size_t> source;
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].stored) {
        pieces.push_back({tensors[i].name, tensors[i].shape, tensors[i].boxes,
                          std::span<const T>(tensors[i].data)});
        source.push_back(i);
      }
    std::vector<io::safetensors_tensor> st;
    nlohmann::json records = nlohmann::json::array();
    for (const std::size_t i :
         detail::pieces_written_by(std::span<const checkpoint_piece<T>>(pieces), n, me_)) {
      const checkpoint_piece<T>& p = pieces[i];
      st.push_back(
          {p.name, detail::checkpoint_dtype<T>(), p.boxes[me_].length, std::as_bytes(p.data)});
      mine_.push_back(source[i]);
    }
    const io::safetensors_layout lay = io::layout_safetensors(
        "RAM tier slot", st, {{"format", "hspmd-checkpoint"}, {"rank", std::to_string(me_)}});
    for (std::size_t k = 0; k < st.size(); ++k) {
      const checkpoint_piece<T>& p =
          pieces[static_cast<std::size_t>(std::ranges::find(source, mine_[k]) - source.begin())];
      records.push_back({{"tensor", p.name},
                         {"shape", p.shape},
                         {"offset", p.boxes[me_].offset},
                         {"length", p.boxes[me_].length},
                         {"data_offset", lay.offsets[k]},
                         {"bytes", st[k].data.size()}});
    }
    offsets_ = lay.offsets;
    // Every rank's records and slot size: a peer checksums and describes the copy it holds.
    nlohmann::json mine = {{"records", records}, {"bytes", lay.total}};
    std::vector<nlohmann::json> all;
    for (const std::string& t : detail::all_gather_text(comm, mine.dump()))
      all.push_back(nlohmann::json::parse(t));
    if (o_.peers)
      if (const auto p = detail::ram_peer(o_.nodes, me_))
        peer_ = static_cast<int>(*p);
    std::vector<std::size_t> senders;
    if (o_.peers)
      for (std::size_t r = 0; r < n; ++r)
        if (r != me_ && detail::ram_peer(o_.nodes, r) == me_)
          senders.push_back(r);
    if constexpr (!detail::point_to_point_async<Comm>) {
      peer_.reset(); // a communicator without non-blocking sends keeps no peer copies
      senders.clear();
    }
    node_dir_ = o_.dir / o_.nodes[me_];
    job_dir_ = node_dir_ / o_.job;
    std::string error;
    try {
      fs::create_directories(job_dir_);
      // Folders of other jobs: earlier runs' (never mixed with this one) go now; the jobs this
      // one continues stay until it has saved three times.
      std::error_code ec;
      if (first_on_node())
        for (const auto& e : fs::directory_iterator(node_dir_))
          if (e.path().filename() != o_.job &&
              std::ranges::find(o_.retire, e.path().filename().string()) == o_.retire.end())
            fs::remove_all(e.path(), ec);
      const auto make = [&](std::size_t rank, std::size_t bytes, nlohmann::json recs) {
        holder h;
        h.rank = rank;
        h.records = std::move(recs);
        std::size_t blocks = 0;
        for (const auto& rec : h.records)
          blocks += block_count(rec.at("bytes").template get<std::size_t>());
        for (std::size_t s = 0; s < 2; ++s)
          h.crcs[s].assign(blocks, 0);
        for (std::size_t s = 0; s < 2; ++s) {
          fs::remove(job_dir_ / detail::ram_slot_name(rank, s, "json"), ec);
          h.slots[s] =
              io::mapped_file(job_dir_ / detail::ram_slot_name(rank, s, "safetensors"), bytes);
          // Every page now, not at the first saves (a page fault each 4 KiB: a first save of
          // 15 MiB and its copy cost 30 ms more than the later ones).
          std::memset(h.slots[s].bytes().data(), 0, bytes);
        }
        return h;
      };
      own_ = make(me_, lay.total, records);
      for (std::size_t s = 0; s < 2; ++s)
        std::memcpy(own_.slots[s].bytes().data(), lay.prefix.data(), lay.prefix.size());
      for (const std::size_t r : senders)
        held_.push_back(make(r, all[r].at("bytes").get<std::size_t>(), all[r].at("records")));
    } catch (const std::exception& e) {
      error = e.what();
    }
    detail::agree_on_error(comm, error);
    stats_.bytes = lay.total;
    for (const holder& h : held_)
      stats_.peer_bytes += h.slots[0].bytes().size();
    stats_.peers = held_.size();
    writer_ = std::thread([this] { write_loop(); });
  }
  ram_tier(const ram_tier&) = delete;
  ram_tier& operator=(const ram_tier&) = delete;
  /// Records what is queued; transfers not waited for (on an error path a peer may be gone).
  ~ram_tier() {
    {
      std::lock_guard<std::mutex> l(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (writer_.joinable())
      writer_.join();
  }

  /// Keeps `tensors` (this rank's state, as `training_tensors` gives it) as the state after
  /// `step`, `meta` as a checkpoint's manifest keeps it. The writer thread copies the state
  /// while the next step computes: call `poll` before the state changes (the optimizer's
  /// update), which waits for the copy.
  void save(std::size_t step, std::span<const training_tensor<T>> tensors,
            const nlohmann::json& meta) {
    const auto t0 = std::chrono::steady_clock::now();
    settle(); // (the previous save's copy, when no poll came between)
    const std::size_t s = stats_.saves % 2;
    // The slot's previous use (two saves ago) must be over: sent, received, recorded.
    complete(s, true);
    const auto t1 = std::chrono::steady_clock::now();
    stats_.transfer_seconds += std::chrono::duration<double>(t1 - t0).count();
    wait_written(s);
    rethrow();
    std::error_code ec;
    std::filesystem::remove(job_dir_ / detail::ram_slot_name(me_, s, "json"), ec);
    for (holder& h : held_)
      std::filesystem::remove(job_dir_ / detail::ram_slot_name(h.rank, s, "json"), ec);
    own_.step[s] = step;
    auto shared_meta = std::make_shared<const nlohmann::json>(meta);
    own_.meta[s] = shared_meta;
    if constexpr (detail::point_to_point_async<Comm>)
      for (holder& h : held_) {
        h.request[s] = comm_->start_recv(h.slots[s].bytes(), static_cast<int>(h.rank), tag);
        h.crc_request[s] = comm_->start_recv(std::as_writable_bytes(std::span(h.crcs[s])),
                                             static_cast<int>(h.rank), tag + 1);
        h.step[s] = step;
        h.meta[s] = shared_meta;
        h.pending[s] = true;
      }
    std::vector<std::span<const std::byte>> from;
    for (const std::size_t k : mine_)
      from.push_back(std::as_bytes(tensors[k].data));
    {
      std::lock_guard<std::mutex> l(mu_);
      copied_ = false;
      queue_.push_back({&own_, s, std::move(from)});
    }
    cv_.notify_all();
    copying_ = s;
    ++stats_.saves;
    if (stats_.saves == 3 && !o_.retire.empty() && first_on_node())
      for (const std::string& old : o_.retire)
        std::filesystem::remove_all(node_dir_ / old, ec);
    account(t0);
  }

  /// Before the state changes: waits for the last save's copy, starts sending it to the peer,
  /// and moves the peer copies along (a copy that has arrived is recorded).
  void poll() {
    const auto t0 = std::chrono::steady_clock::now();
    const bool waited = copying_.has_value();
    settle();
    if (waited) {
      stats_.copy_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      account(t0);
    }
    for (std::size_t s = 0; s < 2; ++s)
      complete(s, false);
  }

  /// Waits until every copy has arrived and every slot is recorded.
  void finish() {
    settle();
    for (std::size_t s = 0; s < 2; ++s)
      complete(s, true);
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return queue_.empty() && !busy_; });
    l.unlock();
    rethrow();
  }

  [[nodiscard]] const ram_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::optional<int> peer() const noexcept { return peer_; }

private:
  using request_t = typename detail::request_of<Comm>::type;
  struct holder {
    std::size_t rank = 0;
    nlohmann::json records;
    io::mapped_file slots[2];
    std::size_t step[2] = {0, 0};
    std::shared_ptr<const nlohmann::json> meta[2];
    std::vector<std::uint32_t> crcs[2]; // each piece's blocks' CRC-32s, pieces in order
    request_t request[2]{};
    request_t crc_request[2]{};
    bool pending[2] = {false, false}; // received into, not yet recorded
  };

  [[nodiscard]] bool first_on_node() const {
    for (std::size_t r = 0; r < me_; ++r)
      if (o_.nodes[r] == o_.nodes[me_])
        return false;
    return true;
  }

  // The last save's copy: waited for, then sent to the peer.
  void settle() {
    if (!copying_)
      return;
    const std::size_t s = *copying_;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return copied_ || !error_.empty(); });
    }
    copying_.reset();
    rethrow();
    if constexpr (detail::point_to_point_async<Comm>)
      if (peer_) {
        own_.request[s] =
            comm_->start_send(std::span<const std::byte>(own_.slots[s].bytes()), *peer_, tag);
        own_.crc_request[s] =
            comm_->start_send(std::as_bytes(std::span(own_.crcs[s])), *peer_, tag + 1);
      }
  }

  void account(std::chrono::steady_clock::time_point t0) {
    const double blocked =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.blocked_seconds += blocked;
    stats_.max_blocked_seconds = std::max(stats_.max_blocked_seconds, blocked);
  }

  // Slot s's transfers: tested (or waited for), the arrived copies handed to the writer.
  void complete(std::size_t s, bool wait) {
    if constexpr (detail::point_to_point_async<Comm>) {
      if (peer_) {
        if (wait) {
          comm_->wait(own_.request[s]);
          comm_->wait(own_.crc_request[s]);
        } else {
          (void)comm_->test(own_.request[s]);
          (void)comm_->test(own_.crc_request[s]);
        }
      }
      for (holder& h : held_) {
        if (!h.pending[s])
          continue;
        if (wait) {
          comm_->wait(h.request[s]);
          comm_->wait(h.crc_request[s]);
        } else if (!comm_->test(h.request[s]) || !comm_->test(h.crc_request[s])) {
          continue;
        }
        h.pending[s] = false;
        enqueue(&h, s);
      }
    } else {
      (void)s, (void)wait;
    }
  }

  void enqueue(holder* h, std::size_t s) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back({h, s, {}});
    }
    cv_.notify_all();
  }

  void wait_written(std::size_t s) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] {
      return std::ranges::none_of(queue_, [&](const queued& j) { return j.slot == s; }) &&
             !(busy_ && busy_slot_ == s);
    });
  }

  void rethrow() {
    std::lock_guard<std::mutex> l(mu_);
    if (!error_.empty())
      throw config_error(o_.dir.string(), "the RAM tier's writer failed: " + error_,
                         "free memory in the RAM tier's file system or give another --ram-dir");
  }

  // The writer thread: checksums a slot and writes its record.
  void write_loop() {
#if defined(__linux__)
    // A batch thread: woken by a save, it does not preempt the training thread that woke it
    // (with no core to spare, it would take the core at once: the save's whole copy became
    // training's wait); it runs beside training, or when training waits for it.
    const sched_param batch{};
    (void)::sched_setscheduler(0, SCHED_BATCH, &batch);
#endif
    for (;;) {
      queued j;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return quit_ || !queue_.empty(); });
        if (queue_.empty())
          return;
        j = queue_.front();
        queue_.pop_front();
        busy_ = true;
        busy_slot_ = j.slot;
      }
      try {
        if (!j.from.empty()) { // this rank's state into its slot, then training may go on
          copy_checksummed(*j.h, j.slot, j.from);
          {
            std::lock_guard<std::mutex> l(mu_);
            copied_ = true;
          }
          cv_.notify_all();
        }
        record(*j.h, j.slot);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu_);
        if (error_.empty())
          error_ = e.what();
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        busy_ = false;
      }
      cv_.notify_all();
    }
  }

  void record(const holder& h, std::size_t s) const {
    nlohmann::ordered_json r;
    r["format"] = "hspmd-ram";
    r["version"] = 1;
    r["job"] = o_.job;
    r["step"] = h.step[s];
    r["rank"] = h.rank;
    r["ranks"] = o_.nodes.size();
    r["node"] = o_.nodes[me_];
    r["copy"] = h.rank == me_ ? "own" : "peer";
    r["file"] = detail::ram_slot_name(h.rank, s, "safetensors");
    r["block_bytes"] = block_bytes;
    r["dtype"] = io::safetensors_dtype(detail::checkpoint_dtype<T>());
    nlohmann::ordered_json pieces = nlohmann::ordered_json::array();
    std::size_t b = 0; // the slot's CRC-32s: computed by the copy, or received with a peer's
    for (const auto& rec : h.records) {
      nlohmann::ordered_json p = rec;
      nlohmann::json crcs = nlohmann::json::array();
      for (std::size_t k = block_count(rec.at("bytes").template get<std::size_t>()); k > 0; --k)
        crcs.push_back(detail::crc_hex(h.crcs[s].at(b++)));
      p["crc32"] = std::move(crcs);
      pieces.push_back(std::move(p));
    }
    r["pieces"] = std::move(pieces);
    r["meta"] = h.meta[s] ? *h.meta[s] : nlohmann::json::object();
    r["checksum"] = detail::manifest_checksum(r);
    detail::write_atomically(job_dir_ / detail::ram_slot_name(h.rank, s, "json"), r.dump(1));
  }

  static constexpr std::size_t block_bytes = std::size_t{1} << 20; // checkpoint_options'
  static constexpr std::size_t chunk_bytes = std::size_t{1} << 18; // copied, then checksummed

  [[nodiscard]] static std::size_t block_count(std::size_t bytes) {
    return (bytes + block_bytes - 1) / block_bytes;
  }

  // This rank's pieces into slot s, each 1 MiB block's CRC-32 taken a quarter at a time right
  // after its copy (from cache: one pass over memory, not two).
  void copy_checksummed(holder& h, std::size_t s,
                        std::span<const std::span<const std::byte>> from) {
    std::span<std::byte> slot = h.slots[s].bytes();
    std::size_t b = 0;
    for (std::size_t k = 0; k < from.size(); ++k) {
      std::byte* to = slot.data() + offsets_[k];
      const std::size_t n = from[k].size();
      for (std::size_t at = 0; at < n; at += block_bytes) {
        std::uint32_t crc = 0;
        for (std::size_t c = at; c < std::min(n, at + block_bytes); c += chunk_bytes) {
          const std::size_t len = std::min({chunk_bytes, n - c, at + block_bytes - c});
          std::memcpy(to + c, from[k].data() + c, len);
          crc = io::crc32(std::span<const std::byte>(to + c, len), crc);
        }
        h.crcs[s].at(b++) = crc;
      }
    }
  }

  struct queued {
    holder* h = nullptr;
    std::size_t slot = 0;
    std::vector<std::span<const std::byte>> from; // this rank's pieces to copy first
  };

  Comm* comm_;
  ram_options o_;
  std::size_t me_ = 0;
  std::vector<std::size_t> mine_;      // indices into the tensors: this rank's pieces
  std::vector<std::uint64_t> offsets_; // their places in the slot
  std::optional<int> peer_;            // who holds this rank's copies
  holder own_;
  std::vector<holder> held_; // the copies this rank holds for others
  std::filesystem::path node_dir_, job_dir_;
  ram_stats stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<queued> queue_;
  bool busy_ = false;
  std::size_t busy_slot_ = 0;
  bool quit_ = false;
  bool copied_ = true;                 // the last save's copy is done
  std::optional<std::size_t> copying_; // main thread: the slot being copied, not yet sent
  std::string error_;
  std::thread writer_;
};

} // namespace hspmd::train
