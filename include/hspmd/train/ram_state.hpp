#pragma once
// The RAM tier's names and places (train/ram_tier.hpp writes it): its options, each slot's file
// names, which rank holds whose copies; finding the newest complete state in it and making that
// a checkpoint directory the resharding loader reads (train/checkpoint.hpp).

#include <hspmd/core/error.hpp>
#include <hspmd/train/checkpoint_layout.hpp>
#include <hspmd/train/checkpoint_manifest.hpp>
#include <hspmd/train/namespace.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::train {

/// Where and how a run keeps its RAM tier.
struct ram_options {
  std::filesystem::path dir;       ///< the tier's root; a folder per node under it
  std::vector<std::string> nodes;  ///< every rank's node ("node-0"), the folder its slots go to
  bool peers = true;               ///< copy each rank's slots to a rank on the next node
  std::string job;                 ///< this launch and layout (the same on every rank)
  std::vector<std::string> retire; ///< older jobs' folders kept until this job saved 3 times
};

/// What the tier cost training: the time the main thread spent in saves.
struct ram_stats {
  std::size_t saves = 0;
  double blocked_seconds = 0.0;
  double max_blocked_seconds = 0.0;
  double transfer_seconds = 0.0; ///< of the blocked: waiting for earlier peer copies to arrive
  double copy_seconds = 0.0;     ///< of the blocked: before an update, the copy not done yet
  std::size_t bytes = 0;         ///< this rank's slot
  std::size_t peer_bytes = 0;    ///< the slots this rank holds for others
  std::size_t peers = 0;         ///< ranks whose copies this rank holds
  void add(const ram_stats& o) {
    saves += o.saves;
    blocked_seconds += o.blocked_seconds;
    max_blocked_seconds = std::max(max_blocked_seconds, o.max_blocked_seconds);
    transfer_seconds += o.transfer_seconds;
    copy_seconds += o.copy_seconds;
    bytes = std::max(bytes, o.bytes);
    peer_bytes = std::max(peer_bytes, o.peer_bytes);
    peers = std::max(peers, o.peers);
  }
};

namespace detail {

[[nodiscard]] inline std::string ram_slot_name(std::size_t rank, std::size_t slot,
                                               const char* ext) {
  char b[48];
  std::snprintf(b, sizeof b, "rank-%05zu.slot%zu.%s", rank, slot, ext);
  return b;
}

/// The rank on the next node (in the order nodes first appear) that holds rank `r`'s copies:
/// the one at r's place among its node's ranks, modulo the next node's count. Nothing with one
/// node.
[[nodiscard]] inline std::optional<std::size_t> ram_peer(const std::vector<std::string>& nodes,
                                                         std::size_t r) {
  std::vector<std::string> order;
  for (const std::string& n : nodes)
    if (std::ranges::find(order, n) == order.end())
      order.push_back(n);
  if (order.size() < 2)
    return std::nullopt;
  const auto at = static_cast<std::size_t>(std::ranges::find(order, nodes[r]) - order.begin());
  const std::string& next = order[(at + 1) % order.size()];
  std::size_t place = 0;
  for (std::size_t q = 0; q < r; ++q)
    place += nodes[q] == nodes[r] ? 1U : 0U;
  std::vector<std::size_t> there;
  for (std::size_t q = 0; q < nodes.size(); ++q)
    if (nodes[q] == next)
      there.push_back(q);
  return there[place % there.size()];
}

} // namespace detail

namespace detail {

// A communicator that sends and receives without blocking (the MPI one): peer copies need it.
template <class C>
concept point_to_point_async = requires(C& c, std::span<const std::byte> in,
                                        std::span<std::byte> out) {
  typename C::request;
  { c.start_send(in, 0, 0) } -> std::same_as<typename C::request>;
  { c.start_recv(out, 0, 0) } -> std::same_as<typename C::request>;
};
template <class C>
struct request_of {
  using type = int;
};
template <point_to_point_async C>
struct request_of<C> {
  using type = typename C::request;
};

} // namespace detail

/// One rank's slot of a complete state: its record and where its bytes are.
struct ram_slot_record {
  std::filesystem::path record; ///< rank-RRRRR.slotS.json
  std::filesystem::path file;   ///< its safetensors slot
  nlohmann::json content;       ///< the record, verified
};

/// The newest complete state of a RAM tier.
struct ram_state {
  std::string job;
  std::size_t step = 0;
  std::vector<ram_slot_record> ranks; ///< one per rank of the job that saved it
  /// "rank 2 from node-0's peer copy": the ranks whose own node's copy was not there.
  std::vector<std::string> from_peers;
};

namespace detail {
// A record of the RAM tier, or nothing when it is not one or does not verify (a slot being
// rewritten when the job ended leaves none; a damaged one is passed over).
[[nodiscard]] inline std::optional<nlohmann::json> read_ram_record(const std::filesystem::path& p) {
  try {
    std::ifstream in(p);
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::ordered_json om = nlohmann::ordered_json::parse(text.str());
    if (om.value("format", "") != "hspmd-ram" || !om.contains("checksum"))
      return std::nullopt;
    if (om["checksum"].get<std::string>() != manifest_checksum(om))
      return std::nullopt;
    return nlohmann::json::parse(text.str());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
} // namespace detail

/// The newest state of the RAM tier `dir` that every rank of its job recorded (in its own
/// node's folder or a peer's); nothing when there is none. `skipped`: the newer incomplete
/// states, one line each ("job J step 12: no record of rank 1").
[[nodiscard]] inline std::optional<ram_state>
find_ram_state(const std::filesystem::path& dir, std::vector<std::string>* skipped = nullptr) {
  namespace fs = std::filesystem;
  struct seen {
    std::size_t ranks = 0;
    std::map<std::size_t, ram_slot_record> own, peer;
  };
  std::map<std::pair<std::size_t, std::string>, seen> states; // (step, job)
  std::error_code ec;
  for (const auto& node : fs::directory_iterator(dir, ec)) {
    if (!node.is_directory() || node.path().filename().string().starts_with("."))
      continue;
    for (const auto& job : fs::directory_iterator(node.path(), ec)) {
      if (!job.is_directory())
        continue;
      for (const auto& f : fs::directory_iterator(job.path(), ec)) {
        if (f.path().extension() != ".json")
          continue;
        const auto r = detail::read_ram_record(f.path());
        if (!r)
          continue;
        seen& s = states[{r->at("step").get<std::size_t>(), r->at("job").get<std::string>()}];
        s.ranks = r->at("ranks").get<std::size_t>();
        const auto rank = r->at("rank").get<std::size_t>();
        ram_slot_record rec{f.path(), job.path() / r->at("file").get<std::string>(), *r};
        if (!fs::exists(rec.file))
          continue;
        (r->at("copy") == "own" ? s.own : s.peer)[rank] = std::move(rec);
      }
    }
  }
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    const seen& s = it->second;
    ram_state out;
    out.step = it->first.first;
    out.job = it->first.second;
    std::vector<std::size_t> missing;
    for (std::size_t r = 0; r < s.ranks; ++r) {
      if (const auto o = s.own.find(r); o != s.own.end())
        out.ranks.push_back(o->second);
      else if (const auto p = s.peer.find(r); p != s.peer.end()) {
        out.ranks.push_back(p->second);
        out.from_peers.push_back("rank " + std::to_string(r) + " from " +
                                 p->second.content.at("node").get<std::string>() + "'s peer copy");
      } else
        missing.push_back(r);
    }
    if (missing.empty() && s.ranks > 0)
      return out;
    if (skipped != nullptr) {
      std::string line =
          "RAM tier job " + out.job + " step " + std::to_string(out.step) + ": no record of rank";
      line += missing.size() > 1 ? "s" : "";
      for (std::size_t i = 0; i < missing.size(); ++i)
        line += (i > 0 ? ", " : " ") + std::to_string(missing[i]);
      skipped->push_back(line + " (neither its node's copy nor its peer's): passed over");
    }
  }
  return std::nullopt;
}

/// Makes `state` the checkpoint directory DIR/.resume/step-N: links to its slots and a manifest
/// listing their pieces (train/checkpoint.hpp's format, checksummed). Returns the directory.
[[nodiscard]] inline std::filesystem::path assemble_ram_checkpoint(const std::filesystem::path& dir,
                                                                   const ram_state& state) {
  namespace fs = std::filesystem;
  const fs::path out = dir / ".resume" / checkpoint_name(state.step);
  std::error_code ec;
  fs::remove_all(dir / ".resume", ec);
  fs::create_directories(out);
  nlohmann::ordered_json m;
  const nlohmann::json& first = state.ranks.front().content;
  m["format"] = "hspmd-checkpoint";
  m["version"] = 2;
  m["step"] = state.step;
  m["ranks"] = state.ranks.size();
  m["block_bytes"] = first.at("block_bytes");
  m["dtype"] = first.at("dtype");
  m["meta"] = first.at("meta");
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (std::size_t r = 0; r < state.ranks.size(); ++r) {
    const std::string file = detail::rank_file(r);
    fs::create_symlink(fs::absolute(state.ranks[r].file), out / file);
    for (const auto& p : state.ranks[r].content.at("pieces")) {
      const std::string name = p.at("tensor").get<std::string>();
      if (!tensors.contains(name))
        tensors[name] = {{"shape", p.at("shape")}, {"pieces", nlohmann::json::array()}};
      tensors[name]["pieces"].push_back({{"file", file},
                                         {"offset", p.at("offset")},
                                         {"length", p.at("length")},
                                         {"data_offset", p.at("data_offset")},
                                         {"bytes", p.at("bytes")},
                                         {"crc32", p.at("crc32")}});
    }
  }
  m["tensors"] = std::move(tensors);
  m["checksum"] = detail::manifest_checksum(m);
  detail::write_atomically(out / "manifest.json", m.dump(1));
  return out;
}

} // namespace hspmd::train
