// hspmd-checkpoint: look into a checkpoint, export it as Hugging Face-style safetensors files, or
// import such files (docs/checkpoint.md).
//   hspmd-checkpoint inspect ckpt [--verify]
//   hspmd-checkpoint export ckpt --out model-dir [--shards N] [--optimizer]
//   hspmd-checkpoint import hf-files --names gpt2|llama|vit --out ckpt [--seq N] [--heads N]
#include <hspmd/io/cli.hpp>
#include <hspmd/io/safetensors.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/import.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using hspmd::config_error;

struct manifest {
  fs::path dir;
  nlohmann::json j;
};

// The checkpoint `path` names, its manifest verified (checksum, fields); notes printed.
manifest open_checkpoint(const std::string& path) {
  const auto found = hspmd::train::search_checkpoints(path);
  for (const std::string& line : found.skipped)
    std::printf("note: %s\n", line.c_str());
  const auto& dir = found.found;
  if (!dir)
    throw config_error(path, "holds no committed checkpoint",
                       "give a checkpoint directory (step-N) or the directory a run saved into");
  std::vector<std::string> notes;
  manifest m{*dir, hspmd::train::read_manifest(*dir, &notes)};
  for (const std::string& line : notes)
    std::printf("note: %s\n", line.c_str());
  return m;
}

std::string shape_text(const nlohmann::json& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i > 0 ? ", " : "") + std::to_string(shape[i].get<std::size_t>());
  return s + "]";
}

std::string box_text(const nlohmann::json& piece) {
  std::string s = "[";
  for (std::size_t d = 0; d < piece["offset"].size(); ++d) {
    const auto o = piece["offset"][d].get<std::size_t>();
    s += (d > 0 ? ", " : "") + std::to_string(o) + ":" +
         std::to_string(o + piece["length"][d].get<std::size_t>());
  }
  return s + "]";
}

// Every tensor of the checkpoint, whole, in its element type T (the load verifies every block).
template <class T>
std::vector<T> whole_tensor(const manifest& m, const std::string& name) {
  std::vector<std::size_t> shape;
  for (const auto& d : m.j["tensors"][name]["shape"])
    shape.push_back(d.get<std::size_t>());
  const hspmd::exec::box all = hspmd::exec::box::whole(shape);
  std::vector<T> v(all.size());
  hspmd::train::solo_communicator solo;
  const std::vector<hspmd::train::checkpoint_target<T>> t = {{name, shape, all, std::span<T>(v)}};
  (void)hspmd::train::load_checkpoint<T>(solo, m.dir,
                                         std::span<const hspmd::train::checkpoint_target<T>>(t));
  return v;
}

int inspect(const std::string& path, bool verify) {
  const manifest m = open_checkpoint(path);
  const auto& j = m.j;
  std::printf("checkpoint %s: step %zu, saved by %zu rank(s), %s%s\n", m.dir.string().c_str(),
              j["step"].get<std::size_t>(), j["ranks"].get<std::size_t>(),
              j.value("dtype", std::string("F32")).c_str(),
              j.contains("checksum") ? ", manifest checksum matched" : "");
  const auto& meta = j.value("meta", nlohmann::json::object());
  if (meta.contains("model"))
    std::printf("model %s (graph hash %s)", meta["model"].value("name", std::string("?")).c_str(),
                meta["model"].value("hash", std::string("?")).c_str());
  if (meta.contains("plan"))
    std::printf("; plan %s", meta["plan"].value("strategy", std::string("?")).c_str());
  if (meta.contains("optimizer"))
    std::printf("; optimizer %s, %zu step(s)",
                meta["optimizer"].value("kind", std::string("?")).c_str(),
                meta["optimizer"].value("steps", std::size_t{0}));
  if (meta.contains("data"))
    std::printf("; next micro-batch %zu", meta["data"].value("next_micro_batch", std::size_t{0}));
  std::printf("\n%-48s %-18s %s\n", "tensor", "shape", "pieces (rank file: box)");
  std::size_t bytes = 0;
  for (const auto& [name, t] : j["tensors"].items()) {
    std::string pieces;
    for (const auto& p : t["pieces"]) {
      pieces += (pieces.empty() ? "" : ", ") + p["file"].get<std::string>().substr(5, 5) + ": " +
                box_text(p);
      bytes += p["bytes"].get<std::size_t>();
    }
    std::printf("%-48s %-18s %s\n", name.c_str(), shape_text(t["shape"]).c_str(), pieces.c_str());
  }
  std::printf("%zu tensors, %.2f MiB stored\n", j["tensors"].size(),
              static_cast<double>(bytes) / 1048576.0);
  if (verify) {
    const bool f64 = j.value("dtype", std::string("F32")) == "F64";
    for (const auto& [name, t] : j["tensors"].items())
      (void)(f64 ? whole_tensor<double>(m, name).size() : whole_tensor<float>(m, name).size());
    std::printf("verified: every piece read and every checksum block matched\n");
  }
  return 0;
}

int export_files(const std::string& path, const std::string& out, std::size_t shards,
                 bool optimizer) {
  const manifest m = open_checkpoint(path);
  const bool f64 = m.j.value("dtype", std::string("F32")) == "F64";
  std::vector<std::string> names;
  for (const auto& [name, t] : m.j["tensors"].items())
    if (optimizer || name.rfind("optimizer.", 0) != 0)
      names.push_back(name);
  if (names.empty())
    throw config_error(m.dir.string(), "holds no tensors to export",
                       "give a checkpoint hspmd saved");
  shards = std::clamp<std::size_t>(shards, 1, names.size());
  fs::create_directories(out);
  nlohmann::ordered_json index;
  std::size_t total = 0;
  for (std::size_t s = 0; s < shards; ++s) {
    char file[64];
    if (shards == 1)
      std::snprintf(file, sizeof file, "model.safetensors");
    else
      std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards);
    // Tensor k goes to shard k * shards / count: contiguous runs of about equal count.
    std::vector<std::vector<float>> f32;
    std::vector<std::vector<double>> f64v;
    std::vector<hspmd::io::safetensors_tensor> ts;
    std::vector<std::string> here;
    for (std::size_t k = 0; k < names.size(); ++k)
      if (k * shards / names.size() == s)
        here.push_back(names[k]);
    f32.reserve(here.size());
    f64v.reserve(here.size());
    for (const std::string& name : here) {
      std::vector<std::size_t> shape;
      for (const auto& d : m.j["tensors"][name]["shape"])
        shape.push_back(d.get<std::size_t>());
      std::span<const std::byte> bytes;
      if (f64) {
        f64v.push_back(whole_tensor<double>(m, name));
        bytes = std::as_bytes(std::span<const double>(f64v.back()));
      } else {
        f32.push_back(whole_tensor<float>(m, name));
        bytes = std::as_bytes(std::span<const float>(f32.back()));
      }
      ts.push_back({name, f64 ? hspmd::dtype::f64 : hspmd::dtype::f32, shape, bytes});
      index["weight_map"][name] = file;
      total += bytes.size();
    }
    (void)hspmd::io::write_safetensors(fs::path(out) / file, ts, {{"format", "pt"}});
    std::printf("wrote %s (%zu tensors)\n", (fs::path(out) / file).string().c_str(), ts.size());
  }
  if (shards > 1) {
    nlohmann::ordered_json j;
    j["metadata"] = {{"total_size", total}};
    j["weight_map"] = index["weight_map"];
    std::ofstream(fs::path(out) / "model.safetensors.index.json") << j.dump(2) << "\n";
    std::printf("wrote %s\n", (fs::path(out) / "model.safetensors.index.json").string().c_str());
  }
  return 0;
}

std::string listed(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < 8; ++i)
    s += (i > 0 ? ", " : "") + v[i];
  if (v.size() > 8)
    s += ", ... (" + std::to_string(v.size() - 8) + " more)";
  return s;
}

int import_files(const std::string& path, const std::string& names, const std::string& out,
                 const hspmd::train::import_options& o) {
  const auto& family = hspmd::train::import_family_named(names);
  const auto rep = hspmd::train::import_checkpoint(path, out, family, o);
  std::printf("imported %zu tensors (%zu layers) from %s as %s parameters: %s\n", rep.map.size(),
              rep.layers, path.c_str(), std::string(family.model).c_str(),
              rep.dir.string().c_str());
  if (!rep.ignored.empty())
    std::printf("left out (nothing %s keeps): %s\n", std::string(family.model).c_str(),
                listed(rep.ignored).c_str());
  if (!rep.unmatched.empty())
    std::printf("warning: no rule of the %s table names %zu tensor(s), left out: %s\n",
                names.c_str(), rep.unmatched.size(), listed(rep.unmatched).c_str());
  if (!rep.missing.empty())
    std::printf("warning: %zu %s parameter(s) filled by no source tensor (a run starts them "
                "fresh): %s\n",
                rep.missing.size(), std::string(family.model).c_str(), listed(rep.missing).c_str());
  if (rep.norm_eps > 0.0)
    std::printf("normalization epsilon %g (config.json's %s), recorded: a run from it uses it "
                "(--norm-eps)\n",
                rep.norm_eps, rep.norm_eps_field.c_str());
  std::printf("start a run from it with --init-from %s\n", out.c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"hspmd-checkpoint: inspect a checkpoint, export it as safetensors files, or "
               "import such files (docs/checkpoint.md)"};
  app.require_subcommand(1);
  std::string path;
  bool verify = false;
  auto* ins = app.add_subcommand("inspect", "tensors, shapes, every rank's boxes, the step");
  ins->add_option("checkpoint", path, "a checkpoint directory, or the directory a run saved into")
      ->required();
  ins->add_flag("--verify", verify, "read every piece and check every checksum block");
  std::string out;
  std::size_t shards = 1;
  bool optimizer = false;
  auto* exp = app.add_subcommand(
      "export",
      "whole tensors as model.safetensors, or N shards with model.safetensors.index.json");
  exp->add_option("checkpoint", path, "a checkpoint directory, or the directory a run saved into")
      ->required();
  exp->add_option("--out", out, "the directory to write")->required();
  exp->add_option("--shards", shards, "files to spread the tensors over")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{99999}));
  exp->add_flag("--optimizer", optimizer, "export the optimizer's state too");
  std::string names;
  hspmd::train::import_options io;
  auto* imp = app.add_subcommand(
      "import", "Hugging Face safetensors files as a checkpoint to start a run from (--init-from)");
  imp->add_option("source", path,
                  "a .safetensors file, a model.safetensors.index.json, or their directory")
      ->required();
  imp->add_option("--names", names, "the name table: gpt2 (for bert), llama, vit")->required();
  imp->add_option("--out", out, "the checkpoint directory to write")->required();
  imp->add_option("--seq", io.seq, "keep the first N rows of a position table (0: all)")
      ->capture_default_str();
  imp->add_option("--heads", io.heads,
                  "attention heads, for llama's rotary rows (0: from config.json)")
      ->capture_default_str();
  imp->add_flag("--partial", io.partial,
                "import what matches even when most source tensors or most of the model's "
                "parameters do not (refused otherwise: likely another family's files)");
  if (const auto rc = hspmd::io::parse_flags(app, argc, argv))
    return *rc;
  try {
    if (*ins)
      return inspect(path, verify);
    if (*imp)
      return import_files(path, names, out, io);
    return export_files(path, out, shards, optimizer);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hspmd-checkpoint: %s\n", e.what());
    return 1;
  }
}
