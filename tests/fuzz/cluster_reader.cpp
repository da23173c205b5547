// libFuzzer target of the cluster reader: any input either parses or throws `config_error`
// (one line naming the field); nothing else escapes, nothing crashes (ASan, UBSan), and a
// cluster that parses reads back from its own canonical JSON with the same fingerprint.
#include <hspmd/cluster/cluster_file.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hspmd::cluster c;
  try {
    c = hspmd::parse_cluster(text, "fuzz.json");
  } catch (const hspmd::config_error&) {
    return 0;
  }
  if (hspmd::fingerprint(hspmd::validated(c, "round trip")) != hspmd::fingerprint(c))
    std::abort();
  return 0;
}
