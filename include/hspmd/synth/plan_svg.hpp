#pragma once
// A one-level plan as an SVG picture: where the work went.
// - Shares: one bar per ratio segment, each device's share of it as a width, coloured by the
//   device's kind (faster kinds get wider pieces).
// - Devices: each device's predicted compute seconds a step and its predicted memory.
// - The predicted step: compute, communication and the all-reduce hidden behind the backward.
// - The layers: one cell per planned op, in order, coloured by its placement family
//   (replicated, split, linear: partial sums, expert), with a red tick as tall as the time of
//   the collectives before it.
//
//     std::ofstream("plan.svg") << synth::plan_svg(plan, cluster);
//
// hspmd-plan --svg FILE writes it (with --pipeline: the stage layout, program/pipeline_svg.hpp).

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/io/svg.hpp>
#include <hspmd/synth/plan.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace hspmd::synth {

/// See the file comment.
[[nodiscard]] inline std::string plan_svg(const plan& p, const cluster& c) {
  const auto& palette = io::svg_palette;
  const std::size_t n = p.device_names.size();
  std::map<std::string, std::size_t> kind_color;
  std::vector<std::string> kind(n);
  for (std::size_t d = 0; d < n; ++d) {
    const auto it = std::ranges::find(c.devices, p.device_names[d], &device_spec::name);
    kind[d] = it == c.devices.end() || it->kind.empty() ? p.device_names[d] : it->kind;
    kind_color.try_emplace(kind[d], kind_color.size() % std::size(palette));
  }
  constexpr double left = 150.0, width = 700.0, row = 22.0;
  std::string out;
  const std::size_t segments = p.ratios.size();
  const double shares_top = 60.0;
  const double devices_top = shares_top + row * static_cast<double>(segments) + 50.0;
  const double device_row = n > 64 ? 4.0 : 14.0;
  const double step_top = devices_top + device_row * static_cast<double>(n) + 50.0;
  const double layers_top = step_top + 70.0;
  const double height = layers_top + 110.0;
  io::svg_add(out,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
              "font-family=\"sans-serif\" font-size=\"11\">\n",
              left + width + 40.0, height);
  io::svg_add(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  io::svg_add(out,
              "<text x=\"10\" y=\"22\" font-size=\"14\">%s on %s: %s plan, %zu devices, predicted "
              "step %.3g ms</text>\n",
              io::svg_escaped(p.model).c_str(), io::svg_escaped(p.cluster_name).c_str(),
              io::svg_escaped(p.strategy).c_str(), n, 1e3 * p.step_time);
  // Kinds' legend.
  double lx = 10.0;
  for (const auto& [k, col] : kind_color) {
    io::svg_add(out,
                "<rect x=\"%.0f\" y=\"32\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"41\">%s</text>\n",
                lx, palette[col], lx + 14.0, io::svg_escaped(k).c_str());
    lx += 24.0 + 7.0 * static_cast<double>(k.size());
  }
  // Shares per segment.
  io::svg_add(out, "<text x=\"10\" y=\"%.0f\" font-weight=\"bold\">shares of each segment</text>\n",
              shares_top - 4.0);
  for (std::size_t s = 0; s < segments; ++s) {
    const double y = shares_top + row * static_cast<double>(s);
    const std::string label = s < p.segment_names.size() ? p.segment_names[s] : "segment";
    io::svg_add(out, "<text x=\"10\" y=\"%.0f\">%s</text>\n", y + 14.0,
                io::svg_escaped(label).c_str());
    double total = 0.0;
    for (const double r : p.ratios[s])
      total += r;
    double x = left;
    for (std::size_t d = 0; d < p.ratios[s].size() && d < n; ++d) {
      const double w = total > 0.0 ? width * p.ratios[s][d] / total : 0.0;
      io::svg_add(out,
                  "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" "
                  "stroke=\"white\" stroke-width=\"0.5\"><title>%s: %.4f</title></rect>\n",
                  x, y, w, row - 4.0, palette[kind_color[kind[d]]],
                  io::svg_escaped(p.device_names[d]).c_str(), p.ratios[s][d]);
      x += w;
    }
  }
  // Devices: compute seconds and memory.
  double most = 0.0;
  for (const double t : p.device_compute)
    most = std::max(most, t);
  io::svg_add(
      out,
      "<text x=\"10\" y=\"%.0f\" font-weight=\"bold\">predicted compute a step, and memory, by "
      "device</text>\n",
      devices_top - 4.0);
  for (std::size_t d = 0; d < n; ++d) {
    const double y = devices_top + device_row * static_cast<double>(d);
    const double t = d < p.device_compute.size() ? p.device_compute[d] : 0.0;
    const double w = most > 0.0 ? width * 0.8 * t / most : 0.0;
    io::svg_add(out,
                "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>%s: "
                "%.3g ms</title></rect>\n",
                left, y, w, device_row - 2.0, palette[kind_color[kind[d]]],
                io::svg_escaped(p.device_names[d]).c_str(), 1e3 * t);
    if (device_row >= 10.0) {
      io::svg_add(out, "<text x=\"10\" y=\"%.1f\">%s</text>\n", y + 10.0,
                  io::svg_escaped(p.device_names[d]).c_str());
      io::svg_add(
          out, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#333\">%.3g ms%s</text>\n", left + w + 4.0,
          y + 10.0, 1e3 * t,
          d < p.memory.size()
              ? (", " + std::to_string(static_cast<long long>(p.memory[d] / 1048576.0)) + " MiB")
                    .c_str()
              : "");
    }
  }
  // The predicted step.
  io::svg_add(out, "<text x=\"10\" y=\"%.0f\" font-weight=\"bold\">predicted step</text>\n",
              step_top - 4.0);
  const double parts = std::max(p.compute_time + p.comm_time, 1e-12);
  const double cw = width * p.compute_time / parts;
  const double mw = width * p.comm_time / parts;
  const double ow = width * std::min(p.overlap_time, p.comm_time) / parts;
  io::svg_add(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.2f\" height=\"18\" fill=\"#4e79a7\"/>\n",
              left, step_top, cw);
  io::svg_add(out, "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"18\" fill=\"#e15759\"/>\n",
              left + cw, step_top, mw);
  if (ow > 0.0)
    io::svg_add(out,
                "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"18\" fill=\"none\" "
                "stroke=\"black\" stroke-dasharray=\"3,2\"/>\n",
                left + cw, step_top, ow);
  io::svg_add(
      out,
      "<text x=\"%.0f\" y=\"%.0f\">compute %.3g ms, communication %.3g ms (%.3g ms of it hidden "
      "behind the backward, dashed) = %.3g ms</text>\n",
      left, step_top + 34.0, 1e3 * p.compute_time, 1e3 * p.comm_time, 1e3 * p.overlap_time,
      1e3 * p.step_time);
  // The layers: one cell per op.
  static constexpr std::pair<graph::rule::family, const char*> families[] = {
      {graph::rule::family::replicated, "#bab0ac"},
      {graph::rule::family::split, "#59a14f"},
      {graph::rule::family::linear, "#f28e2b"},
      {graph::rule::family::expert, "#b07aa1"}};
  io::svg_add(out,
              "<text x=\"10\" y=\"%.0f\" font-weight=\"bold\">ops in order: placement, and the "
              "collectives before each (red)</text>\n",
              layers_top - 4.0);
  double comm_most = 0.0;
  for (const plan_step& s : p.steps)
    comm_most = std::max(comm_most, s.comm);
  const double cell = width / static_cast<double>(std::max<std::size_t>(p.steps.size(), 1));
  for (std::size_t k = 0; k < p.steps.size(); ++k) {
    const plan_step& s = p.steps[k];
    const char* col = "#bab0ac";
    for (const auto& [f, c2] : families)
      if (s.rule.kind == f)
        col = c2;
    const double x = left + cell * static_cast<double>(k);
    io::svg_add(
        out,
        "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"20\" fill=\"%s\"><title>%s: %s, "
        "%.3g ms compute, %.3g ms communication</title></rect>\n",
        x, layers_top + 30.0, std::max(cell - 0.3, 0.2), col, io::svg_escaped(s.name).c_str(),
        detail::family_name(s.rule.kind).c_str(), 1e3 * s.compute, 1e3 * s.comm);
    if (s.comm > 0.0 && comm_most > 0.0) {
      const double h = 28.0 * s.comm / comm_most;
      io::svg_add(out,
                  "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#e15759\"/>\n",
                  x, layers_top + 28.0 - h, std::max(cell - 0.3, 0.6), h);
    }
  }
  lx = left;
  for (const auto& [f, c2] : families) {
    const std::string fam = detail::family_name(f);
    io::svg_add(out,
                "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                lx, layers_top + 60.0, c2, lx + 14.0, layers_top + 69.0, fam.c_str());
    lx += 30.0 + 7.0 * static_cast<double>(fam.size());
  }
  io::svg_add(
      out,
      "<text x=\"10\" y=\"%.0f\" fill=\"#555\">%zu ops; the tallest red tick: %.3g ms</text>\n",
      layers_top + 90.0, p.steps.size(), 1e3 * comm_most);
  out += "</svg>\n";
  return out;
}

} // namespace hspmd::synth
