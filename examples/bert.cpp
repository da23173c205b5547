// BERT-style language model (next-token loss, causal mask), single process. Defaults are
// BERT-base; --moe-experts N makes it BERT-MoE (every second layer a top-2 mixture).
//   build/release/examples/bert --layers 4 --hidden 256 --ffn 1024 --heads 4 --steps 20
//   build/release/examples/bert --data ../shared/data/wikitext-2/wiki.valid.tokens --vocab 8192
#include "train.hpp"

int main(int argc, char** argv) {
  return example::guarded([&] {
    CLI::App app{"hspmd example: BERT-style language model"};
    example::common_options o;
    hspmd::models::bert_config c;
    c.vocab = 8192;
    example::add_common(app, o);
    app.add_option("--layers", c.layers)->capture_default_str();
    app.add_option("--hidden", c.hidden)->capture_default_str();
    app.add_option("--ffn", c.ffn)->capture_default_str();
    app.add_option("--heads", c.heads)->capture_default_str();
    app.add_option("--seq", c.seq)->capture_default_str();
    app.add_option("--vocab", c.vocab)->capture_default_str();
    app.add_option("--dropout", c.dropout)->capture_default_str();
    app.add_option("--moe-experts", c.moe_experts, "BERT-MoE: experts in every second layer")
        ->capture_default_str();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    const auto g = hspmd::models::trace_bert_lm<float>(c, o.batch);
    std::vector<std::int64_t> tokens, targets;
    if (!o.data.empty()) {
      const hspmd::data::text_corpus corpus(o.data.front(), c.vocab);
      std::printf("data: %s, %zu tokens, vocabulary %zu (%zu unknown)\n", o.data.front().c_str(),
                  corpus.tokens().size(), corpus.vocabulary().size(), corpus.unknown_count());
      return example::train(c.moe_experts > 0 ? "bert-moe" : "bert", g, o,
                            [&](example::input_sink& ex, std::size_t step) {
                              corpus.batch(step, o.batch, c.seq, tokens, targets);
                              ex.set_input("tokens", tokens);
                              ex.set_input("targets", targets);
                            });
    }
    example::markov_text text(c.vocab, o.seed);
    return example::train(c.moe_experts > 0 ? "bert-moe" : "bert", g, o,
                          [&](example::input_sink& ex, std::size_t) {
                            text.batch(o.batch, c.seq, tokens, targets);
                            ex.set_input("tokens", tokens);
                            ex.set_input("targets", targets);
                          });
  });
}
