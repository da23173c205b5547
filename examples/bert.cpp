// BERT-style language model (next-token loss, causal mask), one process or under mpirun with
// --cluster. Defaults are BERT-base (vocabulary 30522); --moe-experts N makes it BERT-MoE (every
// second layer a top-2 mixture).
//   build/release/examples/bert --layers 4 --hidden 256 --ffn 1024 --heads 4 --vocab 8192
//   build/release/examples/bert --data ../shared/data/wikitext-2/valid.txt --vocab 8192
#include "train.hpp"

int main(int argc, char** argv) {
  CLI::App app{"hspmd example: BERT-style language model"};
  example::options o;
  o.train.unit = "tokens";
  o.train.metric = hspmd::train::eval_metric::perplexity;
  hspmd::models::bert_config c;
  example::add_common(app, o);
  app.add_option("--layers", c.layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", c.hidden, "model width")->capture_default_str();
  app.add_option("--ffn", c.ffn, "feed-forward width")->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads")->capture_default_str();
  app.add_option("--seq", c.seq, "tokens per sequence")->capture_default_str();
  app.add_option("--vocab", c.vocab, "vocabulary")->capture_default_str();
  app.add_option("--dropout", c.dropout, "dropout rate")->capture_default_str();
  app.add_option("--moe-experts", c.moe_experts, "BERT-MoE: experts in every second layer")
      ->capture_default_str();
  auto* eps = example::add_norm_eps(app, c.eps);
  return example::main_of(app, argc, argv, [&] {
    example::settle_norm_eps(o, c.eps, eps->count() > 0);
    o.train.name = c.moe_experts > 0 ? "bert-moe" : "bert";
    o.train.units_per_sample = c.seq;
    example::fit([&](std::size_t b) { return hspmd::models::trace_bert_lm<float>(c, b); }, o,
                 example::text_feeds(o, c.vocab, c.seq));
  });
}
