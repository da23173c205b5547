// Sharded checkpoints of a distributed run (train/checkpoint.hpp): parameters and SGD momentum
// saved under one layout (plan kind, ratios, zero-length shards) load into every other, the
// gathered parameters bitwise equal, and training goes on equal to the run that never stopped
// (bitwise under the same layout, within the equivalence tolerance under another).
//
// Across rank counts: the [save] runs (np 1, 2, 3) each leave their checkpoints and the whole
// parameters they gathered (before and after 2 more steps) under HSPMD_CHECKPOINT_DIR; the [load]
// runs, after all of them, load every other rank count's checkpoints into each of their layouts.
#include <hspmd/models/zoo.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/ram_state.hpp>
#include <hspmd/train/ram_tier.hpp>
#include <hspmd/train/trainer.hpp>

#include "../../support/equivalence.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

using namespace hspmd;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t id_limit = 10;
using dx_t = exec::distributed_executor<float, mpi_communicator, exec::host_backend>;

graph::graph saved_model() {
  models::model_options o;
  o.layers = 2;
  o.hidden = 24;
  return models::trace_model<float>("mlp", o, 12);
}

struct saved_layout {
  std::string name;
  synth::plan plan;
};

// Every layout of this rank count: DP-EV, DP-CP, TP and synth at even ratios; DP-EV and TP at
// 3:1 (2 ranks) or 1:2:5 and with a zero-length shard (3 ranks).
std::vector<saved_layout> layouts(const graph::graph& g, std::size_t n) {
  const cluster c = test::make_cluster(n, 1e6);
  std::vector<saved_layout> out;
  const std::string np = "np" + std::to_string(n);
  out.push_back({np + "-synth", synth::synthesize(g, c, {}, "mlp")});
  for (auto b : {synth::baseline::dp_ev, synth::baseline::dp_cp, synth::baseline::tp})
    out.push_back(
        {np + "-" + std::string(synth::name(b)), synth::make_baseline(g, c, b, {}, "mlp")});
  if (n == 1)
    return {out.front()};
  std::vector<std::pair<std::string, std::vector<double>>> uneven;
  if (n == 2)
    uneven = {{"3:1", {0.75, 0.25}}};
  else
    uneven = {{"1:2:5", {1.0 / 8, 2.0 / 8, 5.0 / 8}}, {"1:0:1", {0.5, 0.0, 0.5}}};
  for (const auto& [tag, r] : uneven)
    for (std::size_t k : {std::size_t{1}, std::size_t{3}}) { // DP-EV and TP
      saved_layout l = out[k];
      l.name += "-" + tag;
      for (auto& seg : l.plan.ratios)
        seg = r;
      out.push_back(l);
    }
  return out;
}

struct saved_run {
  std::unique_ptr<dx_t> dx;
  exec::sgd opt{0.05, 0.9};
  std::size_t step = 0;

  saved_run(const graph::graph& g, const synth::plan& p, mpi_communicator& comm, std::uint64_t seed)
      : dx(std::make_unique<dx_t>(g, p, comm, seed)) {}

  void train(const graph::graph& g, std::size_t steps) {
    for (std::size_t k = 0; k < steps; ++k, ++step) {
      const auto b = test::data_for<float>(g, step, id_limit);
      for (const auto& [name, v] : b.values)
        dx->set_input(name, std::span<const float>(v));
      for (const auto& [name, v] : b.ids)
        dx->set_input(name, std::span<const std::int64_t>(v));
      dx->set_step(step);
      (void)dx->forward();
      dx->backward();
      dx->clip_grad_norm(0.5);
      opt.step(dx->local());
    }
  }
  std::span<float> value(std::size_t j) {
    return dx->local().value(dx->program().local.parameters()[j]);
  }
  std::span<float> momentum(std::size_t j) {
    auto& slots = opt.state().of<float, exec::host_backend>();
    return {slots.a[j].data(), slots.a[j].size()};
  }
  // Parameters and momentum as checkpoint pieces, and as load targets.
  std::vector<train::checkpoint_piece<float>> pieces(const graph::graph& g) {
    auto p =
        train::program_pieces<float>(g, dx->program(), [&](std::size_t j) { return value(j); });
    auto m = train::program_pieces<float>(
        g, dx->program(), [&](std::size_t j) { return momentum(j); }, "optimizer.momentum.");
    p.insert(p.end(), m.begin(), m.end());
    return p;
  }
  std::vector<train::checkpoint_target<float>> targets(const graph::graph& g) {
    // Momentum slots exist once the optimizer has stepped: a fresh run steps with lr 0 first.
    if (opt.state().of<float, exec::host_backend>().a.empty()) {
      const double lr = opt.lr;
      opt.lr = 0.0;
      train(g, 1);
      opt.lr = lr;
    }
    auto t =
        train::program_targets<float>(g, dx->program(), [&](std::size_t j) { return value(j); });
    auto m = train::program_targets<float>(
        g, dx->program(), [&](std::size_t j) { return momentum(j); }, "optimizer.momentum.");
    t.insert(t.end(), m.begin(), m.end());
    return t;
  }
  std::map<std::string, std::vector<float>> gathered(const graph::graph& g) {
    std::map<std::string, std::vector<float>> out;
    for (graph::node_id p : g.parameters())
      out[g[p].name] = dx->gather(g[p].name);
    return out;
  }
};

void check_bitwise(const std::map<std::string, std::vector<float>>& got,
                   const std::map<std::string, std::vector<float>>& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    INFO(name);
    CHECK(got.at(name) == w);
  }
}

void check_close(const std::map<std::string, std::vector<float>>& got,
                 const std::map<std::string, std::vector<float>>& want, const std::string& what) {
  INFO(what);
  for (const auto& [name, w] : want) {
    const auto& v = got.at(name);
    REQUIRE(v.size() == w.size());
    double scale = 1e-3;
    double worst = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      scale = std::max(scale, std::abs(double(w[i])));
      worst = std::max(worst, std::abs(double(v[i]) - double(w[i])));
    }
    INFO(name << ": max difference " << worst << " at scale " << scale);
    CHECK(worst <= 1e-5 * scale);
  }
}

// Loads checkpoint `dir` into a fresh run of layout `l` (its own initial values differ), checks
// its gathered parameters bitwise against `saved`, trains 2 steps and compares with `after`.
void load_and_continue(const graph::graph& g, const saved_layout& l, mpi_communicator& comm,
                       const fs::path& dir, const std::map<std::string, std::vector<float>>& saved,
                       const std::map<std::string, std::vector<float>>& after, bool same_layout) {
  saved_run r(g, l.plan, comm, 99);
  const auto targets = r.targets(g);
  const train::checkpoint_info info = train::load_checkpoint<float>(
      comm, dir, std::span<const train::checkpoint_target<float>>(targets));
  CHECK(info.step == 2);
  r.step = info.step;
  const std::string what = dir.filename().string() + " into " + l.name;
  check_bitwise(r.gathered(g), saved, what);
  r.train(g, 2);
  if (same_layout)
    check_bitwise(r.gathered(g), after, what + ", 2 more steps");
  else
    check_close(r.gathered(g), after, what + ", 2 more steps");
}

fs::path test_dir() {
  const char* d = std::getenv("HSPMD_CHECKPOINT_DIR");
  return d != nullptr ? fs::path(d) : fs::temp_directory_path() / "hspmd-checkpoint-test";
}

// Whole tensors in a safetensors file (rank 0), and back.
void write_whole(const fs::path& file, const std::map<std::string, std::vector<float>>& t) {
  std::vector<io::safetensors_tensor> ts;
  for (const auto& [name, v] : t)
    ts.push_back({name, dtype::f32, {v.size()}, std::as_bytes(std::span<const float>(v))});
  (void)io::write_safetensors(file, ts);
}
std::map<std::string, std::vector<float>> read_whole(const fs::path& file) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : io::read_safetensors_header(file).tensors) {
    std::vector<float> v(e.bytes / sizeof(float));
    io::read_file_range(file, e.begin, std::as_writable_bytes(std::span<float>(v)));
    out[name] = std::move(v);
  }
  return out;
}

} // namespace

TEST_CASE("a checkpoint saved under one layout loads into every other of the rank count",
          "[save]") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = saved_model();
  const auto all = layouts(g, n);
  const fs::path root = test_dir() / ("np" + std::to_string(n));
  if (comm.rank() == 0)
    fs::remove_all(root);
  comm.barrier();
  for (const saved_layout& a : all) {
    saved_run r(g, a.plan, comm, 7);
    r.train(g, 2);
    const auto pieces = r.pieces(g);
    const fs::path dir = train::save_checkpoint<float>(
        comm, root / a.name, 2, std::span<const train::checkpoint_piece<float>>(pieces),
        {{"layout", a.name}});
    CHECK(dir == root / a.name / "step-00000002");
    const auto saved = r.gathered(g);
    r.train(g, 2);
    const auto after = r.gathered(g);
    if (comm.rank() == 0) {
      write_whole(root / (a.name + ".saved.safetensors"), saved);
      write_whole(root / (a.name + ".after.safetensors"), after);
    }
    for (const saved_layout& b : all)
      load_and_continue(g, b, comm, root / a.name, saved, after, &a == &b);
  }
}

// The run's state as the RAM tier takes it (the saved pieces; the tier only reads them).
std::vector<train::training_tensor<float>> ram_tensors(saved_run& r, const graph::graph& g) {
  std::vector<train::training_tensor<float>> out;
  for (const auto& p : r.pieces(g))
    out.push_back({p.name, p.shape, p.boxes,
                   std::span<float>(const_cast<float*>(p.data.data()), p.data.size())});
  return out;
}

TEST_CASE("the RAM tier keeps every step in memory files, and a lost node's ranks are completed "
          "by their peers' copies",
          "[save]") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = saved_model();
  const auto all = layouts(g, n);
  const fs::path root = test_dir() / ("ram-np" + std::to_string(n));
  if (comm.rank() == 0)
    fs::remove_all(root);
  comm.barrier();
  train::ram_options o;
  o.dir = root;
  o.job = "test";
  for (std::size_t r = 0; r < n; ++r) // ranks alternate between two nodes
    o.nodes.push_back("node-" + std::to_string(r % 2));
  saved_run run(g, all.front().plan, comm, 7);
  std::map<std::size_t, std::map<std::string, std::vector<float>>> saved;
  run.train(g, 1); // (the momentum exists once the optimizer has stepped)
  {
    train::ram_tier<float, mpi_communicator> tier(comm, o, ram_tensors(run, g));
    CHECK(tier.peer().has_value() == (n > 1));
    for (int k = 0; k < 3; ++k) {
      if (k > 0)
        run.train(g, 1);
      const auto t = ram_tensors(run, g);
      tier.save(run.step, t, {{"schedule", {{"next_step", run.step}}}});
      tier.poll();
      saved[run.step] = run.gathered(g);
    }
    tier.finish();
    CHECK(tier.stats().saves == 3);
  }
  comm.barrier();
  std::string chosen;
  if (comm.rank() == 0) {
    auto state = train::find_ram_state(root);
    REQUIRE(state.has_value());
    CHECK(state->step == 3);
    CHECK(state->ranks.size() == n);
    CHECK(state->from_peers.empty());
    if (n > 1) { // node 1 lost with its memory: its ranks' copies on node 0 complete step 3
      fs::remove_all(root / "node-1");
      state = train::find_ram_state(root);
      REQUIRE(state.has_value());
      CHECK(state->step == 3);
      CHECK(state->from_peers.size() == n / 2);
      CHECK(state->from_peers.front() == "rank 1 from node-0's peer copy");
    }
    // Rank 0's slot of step 3 being rewritten (its record removed first): step 2 is the newest
    // complete state, and step 3 is named as passed over.
    for (const auto& e : fs::directory_iterator(root / "node-0" / "test"))
      if (e.path().filename().string().starts_with("rank-00000") &&
          e.path().extension() == ".json" &&
          train::detail::read_ram_record(e.path())->at("step") == 3)
        fs::remove(e.path());
    std::vector<std::string> skipped;
    state = train::find_ram_state(root, &skipped);
    REQUIRE(state.has_value());
    CHECK(state->step == 2);
    if (n > 1) { // (one rank: no record of step 3 is left to name)
      REQUIRE(skipped.size() == 1);
      CHECK(skipped.front().find("step 3: no record of rank 0 ") != std::string::npos);
    }
    chosen = train::assemble_ram_checkpoint(root, *state).string();
  }
  chosen = train::detail::all_gather_text(comm, chosen).front();
  // The state loads through the resharding loader into another layout, bitwise.
  saved_run other(g, all.back().plan, comm, 99);
  const auto targets = other.targets(g);
  const train::checkpoint_info info = train::load_checkpoint<float>(
      comm, chosen, std::span<const train::checkpoint_target<float>>(targets));
  CHECK(info.step == 2);
  check_bitwise(other.gathered(g), saved.at(2), "the RAM tier's step 2 into " + all.back().name);
}

TEST_CASE("checkpoints saved under other rank counts load into every layout of this one",
          "[.][load]") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = saved_model();
  const auto all = layouts(g, n);
  std::size_t loaded = 0;
  for (std::size_t m = 1; m <= 3; ++m) {
    if (m == n)
      continue;
    const fs::path root = test_dir() / ("np" + std::to_string(m));
    for (const saved_layout& a : layouts(g, m)) {
      const fs::path dir = root / a.name;
      INFO(dir.string() << " (left by the [save] run at np " << m << ")");
      REQUIRE(fs::exists(dir / "latest"));
      const auto saved = read_whole(root / (a.name + ".saved.safetensors"));
      const auto after = read_whole(root / (a.name + ".after.safetensors"));
      for (const saved_layout& b : all)
        load_and_continue(g, b, comm, dir, saved, after, false);
      ++loaded;
    }
  }
  CHECK(loaded > 0);
}

TEST_CASE("an uncommitted save is never loaded, a damaged, truncated or missing file is named",
          "[save]") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = saved_model();
  const saved_layout l = layouts(g, n).back();
  const fs::path root = test_dir() / ("errors-np" + std::to_string(n));
  if (comm.rank() == 0)
    fs::remove_all(root);
  comm.barrier();
  saved_run r(g, l.plan, comm, 7);
  r.train(g, 2);
  const auto save = [&](std::size_t step, train::checkpoint_options o = {}) {
    const auto pieces = r.pieces(g);
    return train::save_checkpoint<float>(
        comm, root, step, std::span<const train::checkpoint_piece<float>>(pieces), {}, o);
  };
  (void)save(2);
  const auto at2 = r.gathered(g);
  r.train(g, 1);
  // keep 1: the step-2 checkpoint is removed once step 3 is committed.
  train::checkpoint_options keep1;
  keep1.keep = 1;
  const fs::path dir3 = save(3, keep1);
  CHECK_FALSE(fs::exists(root / "step-00000002"));
  const auto at3 = r.gathered(g);
  const auto load = [&](const fs::path& from) {
    saved_run fresh(g, l.plan, comm, 99);
    const auto targets = fresh.targets(g);
    const auto info = train::load_checkpoint<float>(
        comm, from, std::span<const train::checkpoint_target<float>>(targets));
    return std::make_pair(info.step, fresh.gathered(g));
  };
  if (comm.rank() == 0) {
    // A save that crashed before its commit: a .partial directory, and a step directory whose
    // manifest never appeared (named by latest, as if the crash came after a rename).
    fs::create_directories(root / "step-00000009.partial");
    std::ofstream(root / "step-00000009.partial" / "rank-00000.safetensors") << "half";
    fs::create_directories(root / "step-00000010");
    std::ofstream(root / "latest") << "step-00000010\n";
  }
  comm.barrier();
  {
    const auto [step, got] = load(root);
    CHECK(step == 3);
    check_bitwise(got, at3, "the newest committed checkpoint");
    // ... and says what it passed over, on every rank.
    saved_run fresh(g, l.plan, comm, 99);
    const auto targets = fresh.targets(g);
    const auto info = train::load_checkpoint<float>(
        comm, root, std::span<const train::checkpoint_target<float>>(targets));
    REQUIRE(info.notes.size() == 2);
    CHECK_THAT(info.notes[0], Catch::Contains("step-00000009.partial: a save that did not "
                                              "commit"));
    CHECK_THAT(info.notes[1],
               Catch::Contains("step-00000010: no manifest.json, not a committed checkpoint "
                               "(though latest names it): skipped"));
  }
  // The next save removes the stale .partial directory.
  (void)save(4);
  CHECK_FALSE(fs::exists(root / "step-00000009.partial"));
  CHECK(fs::exists(root / "step-00000004" / "manifest.json"));

  const fs::path file = dir3 / "rank-00000.safetensors";
  const auto damage = [&](auto&& how) {
    comm.barrier();
    if (comm.rank() == 0)
      how();
    comm.barrier();
  };
  const auto size = fs::file_size(file);
  std::vector<char> original(size);
  std::ifstream(file, std::ios::binary).read(original.data(), static_cast<std::streamsize>(size));
  const auto restore = [&] {
    std::ofstream(file, std::ios::binary | std::ios::trunc)
        .write(original.data(), static_cast<std::streamsize>(size));
  };
  damage([&] { // one bit of the last byte of data
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 1));
    char c = original[size - 1];
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  });
  CHECK_THROWS_WITH(load(dir3), Catch::Contains(file.string() + ": tensor ") &&
                                    Catch::Contains("fail their checksum") &&
                                    Catch::Contains("restore it, or load an earlier checkpoint"));
  damage([&] { fs::resize_file(file, size - 8); });
  CHECK_THROWS_WITH(load(dir3), Catch::Contains(file.string()) && Catch::Contains("restore") &&
                                    Catch::Contains("truncated"));
  damage([&] { fs::remove(file); });
  CHECK_THROWS_WITH(load(dir3), Catch::Contains(file.string() + ": missing"));
  damage(restore);
  {
    const auto [step, got] = load(dir3);
    CHECK(step == 3);
    check_bitwise(got, at3, "the restored file");
  }
  // The manifest checks itself: an edited value fails its checksum; a manifest re-checksummed
  // after an edit still fails where its fields disagree with each other or with the folder.
  const fs::path manifest = dir3 / "manifest.json";
  std::string manifest_text;
  {
    std::ifstream in(manifest);
    manifest_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto rewrite = [&](const std::function<std::string()>& text) {
    damage([&] { std::ofstream(manifest, std::ios::trunc) << text(); });
  };
  const auto edited = [&](const std::function<void(nlohmann::ordered_json&)>& edit, bool checksum) {
    auto m = nlohmann::ordered_json::parse(manifest_text);
    edit(m);
    if (checksum)
      m["checksum"] = train::detail::manifest_checksum(m);
    return m.dump(1);
  };
  REQUIRE(manifest_text.find("\"step\": 3,") != std::string::npos);
  rewrite([&] {
    std::string t = manifest_text;
    t.replace(t.find("\"step\": 3,"), 10, "\"step\": 4,");
    return t;
  });
  CHECK_THROWS_WITH(load(dir3), Catch::Contains(manifest.string() + ": field checksum") &&
                                    Catch::Contains("the manifest was edited or damaged"));
  rewrite([&] { return edited([](auto& m) { m["step"] = 4; }, true); });
  CHECK_THROWS_WITH(load(dir3), Catch::Contains("field step is 4, but the folder's name "
                                                "step-00000003 makes it 3"));
  rewrite([&] {
    return edited(
        [](auto& m) {
          m["meta"] = {{"schedule", {{"next_step", 3}}},
                       {"data", {{"next_micro_batch", 6}, {"accumulate", 2}}},
                       {"optimizer", {{"kind", "adam"}, {"steps", 4}}}};
        },
        true);
  });
  CHECK_THROWS_WITH(load(dir3), Catch::Contains("field meta.optimizer.steps is 4, but step less "
                                                "f16's skipped steps makes it 3"));
  rewrite([&] {
    return edited(
        [](auto& m) {
          m.erase("checksum");
          m["version"] = 1;
        },
        false);
  });
  { // a manifest written before checksums loads, with a note
    saved_run fresh(g, l.plan, comm, 99);
    const auto targets = fresh.targets(g);
    const auto info = train::load_checkpoint<float>(
        comm, dir3, std::span<const train::checkpoint_target<float>>(targets));
    CHECK(info.step == 3);
    REQUIRE(info.notes.size() == 1);
    CHECK_THAT(info.notes[0], Catch::Contains("(version 1): not verified"));
  }
  rewrite([&] { return manifest_text; });
  CHECK(load(dir3).first == 3);
  (void)at2;
}

namespace {

// The library trainer on BERT (double, Adam, dropout off, constant rate): `steps` steps under
// `plan` on n equal devices (one process at np 1 without a cluster when `plan` is empty).
train::train_result train_bert(const graph::graph& g, std::size_t steps, const std::string& plan,
                               const fs::path& dir, std::size_t save_every, bool resume,
                               std::map<std::string, std::vector<double>>* params = nullptr,
                               const fs::path& init_from = {}) {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  train::train_options o;
  if (!plan.empty()) {
    o.cluster_spec = test::make_cluster(n, 1e9);
    o.plan = plan;
  }
  o.steps = steps;
  o.lr = train::lr_schedule::constant(3e-3);
  o.out = nullptr;
  o.checkpoint_dir = dir.string();
  o.save_every = save_every;
  o.resume = resume;
  o.init_from = init_from.string();
  const exec::feed_fn<double> feed = [&](exec::batch_sink<double>& b, std::size_t i) {
    const auto data = test::data_for<double>(g, i, 40);
    for (const auto& [name, v] : data.values)
      b.set_input(name, std::span<const double>(v));
    for (const auto& [name, v] : data.ids)
      b.set_input(name, std::span<const std::int64_t>(v));
  };
  train::trainer<double> tr(g, o);
  auto r = tr.fit(feed);
  if (params != nullptr)
    for (graph::node_id p : g.parameters())
      (*params)[g[p].name] = tr.value(g[p].name);
  return r;
}

graph::graph saved_bert() {
  models::model_options o;
  o.layers = 2;
  o.hidden = 16;
  o.ffn = 32;
  o.heads = 2;
  o.seq = 6;
  o.vocab = 40;
  return models::trace_model<double>("bert", o, 8);
}

std::string plan_of(std::size_t n) {
  return n == 1 ? "" : "synth";
}

void check_params(const std::map<std::string, std::vector<double>>& got,
                  const std::map<std::string, std::vector<double>>& want, double tol) {
  for (const auto& [name, w] : want) {
    const auto& v = got.at(name);
    REQUIRE(v.size() == w.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i)
      worst = std::max(worst, std::abs(v[i] - w[i]));
    INFO(name << ": max difference " << worst);
    CHECK(worst <= tol);
  }
}

} // namespace

TEST_CASE("the trainer saves at step 5 of 10 and a resumed run equals the one that never stopped",
          "[save]") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = saved_bert();
  const fs::path root = test_dir() / ("trainer-np" + std::to_string(n));
  if (comm.rank() == 0)
    fs::remove_all(root);
  comm.barrier();
  std::map<std::string, std::vector<double>> want_params;
  const auto want = train_bert(g, 10, plan_of(n), root / "whole", 0, false, &want_params);
  // The first half saves at step 5; the second resumes from it (nothing in "whole" to resume).
  std::map<std::string, std::vector<double>> at5;
  const auto first = train_bert(g, 5, plan_of(n), root / "halves", 5, true, &at5);
  CHECK(first.resumed_from == 0);
  REQUIRE(first.checkpoints.size() == 1);
  CHECK(fs::path(first.checkpoints[0]).filename() == "step-00000005");
  std::map<std::string, std::vector<double>> got_params;
  const auto second = train_bert(g, 10, plan_of(n), root / "halves", 5, true, &got_params);
  CHECK(second.resumed_from == 5);
  REQUIRE(second.losses.size() == 5);
  for (std::size_t s = 0; s < 5; ++s) {
    INFO("step " << s + 6);
    CHECK(second.losses[s] == want.losses[s + 5]);
  }
  check_params(got_params, want_params, 0.0);
  // --init-from: the parameters of step 5 (under another plan too), the optimizer fresh: no
  // steps leave them exactly as saved; a run that resumes ignores it.
  for (const std::string& plan :
       n > 1 ? std::vector<std::string>{plan_of(n), "tp"} : std::vector<std::string>{""}) {
    INFO("init from step 5 under plan " << plan);
    std::map<std::string, std::vector<double>> init;
    const auto r = train_bert(g, 0, plan, root / ("init-" + plan), 0, false, &init,
                              root / "halves" / "step-00000005");
    CHECK(fs::path(r.initialized_from).filename() == "step-00000005");
    CHECK(r.resumed_from == 0);
    check_params(init, at5, 0.0);
  }
  {
    const auto r = train_bert(g, 10, plan_of(n), root / "halves", 0, true, nullptr,
                              root / "no-such-checkpoint");
    CHECK(r.resumed_from == 10); // the second half's last save
    CHECK(r.initialized_from.empty());
  }
  // The same checkpoint resumed under another plan: equal within the equivalence tolerance.
  if (n > 1) {
    const fs::path other = root / "other";
    if (comm.rank() == 0) {
      fs::create_directories(other / "step-00000005");
      fs::copy(root / "halves" / "step-00000005", other / "step-00000005",
               fs::copy_options::recursive);
    }
    comm.barrier();
    std::map<std::string, std::vector<double>> tp_params;
    const auto tp = train_bert(g, 10, "tp", other, 0, true, &tp_params);
    CHECK(tp.resumed_from == 5);
    REQUIRE(tp.losses.size() == 5);
    for (std::size_t s = 0; s < 5; ++s)
      CHECK(std::abs(tp.losses[s] - want.losses[s + 5]) <= 1e-10 * std::abs(want.losses[s + 5]));
    check_params(tp_params, want_params, 1e-10);
  }
  // What the [load] runs of other rank counts compare with.
  if (comm.rank() == 0) {
    nlohmann::json j{{"losses", want.losses}};
    std::ofstream(root / "want.json") << j.dump();
  }
  // A checkpoint of another model is refused with its manifest named (by one process: a
  // distributed trainer's failure ends the job, as examples.resume_other_model checks).
  if (n != 1)
    return;
  models::model_options o;
  o.layers = 1;
  o.hidden = 16;
  o.ffn = 32;
  o.heads = 2;
  o.seq = 6;
  o.vocab = 40;
  const graph::graph other_model = models::trace_model<double>("bert", o, 8);
  CHECK_THROWS_WITH(train_bert(other_model, 10, plan_of(n), root / "halves", 0, true),
                    Catch::Contains("manifest.json") &&
                        Catch::Contains("was saved from another model"));
}

TEST_CASE("the trainer resumes a checkpoint saved at another rank count", "[.][load]") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = saved_bert();
  std::size_t resumed = 0;
  for (std::size_t m = 1; m <= 3; ++m) {
    if (m == n)
      continue;
    const fs::path saved = test_dir() / ("trainer-np" + std::to_string(m));
    const fs::path mine =
        test_dir() / ("trainer-np" + std::to_string(n) + "-from-np" + std::to_string(m));
    if (comm.rank() == 0) {
      fs::remove_all(mine);
      fs::create_directories(mine / "step-00000005");
      fs::copy(saved / "halves" / "step-00000005", mine / "step-00000005",
               fs::copy_options::recursive);
    }
    comm.barrier();
    nlohmann::json want;
    std::ifstream(saved / "want.json") >> want;
    const auto got = train_bert(g, 10, plan_of(n), mine, 0, true);
    INFO("saved at np " << m << ", resumed at np " << n);
    CHECK(got.resumed_from == 5);
    REQUIRE(got.losses.size() == 5);
    for (std::size_t s = 0; s < 5; ++s) {
      const double w = want["losses"][s + 5].get<double>();
      CHECK(std::abs(got.losses[s] - w) <= 1e-10 * std::abs(w));
    }
    ++resumed;
  }
  CHECK(resumed == 2);
}
