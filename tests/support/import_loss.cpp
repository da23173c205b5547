// The loss hspmd's llama gives on a Hugging Face Llama checkpoint: imports the safetensors files
// and config.json in HF_DIR by the llama name table, traces the model at the sizes the config
// names (grouped-query attention from num_key_value_heads), loads the import into a
// single-process executor in f64 and prints the mean next-token loss of the tokens and targets
// in TOKENS_JSON ({"batch": B, "seq": S, "tokens": [...], "targets": [...]}) through products and
// through the fused attention op, as one JSON line. Used by hf_llama_import.py.
//
//     import_loss HF_DIR WORK_DIR TOKENS_JSON
#include <hspmd/exec/backends/blas.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/models/llama.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/import.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace hspmd;
namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& file) {
  std::ifstream f(file);
  if (!f)
    throw config_error(file.string(), "cannot be read", "give an existing file");
  return nlohmann::json::parse(f);
}

double loss_of(const models::llama_config& c, const fs::path& ckpt, const nlohmann::json& data) {
  const auto batch = data.at("batch").get<std::size_t>();
  const graph::graph g = models::trace_llama_lm<double>(c, batch);
  exec::executor<double> ex(g, 0);
  std::vector<train::checkpoint_target<double>> targets;
  for (graph::node_id p : g.parameters())
    targets.push_back({g[p].name, g[p].out.dims, exec::box::whole(g[p].out.dims), ex.value(p)});
  train::solo_communicator solo;
  (void)train::load_checkpoint<double>(solo, ckpt,
                                       std::span<const train::checkpoint_target<double>>(targets));
  ex.set_input("tokens", data.at("tokens").get<std::vector<std::int64_t>>());
  ex.set_input("targets", data.at("targets").get<std::vector<std::int64_t>>());
  return ex.forward();
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: import_loss HF_DIR WORK_DIR TOKENS_JSON\n");
    return 2;
  }
  try {
    const fs::path hf = argv[1];
    const fs::path work = argv[2];
    const auto config = read_json(hf / "config.json");
    const auto data = read_json(argv[3]);
    (void)train::import_checkpoint(hf, work / "ckpt", train::import_family_named("llama"));
    models::llama_config c;
    c.layers = config.at("num_hidden_layers").get<std::size_t>();
    c.hidden = config.at("hidden_size").get<std::size_t>();
    c.ffn = config.at("intermediate_size").get<std::size_t>();
    c.heads = config.at("num_attention_heads").get<std::size_t>();
    c.kv_heads = config.value("num_key_value_heads", c.heads);
    c.vocab = config.at("vocab_size").get<std::size_t>();
    c.eps = config.value("rms_norm_eps", 1e-6);
    c.rope_base = config.contains("rope_parameters")
                      ? config["rope_parameters"].value("rope_theta", 10000.0)
                      : config.value("rope_theta", 10000.0);
    c.seq = data.at("seq").get<std::size_t>();
    const double plain = loss_of(c, work / "ckpt", data);
    c.fused_attention = true;
    const double fused = loss_of(c, work / "ckpt", data);
    std::printf("{\"loss\": %.17g, \"fused_loss\": %.17g}\n", plain, fused);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "import_loss: %s\n", e.what());
    return 1;
  }
}
