#pragma once
// Finding a checkpoint and trusting its manifest (docs/checkpoint.md): `search_checkpoints`
// picks the checkpoint a path names (a checkpoint directory, a root's `latest`, else its newest
// committed `step-N`) and names every newer folder it passed over; `read_manifest` reads a
// checkpoint's manifest.json and verifies it -- its own checksum (version 2) and its fields
// against each other and the folder's name. Not collective (train/checkpoint.hpp's load has rank
// 0 search and every rank read).

#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/train/checkpoint_layout.hpp>
#include <hspmd/train/namespace.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace hspmd::train {

namespace detail {
/// A manifest's own checksum: FNV-1a 64 of its text as written (one-space indent, its fields in
/// order) without the "checksum" field, so any edit of a value shows, a re-indent does not.
[[nodiscard]] inline std::string manifest_checksum(nlohmann::ordered_json m) {
  m.erase("checksum");
  return "fnv1a64:" + to_hex(fnv1a64(m.dump(1)));
}

// The manifest's fields that must agree with each other and with its folder; "" when they do.
[[nodiscard]] inline std::string manifest_disagreement(const nlohmann::json& m,
                                                       const std::filesystem::path& dir) {
  const auto step = m.at("step").get<std::size_t>();
  const auto said = [](std::string_view field, std::size_t have, std::string_view other,
                       std::size_t want) {
    return "field " + std::string(field) + " is " + std::to_string(have) + ", but " +
           std::string(other) + " makes it " + std::to_string(want);
  };
  if (const auto s = step_of(dir); s && *s != step)
    return said("step", step, "the folder's name " + dir.filename().string(), *s);
  const nlohmann::json meta = m.value("meta", nlohmann::json::object());
  if (meta.contains("schedule") && meta["schedule"].contains("next_step") &&
      meta["schedule"]["next_step"].get<std::size_t>() != step)
    return said("meta.schedule.next_step", meta["schedule"]["next_step"].get<std::size_t>(), "step",
                step);
  if (meta.contains("data") && meta["data"].contains("next_micro_batch") &&
      meta["data"].contains("accumulate")) {
    const auto next = meta["data"]["next_micro_batch"].get<std::size_t>();
    const auto want = step * meta["data"]["accumulate"].get<std::size_t>();
    if (next != want)
      return said("meta.data.next_micro_batch", next, "step x meta.data.accumulate", want);
  }
  if (meta.contains("schedule") && meta.contains("optimizer") &&
      meta["optimizer"].contains("steps")) { // a trained checkpoint: the optimizer stepped
    const std::size_t skipped =
        meta.contains("loss_scale") ? meta["loss_scale"].value("skipped", std::size_t{0}) : 0;
    const auto steps = meta["optimizer"]["steps"].get<std::size_t>();
    if (skipped > step || steps != step - skipped)
      return said("meta.optimizer.steps", steps, "step less f16's skipped steps",
                  skipped > step ? 0 : step - skipped);
  }
  return {};
}
} // namespace detail

/// The manifest of checkpoint directory `dir`, verified: its checksum (version 2) and its fields
/// against each other and the folder's name. A version-1 manifest (written before checksums)
/// loads with a line added to `notes`. Throws one line naming the file and the field.
[[nodiscard]] inline nlohmann::json read_manifest(const std::filesystem::path& dir,
                                                  std::vector<std::string>* notes = nullptr) {
  const std::filesystem::path path = dir / "manifest.json";
  const std::string file = path.string();
  std::string text;
  {
    std::ifstream f(path, std::ios::binary);
    if (!f)
      throw config_error(file, "cannot be read", "restore it, or load an earlier checkpoint");
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  nlohmann::ordered_json om;
  try {
    om = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw config_error(file, std::string("is not valid JSON: ") + e.what(),
                       "restore it, or load an earlier checkpoint");
  }
  const int version = om.is_object() ? om.value("version", 0) : 0;
  if (!om.is_object() || om.value("format", "") != "hspmd-checkpoint" ||
      (version != 1 && version != 2))
    throw config_error(file, "is not an hspmd checkpoint manifest of version 1 or 2",
                       "give a directory hspmd saved");
  if (version == 2) {
    if (!om.contains("checksum") || !om["checksum"].is_string())
      throw config_error(file + ": field checksum", "is missing",
                         "restore the manifest, or load an earlier checkpoint");
    const std::string want = detail::manifest_checksum(om);
    if (om["checksum"].get<std::string>() != want)
      throw config_error(file + ": field checksum",
                         "does not match the manifest's fields (" +
                             om["checksum"].get<std::string>() + ", the fields give " + want +
                             "): the manifest was edited or damaged",
                         "restore it, or load an earlier checkpoint");
  } else if (notes != nullptr)
    notes->push_back(file + ": written before manifests had checksums (version 1): not verified");
  nlohmann::json m = nlohmann::json::parse(text);
  try {
    if (const std::string why = detail::manifest_disagreement(m, dir); !why.empty())
      throw config_error(file, why, "restore it, or load an earlier checkpoint");
  } catch (const nlohmann::json::exception& e) {
    throw config_error(file, std::string("has a field of the wrong type: ") + e.what(),
                       "restore it, or load an earlier checkpoint");
  }
  return m;
}

/// Where a checkpoint search ended, and what it passed over: one line for each step directory
/// newer than the one found (no manifest: a save that did not commit, or a damaged folder; a
/// manifest: a save that ended before it updated `latest`) and for each `.partial` save.
struct checkpoint_search {
  std::optional<std::filesystem::path> found;
  std::vector<std::string> skipped;
};

/// The checkpoint `path` names: a checkpoint directory itself (it has manifest.json), or a root
/// whose `latest` names one, or else the root's newest committed checkpoint; nothing when there
/// is none. Not collective.
[[nodiscard]] inline checkpoint_search search_checkpoints(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  checkpoint_search r;
  if (fs::exists(path / "manifest.json")) {
    r.found = path;
    return r;
  }
  std::string latest_name;
  if (std::ifstream latest(path / "latest"); latest) {
    std::getline(latest, latest_name);
    if (detail::step_of(fs::path(latest_name)) && fs::exists(path / latest_name / "manifest.json"))
      r.found = path / latest_name;
  }
  if (!r.found)
    if (const auto all = detail::committed(path); !all.empty())
      r.found = all.back().second;
  const std::size_t found_step = r.found ? detail::step_of(*r.found).value_or(0) : std::size_t{0};
  std::vector<std::pair<std::size_t, std::string>> notes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (!e.is_directory(ec))
      continue;
    const fs::path p = e.path();
    if (p.extension() == ".partial") {
      if (const auto s = detail::step_of(p.stem()))
        notes.emplace_back(*s, p.string() + ": a save that did not commit (ignored; the next "
                                            "save removes it)");
    } else if (const auto s = detail::step_of(p); s && (*s > found_step || !r.found)) {
      if (fs::exists(p / "manifest.json"))
        notes.emplace_back(*s, p.string() + ": committed, but latest names an older step (a save "
                                            "ended before it updated latest): not used");
      else
        notes.emplace_back(
            *s, p.string() + ": no manifest.json, not a committed checkpoint" +
                    (p.filename() == latest_name ? " (though latest names it)" : "") + ": skipped");
    }
  }
  std::sort(notes.begin(), notes.end());
  for (auto& [step, text] : notes)
    r.skipped.push_back(std::move(text));
  return r;
}

/// search_checkpoints' find, without the notes.
[[nodiscard]] inline std::optional<std::filesystem::path>
find_checkpoint(const std::filesystem::path& path) {
  return search_checkpoints(path).found;
}

} // namespace hspmd::train
