// Llama-style decoder language model (RMSNorm, rotary embeddings, causal attention, SwiGLU,
// untied head), one process or under mpirun with --cluster. Defaults are Llama-small.
//   build/release/examples/llama --layers 2 --hidden 256 --heads 4 --steps 20
//   build/release/examples/llama --data ../shared/data/wikitext-2/valid.txt
//   mpirun -np 2 build/release/examples/llama --cluster clusters/emulated-2.json --plan synth
#include "train.hpp"

#include <hspmd/models/llama.hpp>

int main(int argc, char** argv) {
  CLI::App app{"hspmd example: Llama-style decoder language model"};
  example::options o;
  o.train.name = "llama";
  o.train.unit = "tokens";
  o.train.metric = hspmd::train::eval_metric::perplexity;
  hspmd::models::llama_config c;
  example::add_common(app, o);
  app.add_option("--layers", c.layers, "decoder blocks")->capture_default_str();
  app.add_option("--hidden", c.hidden, "model width")->capture_default_str();
  app.add_option("--ffn", c.ffn, "SwiGLU width")->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads (even head size)")->capture_default_str();
  app.add_option("--kv-heads", c.kv_heads,
                 "key/value heads, dividing --heads (grouped-query attention; 0: one per head)")
      ->capture_default_str();
  app.add_flag("--fused-attention", c.fused_attention,
               "attention as one fused op that keeps no (S, S) scores");
  app.add_option("--seq", c.seq, "tokens per sequence")->capture_default_str();
  app.add_option("--vocab", c.vocab, "vocabulary")->capture_default_str();
  app.add_option("--rope-base", c.rope_base, "rotary embedding base")->capture_default_str();
  auto* eps = example::add_norm_eps(app, c.eps);
  return example::main_of(app, argc, argv, [&] {
    example::settle_norm_eps(o, c.eps, eps->count() > 0);
    o.train.units_per_sample = c.seq;
    example::fit([&](std::size_t b) { return hspmd::models::trace_llama_lm<float>(c, b); }, o,
                 example::text_feeds(o, c.vocab, c.seq));
  });
}
