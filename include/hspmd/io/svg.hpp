#pragma once
// Writing SVG by hand: text escaped, and printf of any length into a string. The pictures
// (synth/plan_svg.hpp, sim/gantt_svg.hpp, program/pipeline_svg.hpp, train/report_svg.hpp) use
// them.

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace hspmd::io {

/// The pictures' colours for categories (device kinds, stages), in order.
inline constexpr const char* svg_palette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                              "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

/// `s` as SVG text: &, < and > escaped.
[[nodiscard]] inline std::string svg_escaped(const std::string& s) {
  std::string out;
  for (char ch : s)
    out += ch == '&'   ? std::string("&amp;")
           : ch == '<' ? std::string("&lt;")
           : ch == '>' ? std::string("&gt;")
                       : std::string(1, ch);
  return out;
}
/// printf into `out`, any length.
__attribute__((format(printf, 2, 3))) inline void svg_add(std::string& out, const char* fmt, ...) {
  va_list a;
  va_start(a, fmt);
  va_list b;
  va_copy(b, a);
  const int len = std::vsnprintf(nullptr, 0, fmt, a);
  va_end(a);
  if (len > 0) {
    std::vector<char> buf(static_cast<std::size_t>(len) + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, b);
    out.append(buf.data(), static_cast<std::size_t>(len));
  }
  va_end(b);
}

} // namespace hspmd::io
