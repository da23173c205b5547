// An MLP classifier on synthetic teacher-labelled data, one process or under mpirun with
// --cluster.
//   build/release/examples/mlp --inputs 784 --hidden 1024,1024 --steps 50
#include "train.hpp"

int main(int argc, char** argv) {
  CLI::App app{"hspmd example: MLP"};
  example::options o;
  o.train.name = "mlp";
  hspmd::models::mlp_config c;
  example::add_common(app, o);
  app.add_option("--inputs", c.inputs, "input features")->capture_default_str();
  app.add_option("--hidden", c.hidden, "hidden widths, comma separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--classes", c.classes, "output classes")->capture_default_str();
  return example::main_of(app, argc, argv, [&] {
    if (!o.data.empty())
      throw hspmd::config_error("--data", "the MLP example trains on synthetic data only",
                                "drop --data, or use the image models for CIFAR-10");
    // Labels: the arg-max of a fixed random projection of x (learnable by the MLP); batch i
    // depends only on i, so every rank feeds the same batch.
    std::vector<float> teacher(c.inputs * c.classes);
    std::mt19937_64 rng(o.train.seed);
    for (auto& v : teacher)
      v = std::normal_distribution<float>()(rng);
    const auto feed = [&](std::uint64_t offset) {
      return [&, offset](example::sink& s, std::size_t i) {
        std::mt19937_64 r(o.train.seed + (offset + i) * 0x9e3779b97f4a7c15ULL);
        const std::size_t b = o.train.batch;
        std::vector<float> x(b * c.inputs);
        std::vector<std::int64_t> y(b);
        for (auto& v : x)
          v = std::normal_distribution<float>()(r);
        for (std::size_t n = 0; n < b; ++n) {
          std::vector<float> score(c.classes, 0.0F);
          for (std::size_t k = 0; k < c.classes; ++k)
            for (std::size_t f = 0; f < c.inputs; ++f)
              score[k] += x[n * c.inputs + f] * teacher[f * c.classes + k];
          y[n] = std::ranges::max_element(score) - score.begin();
        }
        s.set_input("x", x);
        s.set_input("labels", y);
      };
    };
    example::fit([&](std::size_t b) { return hspmd::models::trace_mlp<float>(c, b); }, o,
                 {feed(0), feed(example::held_out)});
  });
}
