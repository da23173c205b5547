#pragma once
// Sharded checkpoints (docs/checkpoint.md has the format, readable without hspmd).
//
// A checkpoint is a directory ROOT/step-NNNNNNNN holding one safetensors file per rank
// (rank-RRRRR.safetensors, that rank's pieces) and manifest.json: for every tensor its global
// shape and dtype and every stored piece as a box (global offset and length per dimension) in
// which file at which byte offset, with a CRC-32 per block of the piece's bytes; plus the step
// and what the caller keeps (optimizer, schedule, hashes, ...). A piece held by several ranks
// (a replica) is written once, by the holder with the fewest bytes assigned so far.
//
// Commit (save_checkpoint, collective): the ranks write into ROOT/step-N.partial and fsync;
// then rank 0 writes manifest.json under a temporary name, fsyncs and renames it, renames the
// directory to ROOT/step-N, and replaces ROOT/latest (the name of the newest checkpoint) by
// rename. A directory without a committed manifest is never loaded; stale .partial directories
// are removed by the next save. With `keep` > 0 only the newest `keep` checkpoints stay.
//
// Load (load_checkpoint, collective): each rank reads only the parts of the pieces that meet the
// boxes its own layout gives it, verifying every block it reads, so a checkpoint saved under any
// rank count, ratios or plan loads into any other without a rank holding a tensor it does not
// hold. Every problem (a missing, truncated or damaged file, a tensor missing or of another
// shape) ends the load on every rank with one line naming the file and tensor.
//
// The ROOT is shared by the ranks (one machine, or a shared file system). Finding the checkpoint
// a path names and verifying its manifest: train/checkpoint_manifest.hpp.

#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/exec/reshard.hpp>
#include <hspmd/io/crc32.hpp>
#include <hspmd/io/safetensors.hpp>
#include <hspmd/train/checkpoint_layout.hpp>
#include <hspmd/train/checkpoint_manifest.hpp>
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
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::train {

/// The state of a run on this rank: every parameter of `ex` and `opt`'s slots of it (allocated,
/// zeroed, where the optimizer has not stepped yet). `prog`: the rank's lowering of `g` in a
/// distributed run (its parameters are `ex`'s), or nullptr for a single process (whole tensors).
/// Host tensors only.
template <std::floating_point T, class Optimizer, class Executor>
[[nodiscard]] std::vector<training_tensor<T>> training_tensors(const graph::graph& g,
                                                               const program::local_program* prog,
                                                               Executor& ex, Optimizer& opt) {
  const auto params = ex.graph().parameters();
  std::vector<std::size_t> stored;
  if (prog != nullptr)
    stored = stored_parameters(*prog);
  std::vector<training_tensor<T>> out;
  for (std::size_t j = 0; j < params.size(); ++j) {
    training_tensor<T> t;
    if (prog != nullptr) {
      t.name = g[prog->global[params[j]]].name;
      t.shape = prog->layouts.at(params[j]).global;
      t.boxes = boxes_of(*prog, params[j]);
      t.stored = std::ranges::find(stored, j) != stored.end();
    } else {
      t.name = g[params[j]].name;
      t.shape = g[params[j]].out.dims;
      t.boxes = {box::whole(t.shape)};
    }
    t.data = ex.value(params[j]);
    out.push_back(std::move(t));
  }
  if constexpr (requires { opt.state(); }) {
    auto& slots = opt.state().template of<T, typename Executor::backend_type>();
    const std::size_t n = out.size();
    for (std::size_t j = 0; j < n; ++j)
      slots.fit(ex.backend(), n, j, out[j].data.size(), Optimizer::state_slots > 1);
    for (std::size_t k = 0; k < Optimizer::state_slots; ++k)
      for (std::size_t j = 0; j < n; ++j) {
        training_tensor<T> t = out[j];
        t.name = "optimizer." + std::string(Optimizer::state_names[k]) + "." + out[j].name;
        t.optimizer = true;
        auto& buf = k == 0 ? slots.a[j] : slots.b[j];
        t.data = std::span<T>(buf.data(), buf.size());
        out.push_back(std::move(t));
      }
  }
  return out;
}

namespace detail {
/// The pieces (indices into `pieces`) rank `me` of `n` writes: every rank assigns every piece
/// the same way; each group of ranks holding the same box (a replica) writes it once, by the
/// member with the fewest bytes assigned so far, so replicated state is spread over the files.
template <std::floating_point T>
[[nodiscard]] std::vector<std::size_t>
pieces_written_by(std::span<const checkpoint_piece<T>> pieces, std::size_t n, std::size_t me) {
  std::vector<std::size_t> out;
  std::vector<std::size_t> assigned(n, 0);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const checkpoint_piece<T>& p = pieces[i];
    if (p.boxes.size() != n || p.data.size() != p.boxes.at(me).size())
      throw config_error("checkpoint tensor " + p.name,
                         "boxes for " + std::to_string(p.boxes.size()) + " ranks and " +
                             std::to_string(p.data.size()) + " elements here",
                         "one box per rank, and this rank's elements of its box");
    std::optional<std::size_t> mine;
    std::vector<bool> done(n, false);
    for (std::size_t r = 0; r < n; ++r) {
      if (done[r] || p.boxes[r].empty())
        continue;
      std::size_t writer = r;
      for (std::size_t q = r; q < n; ++q)
        if (p.boxes[q] == p.boxes[r]) {
          done[q] = true;
          if (assigned[q] < assigned[writer])
            writer = q;
        }
      assigned[writer] += p.boxes[r].size();
      if (p.boxes[r] == p.boxes[me])
        mine = writer;
    }
    if (mine == me)
      out.push_back(i);
  }
  return out;
}
} // namespace detail

/// Saves `tensors` (training_tensors) as checkpoint `step` under `root`. Collective.
template <std::floating_point T, class Comm>
std::filesystem::path save_training(Comm& comm, const std::filesystem::path& root, std::size_t step,
                                    std::span<const training_tensor<T>> tensors,
                                    const nlohmann::json& meta, const checkpoint_options& opt) {
  std::vector<checkpoint_piece<T>> pieces;
  for (const training_tensor<T>& t : tensors)
    if (t.stored)
      pieces.push_back({t.name, t.shape, t.boxes, std::span<const T>(t.data)});
  return save_checkpoint<T>(comm, root, step, std::span<const checkpoint_piece<T>>(pieces), meta,
                            opt);
}

/// Loads every one of `tensors` (every version of every parameter) from the checkpoint `path`
/// names; with `parameters_only` the optimizer's slots are left as they are. Collective.
template <std::floating_point T, class Comm>
checkpoint_info load_training(Comm& comm, const std::filesystem::path& path,
                              std::span<const training_tensor<T>> tensors,
                              bool parameters_only = false) {
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<checkpoint_target<T>> targets;
  for (const training_tensor<T>& t : tensors)
    if (!parameters_only || !t.optimizer)
      targets.push_back({t.name, t.shape, t.boxes.at(me), t.data});
  return load_checkpoint<T>(comm, path, std::span<const checkpoint_target<T>>(targets));
}

/// Saves this rank's pieces as checkpoint `step` under `root` (see the file comment); `meta` is
/// kept in the manifest. Collective; returns the committed directory on every rank.
template <std::floating_point T, class Comm>
std::filesystem::path save_checkpoint(Comm& comm, const std::filesystem::path& root,
                                      std::size_t step, std::span<const checkpoint_piece<T>> pieces,
                                      const nlohmann::json& meta = nlohmann::json::object(),
                                      const checkpoint_options& opt = {}) {
  namespace fs = std::filesystem;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::string name = checkpoint_name(step);
  const fs::path partial = root / (name + ".partial");
  const fs::path final_dir = root / name;
  std::string error;
  if (me == 0) {
    try {
      fs::create_directories(root);
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(root)) // earlier saves that never committed
        if (e.path().extension() == ".partial")
          fs::remove_all(e.path(), ec);
      fs::create_directory(partial);
    } catch (const std::exception& e) {
      error = root.string() + ": cannot prepare the checkpoint directory: " + e.what();
    }
  }
  detail::agree_on_error(comm, error);

  // This rank's file: the pieces it writes (detail::pieces_written_by).
  nlohmann::json records = nlohmann::json::array();
  try {
    std::vector<io::safetensors_tensor> tensors;
    std::vector<const checkpoint_piece<T>*> written;
    for (const std::size_t i : detail::pieces_written_by(pieces, n, me)) {
      const checkpoint_piece<T>& p = pieces[i];
      tensors.push_back(
          {p.name, detail::checkpoint_dtype<T>(), p.boxes[me].length, std::as_bytes(p.data)});
      written.push_back(&p);
    }
    const std::string file = detail::rank_file(me);
    // The checksums are computed while the disk flushes the file.
    std::vector<nlohmann::json> crcs(written.size(), nlohmann::json::array());
    const auto unflushed = [&] {
      if (opt.at_point)
        opt.at_point("shards");
      for (std::size_t i = 0; i < written.size(); ++i) {
        const auto bytes = std::as_bytes(written[i]->data);
        for (std::size_t at = 0; at < bytes.size(); at += opt.block_bytes)
          crcs[i].push_back(detail::crc_hex(
              io::crc32(bytes.subspan(at, std::min(opt.block_bytes, bytes.size() - at)))));
      }
    };
    const auto offsets = io::write_safetensors(
        partial / file, tensors, {{"format", "hspmd-checkpoint"}, {"rank", std::to_string(me)}},
        unflushed);
    if (opt.at_point)
      opt.at_point("written");
    for (std::size_t i = 0; i < written.size(); ++i) {
      const checkpoint_piece<T>& p = *written[i];
      const auto bytes = std::as_bytes(p.data);
      records.push_back({{"tensor", p.name},
                         {"shape", p.shape},
                         {"file", file},
                         {"offset", p.boxes[me].offset},
                         {"length", p.boxes[me].length},
                         {"data_offset", offsets[i]},
                         {"bytes", bytes.size()},
                         {"crc32", std::move(crcs[i])}});
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree_on_error(comm, error);
  const auto all = detail::all_gather_text(comm, records.dump());

  if (me == 0) {
    try {
      nlohmann::ordered_json m;
      m["format"] = "hspmd-checkpoint";
      m["version"] = 2;
      m["step"] = step;
      m["ranks"] = n;
      m["block_bytes"] = opt.block_bytes;
      m["dtype"] = io::safetensors_dtype(detail::checkpoint_dtype<T>());
      m["meta"] = meta;
      nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
      for (const checkpoint_piece<T>& p : pieces)
        tensors[p.name] = {{"shape", p.shape}, {"pieces", nlohmann::json::array()}};
      for (const std::string& text : all)
        for (auto& rec : nlohmann::ordered_json::parse(text)) {
          const std::string t = rec["tensor"].get<std::string>();
          rec.erase("tensor");
          rec.erase("shape");
          tensors[t]["pieces"].push_back(std::move(rec));
        }
      m["tensors"] = std::move(tensors);
      m["checksum"] = detail::manifest_checksum(m);
      std::function<void()> unrenamed;
      if (opt.at_point)
        unrenamed = [&] { opt.at_point("manifest"); };
      detail::write_atomically(partial / "manifest.json", m.dump(1), unrenamed);
      std::error_code ec;
      fs::remove_all(final_dir, ec); // a checkpoint of the same step saved before
      fs::rename(partial, final_dir);
      detail::fsync_dir(root);
      if (opt.at_point)
        opt.at_point("latest");
      detail::write_atomically(root / "latest", name + "\n");
      if (opt.keep > 0) {
        const auto have = detail::committed(root);
        for (std::size_t i = 0; i + opt.keep < have.size(); ++i)
          if (have[i].second != final_dir)
            fs::remove_all(have[i].second, ec);
      }
    } catch (const std::exception& e) {
      error = final_dir.string() + ": cannot commit the checkpoint: " + e.what();
    }
  }
  detail::agree_on_error(comm, error);
  return final_dir;
}

/// Loads every target from the checkpoint `path` names (find_checkpoint: a checkpoint directory,
/// or a root's latest), converting float and double as needed. Collective; every rank returns
/// the same info, or every rank throws.
template <std::floating_point T, class Comm>
checkpoint_info load_checkpoint(Comm& comm, const std::filesystem::path& path,
                                std::span<const checkpoint_target<T>> targets) {
  namespace fs = std::filesystem;
  const auto me = static_cast<std::size_t>(comm.rank());
  // Rank 0 picks the checkpoint, so every rank loads the same one (and names what it skipped).
  std::string chosen;
  std::string error;
  if (me == 0) {
    const checkpoint_search found = search_checkpoints(path);
    if (found.found) {
      chosen = found.found->string();
      for (const std::string& line : found.skipped)
        chosen += "\n" + line;
    } else
      error = path.string() + ": no committed checkpoint (no manifest.json, no latest, no "
                              "step-N directory with a manifest): give a checkpoint directory "
                              "or the root a run saved into";
  }
  detail::agree_on_error(comm, error);
  chosen = detail::all_gather_text(comm, chosen).front();

  checkpoint_info info;
  {
    std::istringstream lines(chosen);
    std::string line;
    std::getline(lines, line);
    info.dir = line;
    while (std::getline(lines, line))
      info.notes.push_back(line);
  }
  try {
    const fs::path manifest_path = info.dir / "manifest.json";
    const nlohmann::json m = read_manifest(info.dir, &info.notes);
    info.step = m.at("step").get<std::size_t>();
    info.meta = m.value("meta", nlohmann::json::object());
    const auto stored = io::parse_safetensors_dtype(m.value("dtype", "F32"));
    if (stored != dtype::f32 && stored != dtype::f64)
      throw config_error(manifest_path.string() + ": field dtype", "is not F32 or F64",
                         "give a checkpoint of float or double tensors");
    const std::size_t block = m.at("block_bytes").get<std::size_t>();
    const auto& tensors = m.at("tensors");
    std::map<std::string, io::safetensors_header> headers;
    std::vector<std::byte> raw; // reused: fresh pages cost as much as the copy
    std::vector<T> values;
    for (const checkpoint_target<T>& t : targets) {
      const nlohmann::json::const_iterator it = tensors.find(t.name);
      if (it == tensors.end())
        throw config_error(manifest_path.string() + ": tensor " + t.name,
                           "missing: the model has it, the checkpoint does not",
                           "load a checkpoint of this model");
      const auto shape = detail::json_sizes(it->at("shape"));
      if (shape != t.shape) {
        const auto text = [](const std::vector<std::size_t>& v) {
          std::string s = "[";
          for (std::size_t i = 0; i < v.size(); ++i)
            s += (i > 0 ? ", " : "") + std::to_string(v[i]);
          return s + "]";
        };
        throw config_error(manifest_path.string() + ": tensor " + t.name,
                           "has shape " + text(shape) + " in the checkpoint but " + text(t.shape) +
                               " in the model",
                           "load a checkpoint of this model's configuration");
      }
      if (t.out.size() != t.mine.size())
        throw config_error("checkpoint tensor " + t.name, "the target's span and box differ",
                           "pass mine.size() elements");
      std::size_t covered = 0;
      for (const nlohmann::json& piece : it->at("pieces")) {
        const box pb{detail::json_sizes(piece.at("offset")),
                     detail::json_sizes(piece.at("length"))};
        const box part = intersect(pb, t.mine);
        if (part.empty())
          continue;
        covered += part.size();
        const fs::path file = info.dir / piece.at("file").get<std::string>();
        if (!fs::exists(file))
          throw config_error(file.string(),
                             "missing: it holds part of tensor " + t.name +
                                 " and the manifest lists it",
                             "restore it, or load an earlier checkpoint");
        auto h = headers.find(file.string());
        if (h == headers.end())
          h = headers.emplace(file.string(), io::read_safetensors_header(file)).first;
        const std::uint64_t at = piece.at("data_offset").get<std::uint64_t>();
        const std::uint64_t bytes = piece.at("bytes").get<std::uint64_t>();
        const auto e = h->second.tensors.find(t.name);
        if (e == h->second.tensors.end() || e->second.begin != at || e->second.bytes != bytes ||
            e->second.shape != pb.length || e->second.type != *stored)
          throw config_error(file.string() + ": tensor " + t.name,
                             "does not match the manifest's piece " + pb.to_string(),
                             "restore the file, or load an earlier checkpoint");
        const std::size_t es = size_of(*stored);
        const nlohmann::json& crcs = piece.at("crc32");
        const auto verify = [&](std::span<const std::byte> got, std::uint64_t from) {
          for (std::uint64_t k = 0; k < got.size(); k += block) {
            const std::size_t len =
                static_cast<std::size_t>(std::min<std::uint64_t>(block, got.size() - k));
            const std::string want =
                crcs.at(static_cast<std::size_t>((from + k) / block)).get<std::string>();
            const std::string crc = detail::crc_hex(io::crc32(got.subspan(k, len)));
            if (crc != want)
              throw config_error(file.string() + ": tensor " + t.name,
                                 "bytes " + std::to_string(from + k) + ".." +
                                     std::to_string(from + k + len) +
                                     " of its piece fail their checksum (crc32 " + crc +
                                     ", the manifest says " + want + ")",
                                 "the file is damaged: restore it, or load an earlier checkpoint");
          }
        };
        // The whole piece in this rank's box, contiguous there (the same layout, a replica, or
        // a piece of a finer split along the first dimension), in T: read straight into place.
        bool contiguous = part == pb && *stored == detail::checkpoint_dtype<T>();
        for (std::size_t d = 1; contiguous && d < pb.length.size(); ++d)
          contiguous = pb.offset[d] == t.mine.offset[d] && pb.length[d] == t.mine.length[d];
        if (contiguous) {
          std::size_t at_elem = 0;
          if (!pb.length.empty())
            at_elem = (pb.offset[0] - t.mine.offset[0]) * (t.mine.size() / t.mine.length[0]);
          const auto dst = std::as_writable_bytes(t.out.subspan(at_elem, pb.size()));
          io::read_file_range(file, at, dst);
          verify(dst, 0);
          continue;
        }
        // The rows along the first dimension that hold the part, widened to whole blocks.
        box rows = pb;
        std::uint64_t first = 0;
        std::uint64_t count = bytes;
        if (!pb.length.empty()) {
          const std::uint64_t row = bytes / std::max<std::size_t>(pb.length[0], 1);
          rows.offset[0] = part.offset[0];
          rows.length[0] = part.length[0];
          first = (part.offset[0] - pb.offset[0]) * row;
          count = part.length[0] * row;
        }
        const std::uint64_t b0 = first / block * block;
        const std::uint64_t b1 =
            std::min<std::uint64_t>(bytes, (first + count + block - 1) / block * block);
        raw.resize(static_cast<std::size_t>(b1 - b0));
        io::read_file_range(file, at + b0, raw);
        verify(raw, b0);
        // To T, then the part into this rank's box.
        values.resize(static_cast<std::size_t>(count / es));
        const std::byte* src = raw.data() + (first - b0);
        if (*stored == dtype::f64) {
          for (std::size_t i = 0; i < values.size(); ++i) {
            double v = 0.0;
            std::memcpy(&v, src + i * 8, 8);
            values[i] = static_cast<T>(v);
          }
        } else {
          for (std::size_t i = 0; i < values.size(); ++i) {
            float v = 0.0F;
            std::memcpy(&v, src + i * 4, 4);
            values[i] = static_cast<T>(v);
          }
        }
        copy_box(values.data(), rows, t.out.data(), t.mine, part);
      }
      if (covered != t.mine.size())
        throw config_error(manifest_path.string() + ": tensor " + t.name,
                           "its pieces hold " + std::to_string(covered) + " of the " +
                               std::to_string(t.mine.size()) + " elements of " +
                               t.mine.to_string() + " that rank " + std::to_string(me) + " needs",
                           "restore the checkpoint: pieces are missing from its manifest");
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree_on_error(comm, error);
  return info;
}

} // namespace hspmd::train
