// Llama-style decoder language model (RMSNorm, rotary embeddings, causal attention, SwiGLU,
// untied head), single process or under mpirun with --cluster. Defaults are Llama-small.
//   build/release/examples/llama --layers 2 --hidden 256 --heads 4 --steps 20
//   build/release/examples/llama --data ../shared/data/wikitext-2/wiki.valid.tokens
//   mpirun -np 2 build/release/examples/llama --cluster clusters/emulated-2.json --plan synth
#include "train.hpp"

#include <hspmd/models/llama.hpp>

int main(int argc, char** argv) {
  return example::guarded([&] {
    CLI::App app{"hspmd example: Llama-style decoder language model"};
    example::common_options o;
    hspmd::models::llama_config c;
    example::add_common(app, o);
    app.add_option("--layers", c.layers, "decoder blocks")->capture_default_str();
    app.add_option("--hidden", c.hidden, "model width")->capture_default_str();
    app.add_option("--ffn", c.ffn, "SwiGLU width")->capture_default_str();
    app.add_option("--heads", c.heads, "attention heads (even head size)")->capture_default_str();
    app.add_option("--seq", c.seq, "tokens per sequence")->capture_default_str();
    app.add_option("--vocab", c.vocab, "vocabulary")->capture_default_str();
    app.add_option("--rope-base", c.rope_base, "rotary embedding base")->capture_default_str();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    const auto g = hspmd::models::trace_llama_lm<float>(c, o.batch);
    std::vector<std::int64_t> tokens, targets;
    if (!o.data.empty()) {
      const hspmd::data::text_corpus corpus(o.data.front(), c.vocab);
      std::printf("data: %s, %zu tokens, vocabulary %zu (%zu unknown)\n", o.data.front().c_str(),
                  corpus.tokens().size(), corpus.vocabulary().size(), corpus.unknown_count());
      return example::train("llama", g, o, [&](example::input_sink& ex, std::size_t step) {
        corpus.batch(step, o.batch, c.seq, tokens, targets);
        ex.set_input("tokens", tokens);
        ex.set_input("targets", targets);
      });
    }
    example::markov_text text(c.vocab, o.seed);
    return example::train("llama", g, o, [&](example::input_sink& ex, std::size_t) {
      text.batch(o.batch, c.seq, tokens, targets);
      ex.set_input("tokens", tokens);
      ex.set_input("targets", targets);
    });
  });
}
