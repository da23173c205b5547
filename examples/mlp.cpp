// An MLP classifier on synthetic teacher-labelled data, single process.
//   build/release/examples/mlp --inputs 784 --hidden 1024,1024 --steps 50
#include "train.hpp"

int main(int argc, char** argv) {
  return example::guarded([&] {
    CLI::App app{"hspmd example: MLP"};
    example::common_options o;
    hspmd::models::mlp_config c;
    example::add_common(app, o);
    app.add_option("--inputs", c.inputs)->capture_default_str();
    app.add_option("--hidden", c.hidden)->delimiter(',')->capture_default_str();
    app.add_option("--classes", c.classes)->capture_default_str();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    if (!o.data.empty())
      throw hspmd::config_error("--data", "the MLP example trains on synthetic data only",
                                "drop --data, or use the image models for CIFAR-10");
    const auto g = hspmd::models::trace_mlp<float>(c, o.batch);
    // Labels: the argmax of a fixed random projection of x (learnable by the MLP).
    std::mt19937_64 rng(o.seed);
    std::normal_distribution<float> nd(0.0F, 1.0F);
    std::vector<float> teacher(c.inputs * c.classes);
    for (auto& v : teacher)
      v = nd(rng);
    return example::train("mlp", g, o, [&](example::input_sink& ex, std::size_t) {
      std::vector<float> x(o.batch * c.inputs);
      std::vector<std::int64_t> y(o.batch);
      for (auto& v : x)
        v = nd(rng);
      for (std::size_t b = 0; b < o.batch; ++b) {
        std::size_t best = 0;
        float best_v = -1e30F;
        for (std::size_t k = 0; k < c.classes; ++k) {
          float s = 0;
          for (std::size_t i = 0; i < c.inputs; ++i)
            s += x[b * c.inputs + i] * teacher[i * c.classes + k];
          if (s > best_v) {
            best_v = s;
            best = k;
          }
        }
        y[b] = static_cast<std::int64_t>(best);
      }
      ex.set_input("x", x);
      ex.set_input("labels", y);
    });
  });
}
