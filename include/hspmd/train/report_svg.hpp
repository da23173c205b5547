#pragma once
// The trainer's --report DIR: the run's curves as SVG pictures, written by rank 0 at the end.
// - DIR/loss.svg: the training loss at every step, and each evaluation's loss as a dot;
// - DIR/step_time.svg: every step's time (the slowest rank's), its median without the first
//   step, and the plan's predicted and simulated step when a distributed run has them;
// plus DIR/report.json with the same numbers. A resumed run's steps are numbered from where it
// resumed.

#include <hspmd/core/error.hpp>
#include <hspmd/io/svg.hpp>
#include <hspmd/train/results.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace hspmd::train {

/// One line of a chart: points (x, y); `dots`: drawn as dots, not joined; `level`: a horizontal
/// line at the first point's y across the chart.
struct chart_curve {
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;
  bool dots = false;
  bool level = false;
};

/// A line chart of `curves` (x and y axes scaled to their points, ticks at round numbers).
[[nodiscard]] inline std::string line_chart_svg(const std::string& title,
                                                const std::string& x_label,
                                                const std::string& y_label,
                                                const std::vector<chart_curve>& curves) {
  using io::svg_add;
  using io::svg_escaped;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const chart_curve& c : curves)
    for (const auto& [x, y] : c.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        x0 = std::min(x0, x);
        x1 = std::max(x1, x);
        y0 = std::min(y0, y);
        y1 = std::max(y1, y);
      }
  if (!std::isfinite(x0))
    x0 = 0.0, x1 = 1.0, y0 = 0.0, y1 = 1.0;
  if (x1 <= x0)
    x1 = x0 + 1.0;
  if (y1 <= y0)
    y1 = y0 + std::max(std::abs(y0) * 0.1, 1e-9);
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad;
  y1 += pad;
  constexpr double left = 70.0, top = 40.0, width = 640.0, height = 300.0;
  const auto px = [&](double x) { return left + width * (x - x0) / (x1 - x0); };
  const auto py = [&](double y) { return top + height * (1.0 - (y - y0) / (y1 - y0)); };
  std::string out;
  svg_add(out,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "font-family=\"sans-serif\" font-size=\"11\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
          "<text x=\"10\" y=\"22\" font-size=\"14\">%s</text>\n"
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
          "stroke=\"#999\"/>\n",
          left + width + 200.0, top + height + 50.0, svg_escaped(title).c_str(), left, top, width,
          height);
  const auto ticks = [](double lo, double hi) {
    const double raw = (hi - lo) / 5.0;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double step = raw / mag >= 5.0 ? 5.0 * mag : raw / mag >= 2.0 ? 2.0 * mag : mag;
    std::vector<double> v;
    for (double t = std::ceil(lo / step) * step; t <= hi + 1e-12 * std::abs(hi); t += step)
      v.push_back(t);
    return v;
  };
  for (const double t : ticks(x0, x1))
    svg_add(out,
            "<line x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"#999\"/><text "
            "x=\"%.2f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#555\">%g</text>\n",
            px(t), top + height, px(t), top + height + 5.0, px(t), top + height + 18.0, t);
  for (const double t : ticks(y0, y1))
    svg_add(out,
            "<line x1=\"%.0f\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\" stroke=\"#eee\"/><text "
            "x=\"%.0f\" y=\"%.2f\" text-anchor=\"end\" fill=\"#555\">%.4g</text>\n",
            left, py(t), left + width, py(t), left - 6.0, py(t) + 4.0, t);
  svg_add(out,
          "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#333\">%s</text>\n"
          "<text x=\"14\" y=\"%.0f\" fill=\"#333\" transform=\"rotate(-90 14 %.0f)\" "
          "text-anchor=\"middle\">%s</text>\n",
          left + width / 2.0, top + height + 36.0, svg_escaped(x_label).c_str(), top + height / 2.0,
          top + height / 2.0, svg_escaped(y_label).c_str());
  double legend_y = top + 10.0;
  for (const chart_curve& c : curves) {
    if (c.points.empty())
      continue;
    if (c.level) {
      const double y = py(c.points.front().second);
      svg_add(out,
              "<line x1=\"%.0f\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\" stroke=\"%s\" "
              "stroke-dasharray=\"5,3\"/>\n",
              left, y, left + width, y, c.color.c_str());
    } else if (c.dots) {
      for (const auto& [x, y] : c.points)
        svg_add(out,
                "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"%s\"><title>%g: %.6g</title>"
                "</circle>\n",
                px(x), py(y), c.color.c_str(), x, y);
    } else {
      out += "<polyline fill=\"none\" stroke=\"" + c.color + "\" stroke-width=\"1.2\" points=\"";
      for (const auto& [x, y] : c.points)
        if (std::isfinite(y))
          svg_add(out, "%.2f,%.2f ", px(x), py(y));
      out += "\"/>\n";
    }
    svg_add(out,
            "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"3\" fill=\"%s\"/><text x=\"%.0f\" "
            "y=\"%.0f\">%s</text>\n",
            left + width + 12.0, legend_y - 4.0, c.color.c_str(), left + width + 30.0, legend_y,
            svg_escaped(c.label).c_str());
    legend_y += 16.0;
  }
  out += "</svg>\n";
  return out;
}

/// Makes `dir` (at the start of a run: a directory that cannot be made is named before step 1).
inline void make_report_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw config_error("report directory " + dir.string(),
                       "cannot be created (" + (ec ? ec.message() : "not a directory") + ")",
                       "give --report a directory rank 0 can create and write in");
}

/// Writes the pictures and report.json of `r` into `dir` (see the file comment); the files.
inline std::vector<std::filesystem::path>
write_run_report(const std::filesystem::path& dir, const std::string& name, const train_result& r) {
  const double first = static_cast<double>(r.resumed_from);
  chart_curve loss{"training loss", "#4e79a7", {}, false, false};
  for (std::size_t s = 0; s < r.losses.size(); ++s)
    loss.points.emplace_back(first + static_cast<double>(s + 1), r.losses[s]);
  chart_curve eval{"evaluation loss", "#e15759", {}, true, false};
  for (const eval_report& e : r.evals)
    eval.points.emplace_back(static_cast<double>(e.after_step), e.loss);
  chart_curve steps{"step (slowest rank)", "#4e79a7", {}, false, false};
  for (std::size_t s = 0; s < r.step_seconds.size(); ++s)
    steps.points.emplace_back(first + static_cast<double>(s + 1), 1e3 * r.step_seconds[s]);
  std::vector<chart_curve> times{steps};
  const double median = r.median_step_seconds();
  if (median > 0.0)
    times.push_back({"median " + std::to_string(1e3 * median).substr(0, 6) + " ms",
                     "#59a14f",
                     {{first + 1.0, 1e3 * median}},
                     false,
                     true});
  if (r.predicted_step_seconds > 0.0)
    times.push_back(
        {"predicted", "#f28e2b", {{first + 1.0, 1e3 * r.predicted_step_seconds}}, false, true});
  if (r.simulated_step_seconds > 0.0)
    times.push_back(
        {"simulated", "#b07aa1", {{first + 1.0, 1e3 * r.simulated_step_seconds}}, false, true});
  const std::vector<std::filesystem::path> files = {dir / "loss.svg", dir / "step_time.svg",
                                                    dir / "report.json"};
  nlohmann::json j{{"model", name},
                   {"first_step", r.resumed_from + 1},
                   {"losses", r.losses},
                   {"step_seconds", r.step_seconds},
                   {"median_step_seconds", median},
                   {"predicted_step_seconds", r.predicted_step_seconds},
                   {"simulated_step_seconds", r.simulated_step_seconds}};
  j["evals"] = nlohmann::json::array();
  for (const eval_report& e : r.evals)
    j["evals"].push_back({{"after_step", e.after_step}, {"loss", e.loss}});
  const std::string texts[] = {line_chart_svg(name + ": loss", "step", "loss", {loss, eval}),
                               line_chart_svg(name + ": step time", "step", "ms", times),
                               j.dump(1) + "\n"};
  for (std::size_t k = 0; k < files.size(); ++k) {
    std::ofstream f(files[k]);
    f << texts[k];
    if (!f)
      throw config_error(files[k].string(), "cannot be written",
                         "give --report a directory rank 0 can write in");
  }
  return files;
}

} // namespace hspmd::train
