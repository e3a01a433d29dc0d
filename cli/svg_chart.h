// cli/svg_chart.h — a small line chart as standalone SVG 1.1 text (W3C SVG 1.1: <svg>, <polyline>,
// <text>, <line>), for reports such as `qlora bench --sweep`'s PREFIX.svg. Torch-free; no I/O.
#pragma once
#include <string>
#include <vector>

namespace qlora {

/// One point of a series; `missing`: no value (drawn as `missing_mark` above the x position, left
/// out of the solid line).
struct ChartPoint {
  double x = 0;
  double y = 0;
  bool missing = false;
};

/// One colour: a solid line (e.g. measured) and a dashed one (e.g. estimated) over the same x.
struct ChartSeries {
  std::string label;               ///< legend text, e.g. "batch 4"
  std::vector<ChartPoint> solid;   ///< in drawing order; missing points are marked, not joined
  std::vector<ChartPoint> dashed;  ///< in drawing order (missing is ignored)
};

/// What svg_line_chart draws: the labels (plain text) and the series, x and y in the caller's units
/// (the bench: tokens and GiB).
struct LineChart {
  std::string title, x_label, y_label;
  std::string solid_legend = "solid: measured", dashed_legend = "dashed: estimated";
  std::string missing_mark = "OOM";
  std::vector<double> x_ticks;  ///< labelled x positions (printed as integers)
  std::vector<ChartSeries> series;
};

/// The chart as a complete SVG document (720 × 420 px): axes from 0 to the largest x and the
/// largest present y of any point (1 when there is none above 0), five y labels, the x ticks, one
/// colour per series (six, cycling), the legend at the right. Text is written as given: the caller
/// passes no markup characters.
std::string svg_line_chart(const LineChart& chart);

}  // namespace qlora
