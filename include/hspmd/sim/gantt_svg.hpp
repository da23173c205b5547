#pragma once
// A trace (sim::chrome_trace: the simulated step's, or a run's --trace) as a Gantt chart in SVG:
// one band per process (device), its work lane -- compute blue, collectives red, idle grey --
// and beneath it a thin lane of the collectives in flight (gradient buckets) in orange; time
// across in milliseconds from the first event. Every bar has a tooltip with its name and length.
//
//     std::ofstream("step.svg") << sim::gantt_svg(trace_json, "bert on mixed-8: simulated step");
//
// hspmd-plan --simulate --gantt FILE writes the simulated step's.

#include <hspmd/io/svg.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace hspmd::sim {

[[nodiscard]] inline std::string gantt_svg(const nlohmann::json& trace, const std::string& title) {
  using io::svg_add;
  using io::svg_escaped;
  const nlohmann::json& events = trace.is_object() ? trace.at("traceEvents") : trace;
  std::map<long long, std::string> names; // pid -> "rank R (device)"
  double t0 = std::numeric_limits<double>::infinity();
  double t1 = 0.0;
  for (const auto& e : events) {
    const long long pid = e.value("pid", 0LL);
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name")
      names[pid] = e.at("args").value("name", "");
    if (e.value("ph", "") == "X") {
      names.try_emplace(pid, "process " + std::to_string(pid));
      t0 = std::min(t0, e.value("ts", 0.0));
      t1 = std::max(t1, e.value("ts", 0.0) + e.value("dur", 0.0));
    }
  }
  if (!std::isfinite(t0))
    t0 = t1 = 0.0;
  const double span = std::max(t1 - t0, 1e-9);
  constexpr double left = 190.0, width = 760.0, band = 34.0, top = 50.0;
  std::map<long long, std::size_t> row;
  for (const auto& [pid, name] : names)
    row.emplace(pid, row.size());
  const double height = top + band * static_cast<double>(names.size()) + 60.0;
  std::string out;
  svg_add(out,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "font-family=\"sans-serif\" font-size=\"11\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
          "<text x=\"10\" y=\"20\" font-size=\"14\">%s</text>\n",
          left + width + 30.0, height, svg_escaped(title).c_str());
  const auto x_of = [&](double us) { return left + width * (us - t0) / span; };
  for (const auto& [pid, name] : names) {
    const double y = top + band * static_cast<double>(row[pid]);
    svg_add(out, "<text x=\"10\" y=\"%.1f\">%s</text>\n", y + 16.0, svg_escaped(name).c_str());
  }
  for (const auto& e : events) {
    if (e.value("ph", "") != "X")
      continue;
    const int tid = e.value("tid", 0);
    if (tid == 1)
      continue; // the step's own span: the whole width
    const std::string cat = e.value("cat", "");
    const double y = top + band * static_cast<double>(row[e.value("pid", 0LL)]);
    const double ts = e.value("ts", 0.0);
    const double dur = e.value("dur", 0.0);
    const char* col = cat == "compute" ? "#4e79a7" : cat == "idle" ? "#e5e5e5" : "#e15759";
    const double lane_y = tid == 2 ? y + 24.0 : y + 2.0;
    const double lane_h = tid == 2 ? 5.0 : 20.0;
    if (tid == 2)
      col = "#f28e2b";
    svg_add(out,
            "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>%s: "
            "%.3g ms</title></rect>\n",
            x_of(ts), lane_y, std::max(width * dur / span, 0.3), lane_h, col,
            svg_escaped(e.value("name", "")).c_str(), dur / 1e3);
  }
  // The time axis.
  const double axis_y = top + band * static_cast<double>(names.size()) + 8.0;
  const double step_ms = std::pow(10.0, std::floor(std::log10(span / 1e3 / 5.0 + 1e-12)));
  const double tick = span / 1e3 / step_ms > 20.0  ? 5.0 * step_ms
                      : span / 1e3 / step_ms > 8.0 ? 2.0 * step_ms
                                                   : step_ms;
  for (double ms = 0.0; ms <= span / 1e3 + 1e-12; ms += tick) {
    const double x = x_of(t0 + ms * 1e3);
    svg_add(out,
            "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#999\"/>"
            "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">%g</text>\n",
            x, axis_y, x, axis_y + 5.0, x, axis_y + 17.0, ms);
  }
  svg_add(out,
          "<text x=\"%.0f\" y=\"%.1f\" fill=\"#555\">ms</text>\n"
          "<rect x=\"%.0f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#4e79a7\"/><text "
          "x=\"%.0f\" y=\"%.1f\">compute</text>"
          "<rect x=\"%.0f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#e15759\"/><text "
          "x=\"%.0f\" y=\"%.1f\">collectives</text>"
          "<rect x=\"%.0f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#f28e2b\"/><text "
          "x=\"%.0f\" y=\"%.1f\">in flight (gradient buckets)</text>"
          "<rect x=\"%.0f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#e5e5e5\"/><text "
          "x=\"%.0f\" y=\"%.1f\">idle</text>\n",
          left + width + 6.0, axis_y + 17.0, left, axis_y + 26.0, left + 14.0, axis_y + 35.0,
          left + 90.0, axis_y + 26.0, left + 104.0, axis_y + 35.0, left + 200.0, axis_y + 26.0,
          left + 214.0, axis_y + 35.0, left + 390.0, axis_y + 26.0, left + 404.0, axis_y + 35.0);
  out += "</svg>\n";
  return out;
}

} // namespace hspmd::sim
