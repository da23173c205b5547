#pragma once
// A pipeline plan's stage layout as an SVG picture: devices down (one band per group, as tall as
// its devices, the kinds it holds drawn at its left edge), the model's blocks across, each stage
// a box over its group's band and its blocks, labelled with its number, its predicted pass and
// gradient sync, the micro-batches it holds at once and its devices' shares.
//
//     std::ofstream("layout.svg") << program::layout_svg(plan, micro_graph, cluster);
//
// hspmd-plan --pipeline ... --svg FILE writes it.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/io/svg.hpp>
#include <hspmd/program/pipeline_plan.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace hspmd::program {

/// See the file comment.
[[nodiscard]] inline std::string layout_svg(const pipeline_plan& p, const graph::graph& g,
                                            const cluster& c) {
  const stage_costs costs = predicted_costs(p, g, c);
  const pipeline_memory mem = memory_of(p, g, c);
  const std::size_t blocks = graph::block_ranges(g, p.block_prefix).size();
  constexpr double left = 190.0, top = 50.0, width = 760.0, kinds_w = 14.0;
  // each group's band: at least 34 px, else in proportion to its devices within 520 px
  std::vector<double> band;
  for (std::size_t d = 0; d < p.devices(); ++d)
    band.push_back(std::max(34.0, 520.0 * static_cast<double>(p.group_sizes[d]) /
                                      static_cast<double>(p.ranks())));
  std::vector<double> y{top};
  for (double h : band)
    y.push_back(y.back() + h);
  const auto& palette = io::svg_palette;
  std::map<std::string, std::size_t> kind_color;
  for (const device_spec& dev : c.devices)
    kind_color.try_emplace(dev.kind.empty() ? dev.name : dev.kind, kind_color.size());
  const double block_w = width / static_cast<double>(std::max<std::size_t>(blocks, 1));
  const double height = y.back() + 60.0;
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"11\">\n",
                left + width + 30.0, height);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"20\" font-size=\"13\">%s: %zu stages on %zu groups (%zu "
                "devices), %s, %zu micro-batches</text>\n",
                left, io::svg_escaped(p.model).c_str(), p.stages.size(), p.devices(), p.ranks(),
                std::string(name(p.schedule)).c_str(), p.micro);
  out += buf;
  for (std::size_t b = 0; b <= blocks; b += std::max<std::size_t>(1, blocks / 10)) {
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#555\">%zu</text>\n",
                  left + static_cast<double>(b) * block_w, top - 6.0, b);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#555\">block</text>\n",
                left + width + 4.0, top - 6.0);
  out += buf;
  for (std::size_t d = 0; d < p.devices(); ++d) {
    // the group's kinds, in proportion, at the band's left edge
    const std::size_t first = p.first_rank(d), n = p.group_sizes[d];
    double at = y[d];
    std::string kinds; // "48 x H100 + 8 x A100"
    for (std::size_t r = first; r < first + n;) {
      std::size_t e = r;
      while (e + 1 < first + n && c.devices[e + 1].kind == c.devices[r].kind)
        ++e;
      const double h = band[d] * static_cast<double>(e - r + 1) / static_cast<double>(n);
      const std::string& kind = c.devices[r].kind.empty() ? c.devices[r].name : c.devices[r].kind;
      std::snprintf(buf, sizeof buf,
                    "<rect class=\"kind\" x=\"%.1f\" y=\"%.2f\" width=\"%.0f\" height=\"%.2f\" "
                    "fill=\"%s\"><title>%zu x %s</title></rect>\n",
                    left - kinds_w - 2.0, at, kinds_w, h, palette[kind_color[kind] % 8], e - r + 1,
                    io::svg_escaped(kind).c_str());
      out += buf;
      kinds += (kinds.empty() ? "" : " + ") + std::to_string(e - r + 1) + " x " + kind;
      at += h;
      r = e + 1;
    }
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">group %zu</text>\n"
                  "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">%s</text>\n",
                  left - kinds_w - 6.0, y[d] + band[d] / 2.0 - 2.0, d, left - kinds_w - 6.0,
                  y[d] + band[d] / 2.0 + 11.0, io::svg_escaped(kinds).c_str());
    out += buf;
  }
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const std::size_t d = k % p.devices();
    const std::size_t last = k + 1 < p.first_blocks.size() ? p.first_blocks[k + 1] : blocks;
    const double x0 = left + static_cast<double>(p.first_blocks[k]) * block_w;
    const double w = static_cast<double>(last - p.first_blocks[k]) * block_w;
    const synth::plan& sp = p.stages[k];
    double lo = 1.0, hi = 0.0;
    std::vector<double> shares = sp.ratios.empty() ? std::vector<double>{1.0} : sp.ratios[0];
    if (const two_level_stage* t = p.two_level_at(k)) { // (each device's share of the rows)
      shares.clear();
      for (std::size_t x = 0; x < p.group_sizes[d]; ++x)
        shares.push_back(t->row_share(x));
    }
    for (double r : shares) {
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
    std::snprintf(buf, sizeof buf,
                  "<rect class=\"stage\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                  "fill=\"%s\" fill-opacity=\"0.25\" stroke=\"#333\"><title>stage %zu: blocks "
                  "%zu-%zu on group %zu%s; pass %.4g s, sync %.4g s, %zu in flight, peak %.1f "
                  "MB, shares %.3g-%.3g</title></rect>\n",
                  x0, y[d] + 1.0, w, band[d] - 2.0, palette[k % 8], k, p.first_blocks[k], last - 1,
                  d, p.two_level_at(k) != nullptr ? " (two-level)" : "",
                  costs.stage_forward[k] + costs.stage_backward[k], costs.stage_sync[k],
                  mem.in_flight[k], *std::ranges::max_element(mem.peak[k]) / 1e6, lo, hi);
    out += buf;
    std::snprintf(
        buf, sizeof buf,
        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">%zu: %.3g s, %zu in flight</text>\n",
        x0 + 3.0, y[d] + std::min(band[d] / 2.0 + 4.0, 16.0), k,
        costs.stage_forward[k] + costs.stage_backward[k], mem.in_flight[k]);
    if (w >= 60.0)
      out += buf;
  }
  double lx = left;
  for (const auto& [kind, color] : kind_color) {
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                  "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                  lx, height - 30.0, palette[color % 8], lx + 14.0, height - 21.0,
                  io::svg_escaped(kind).c_str());
    out += buf;
    lx += 24.0 + 7.0 * static_cast<double>(kind.size());
  }
  out += "</svg>\n";
  return out;
}

} // namespace hspmd::program
