#include <hspmd/cluster/cluster_file.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

using namespace hspmd;

namespace {
const std::string clusters_dir = std::string(HSPMD_SOURCE_DIR) + "/clusters/";
}

TEST_CASE("every shipped cluster file parses, round-trips and keeps its fingerprint") {
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(clusters_dir)) {
    CAPTURE(entry.path().string());
    const cluster c = load_cluster(entry.path());
    CHECK(c.size() > 0);
    CHECK(c.source == entry.path().string());
    const cluster again = parse_cluster(to_json(c).dump(2), "again.json");
    CHECK(again == c);
    CHECK(fingerprint(again) == fingerprint(c));
    ++files;
  }
  CHECK(files >= 5);
}

TEST_CASE("the HAP testbed: 16 V100 on 2 nodes and 48 P100 on 6, 10.4 Gbit/s between nodes") {
  const cluster c = load_cluster(clusters_dir + "hap-testbed.json");
  REQUIRE(c.size() == 64);
  CHECK(c.nodes().size() == 8);
  std::size_t v100 = 0;
  for (const auto& d : c.devices)
    v100 += d.kind == "V100" ? 1U : 0U;
  CHECK(v100 == 16);
  CHECK(c.devices[0].name == "node0-v100.0");
  CHECK(c.devices[63].name == "node7-p100.7");
  CHECK(c.devices[0].speed / c.devices[63].speed == Approx(1.8));
  CHECK(c.devices[0].memory == 16ULL << 30U);
  REQUIRE(c.inter_node.has_value());
  CHECK(c.inter_node->bandwidth == Approx(10.4e9 / 8));
  CHECK(&c.link_between(0, 7) == &c.intra_node);
  CHECK(&c.link_between(0, 8) == &*c.inter_node);
}

TEST_CASE("the demo's emulated cluster: rank 1 is two times slower") {
  const cluster c = load_cluster(clusters_dir + "emulated-2.json");
  REQUIRE(c.size() == 2);
  CHECK(c.devices[0].speed == 2 * c.devices[1].speed);
  CHECK(c.devices[1].slowdown == 2.0);
  CHECK(c.devices[0].slowdown == 1.0);
  CHECK_FALSE(c.inter_node.has_value());
}

TEST_CASE("memory accepts bytes or a number with a unit") {
  const auto memory_of = [](const std::string& m) {
    const std::string text =
        R"({"links": {"intra_node": {"bandwidth": 1e9, "latency": 0}},
            "devices": [{"name": "d", "kind": "k", "speed": 1e9, "memory": )" +
        m + "}]}";
    return parse_cluster(text).devices.at(0).memory;
  };
  CHECK(memory_of("17179869184") == 17179869184ULL);
  CHECK(memory_of("\"16 GiB\"") == 17179869184ULL);
  CHECK(memory_of("\"16GiB\"") == 17179869184ULL);
  CHECK(memory_of("\"80 GB\"") == 80000000000ULL);
  CHECK(memory_of("\"1.5 TiB\"") == 1649267441664ULL);
  CHECK(memory_of("\"512 MiB\"") == 536870912ULL);
  CHECK(memory_of("\"2048 B\"") == 2048ULL);
  CHECK_THROWS_AS(memory_of("\"16\""), config_error);  // a unit is required in a string
  CHECK_THROWS_AS(memory_of("\"GiB\""), config_error); // and a number
  CHECK_THROWS_AS(memory_of("\"nan GiB\""), config_error);
}

TEST_CASE("the fingerprint ignores formatting and key order but not content") {
  const std::string a = R"({"name": "x", "links": {"intra_node": {"bandwidth": 1e9, "latency": 0}},
      "devices": [{"name": "d", "kind": "k", "speed": 1e9, "memory": 1024}]})";
  const std::string b = R"({"devices": [{"memory": "1 KiB", "speed": 1000000000, "kind": "k",
      "name": "d", "node": 0, "slowdown": 1}],
      "links": {"intra_node": {"latency": 0.0, "bandwidth": 1e9}}, "name": "x"})";
  const std::string c = R"({"name": "x", "links": {"intra_node": {"bandwidth": 1e9, "latency": 0}},
      "devices": [{"name": "d", "kind": "k", "speed": 1.000001e9, "memory": 1024}]})";
  CHECK(fingerprint(parse_cluster(a)) == fingerprint(parse_cluster(b)));
  CHECK(fingerprint(parse_cluster(a)) != fingerprint(parse_cluster(c)));
  CHECK(parse_cluster(a) == parse_cluster(b));
}

TEST_CASE("a device's MFU peak and BLAS note are read, round-trip and are checked") {
  const std::string text = R"({"links": {"intra_node": {"bandwidth": 1e9, "latency": 0}},
      "devices": [{"name": "d", "kind": "k", "speed": 1e9, "memory": 1024, "peak": 9.8e10,
                   "blas": "OpenBLAS 0.3.21, kernels Cooperlake"},
                  {"name": "e", "kind": "k", "speed": 1e9, "memory": 1024}]})";
  const cluster c = parse_cluster(text, "peak.json");
  CHECK(c.devices[0].peak == 9.8e10);
  CHECK(c.devices[0].blas == "OpenBLAS 0.3.21, kernels Cooperlake");
  CHECK(c.devices[1].peak == 0.0); // unknown: a host rank measures its own
  CHECK(c.devices[1].blas.empty());
  CHECK(parse_cluster(to_json(c).dump(), "peak.json") == c);
  std::string bad = text;
  bad.replace(bad.find("9.8e10"), 6, "-1e10");
  CHECK_THROWS_WITH(parse_cluster(bad, "x.json"),
                    Catch::Contains("x.json: field devices[0].peak: must be > 0"));
}

TEST_CASE("a cluster's name defaults to the file's stem") {
  const std::string text = R"({"links": {"intra_node": {"bandwidth": 1e9, "latency": 0}},
      "devices": [{"name": "d", "kind": "k", "speed": 1e9, "memory": 1024}]})";
  CHECK(parse_cluster(text, "dir/my-cluster.json").name == "my-cluster");
}

TEST_CASE("measured collective costs in the cluster file override the link defaults") {
  const std::string text = R"({"links": {"intra_node": {"bandwidth": 1e9, "latency": 1e-5}},
      "devices": [{"name": "d", "kind": "k", "speed": 1e9, "memory": 1024, "count": 4}],
      "collectives": {"all_gather_v": {"padded": {"alpha": 3e-6, "beta": 4e-10}},
                      "all_reduce": [{"up_to": 65536, "alpha": 1e-5, "beta": 1e-9},
                                     {"alpha": 2e-5, "beta": 5e-10}]}})";
  const cluster c = parse_cluster(text, "c.json");
  REQUIRE(c.collective_costs.size() == 2);
  const collective_cost_model m = c.cost_model();
  CHECK(m.params(collective::all_gather_v, uneven_algorithm::padded, 1e9) ==
        alpha_beta{3e-6, 4e-10});
  CHECK(m.params(collective::all_reduce, uneven_algorithm::native, 1000) == alpha_beta{1e-5, 1e-9});
  CHECK(m.params(collective::all_reduce, uneven_algorithm::native, 1e6) == alpha_beta{2e-5, 5e-10});
  const auto defaults = collective_cost_model::from_link(4, 1e-5, 1e9);
  CHECK(m.curve(collective::all_gather_v, uneven_algorithm::native) ==
        defaults.curve(collective::all_gather_v, uneven_algorithm::native));
  CHECK(parse_cluster(to_json(c).dump(), "again.json") == c);
  CHECK(&c.bottleneck_link() == &c.intra_node);
}

TEST_CASE("a calibrated cost model set on a cluster prices every collective and round-trips") {
  cluster c = parse_cluster(R"({"links": {"intra_node": {"bandwidth": 1e9, "latency": 1e-5}},
      "devices": [{"name": "d", "kind": "k", "speed": 1e9, "memory": 1024, "count": 2}]})",
                            "c.json");
  collective_cost_model measured = collective_cost_model::from_link(2, 1e-5, 1e9);
  measured.set(collective::all_to_all_v, uneven_algorithm::native, alpha_beta{7e-6, 3e-9});
  measured.set(collective::reduce_scatter_v, uneven_algorithm::grouped, alpha_beta{1e-6, 2e-9});
  c.set_collective_costs(measured);
  const collective_cost_model m = c.cost_model();
  CHECK(m.params(collective::all_to_all_v, uneven_algorithm::native, 1e6) ==
        alpha_beta{7e-6, 3e-9});
  CHECK(m.params(collective::reduce_scatter_v, uneven_algorithm::grouped, 1e6) ==
        alpha_beta{1e-6, 2e-9});
  const cluster again = parse_cluster(to_json(c).dump(), "again.json");
  CHECK(again == c);
  CHECK(again.cost_model().params(collective::all_to_all_v, uneven_algorithm::native, 1e6) ==
        alpha_beta{7e-6, 3e-9});
}
