#pragma once
#include <cstddef>
#include <vector>
namespace hspmd::exec {
struct moe_routing {
  static constexpr std::size_t dropped = static_cast<std::size_t>(-1);
  std::vector<std::size_t> experts;
  std::vector<std::size_t> slots;
};
template <class T>
[[nodiscard]] moe_routing route_top2(const T* probs, std::size_t tokens, std::size_t experts,
                                     std::size_t capacity) {
  moe_routing r;
  r.experts.resize(2 * tokens);
  r.slots.assign(2 * tokens, moe_routing::dropped);
  for (std::size_t t = 0; t < tokens; ++t) {
    const T* p = probs + t * experts;
    std::size_t e1 = 0;
    for (std::size_t e = 1; e < experts; ++e)
      if (p[e] > p[e1])
        e1 = e;
    std::size_t e2 = e1 == 0 ? 1 : 0;
    for (std::size_t e = 0; e < experts; ++e)
      if (e != e1 && p[e] > p[e2])
        e2 = e;
    r.experts[2 * t] = e1;
    r.experts[2 * t + 1] = e2;
  }
  std::vector<std::size_t> fill(experts, 0);
  for (std::size_t choice = 0; choice < 2; ++choice)
    for (std::size_t t = 0; t < tokens; ++t) {
      const std::size_t e = r.experts[2 * t + choice];
      if (fill[e] < capacity)
        r.slots[2 * t + choice] = fill[e]++;
    }
  return r;
}
} // namespace hspmd::exec
