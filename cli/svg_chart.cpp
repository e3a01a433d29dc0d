// cli/svg_chart.cpp — svg_line_chart (cli/svg_chart.h).
#include "cli/svg_chart.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace qlora {

std::string svg_line_chart(const LineChart& c) {
  const double W = 720, Hh = 420, ml = 80, mr = 160, mt = 40, mb = 50;
  double xmax = 0, ymax = 0;
  for (const ChartSeries& se : c.series)
    for (const auto* line : {&se.solid, &se.dashed})
      for (const ChartPoint& p : *line) {
        xmax = std::max(xmax, p.x);
        if (!p.missing) ymax = std::max(ymax, p.y);
      }
  if (xmax <= 0) xmax = 1;  // nothing to scale by: a unit axis
  if (ymax <= 0) ymax = 1;
  auto X = [&](double v) { return ml + (W - ml - mr) * v / xmax; };
  auto Y = [&](double v) { return Hh - mb - (Hh - mt - mb) * v / ymax; };
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << Hh
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << ml << "\" y=\"22\" font-size=\"14\">" << c.title << "</text>\n"
    << "<line x1=\"" << ml << "\" y1=\"" << Hh - mb << "\" x2=\"" << W - mr << "\" y2=\"" << Hh - mb
    << "\" stroke=\"black\"/>\n<line x1=\"" << ml << "\" y1=\"" << mt << "\" x2=\"" << ml << "\" y2=\"" << Hh - mb
    << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double v = ymax * i / 4;
    s << "<text x=\"" << ml - 8 << "\" y=\"" << Y(v) + 4 << "\" text-anchor=\"end\">" << std::setprecision(2) << v
      << "</text>\n" << std::setprecision(1);
  }
  for (double t : c.x_ticks)
    s << "<text x=\"" << X(t) << "\" y=\"" << Hh - mb + 16 << "\" text-anchor=\"middle\">"
      << static_cast<long long>(t) << "</text>\n";
  s << "<text x=\"" << (W - mr + ml) / 2 << "\" y=\"" << Hh - 12 << "\" text-anchor=\"middle\">" << c.x_label
    << "</text>\n<text x=\"16\" y=\"" << Hh / 2 << "\" transform=\"rotate(-90 16 " << Hh / 2
    << ")\" text-anchor=\"middle\">" << c.y_label << "</text>\n";
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  auto points = [&](const ChartPoint& p) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(1) << X(p.x) << "," << Y(p.y) << " ";
    return o.str();
  };
  for (size_t k = 0; k < c.series.size(); ++k) {
    const ChartSeries& se = c.series[k];
    const char* col = colors[k % 6];
    std::string solid, dashed;
    for (const ChartPoint& p : se.dashed) dashed += points(p);
    for (const ChartPoint& p : se.solid) {
      if (!p.missing) {
        solid += points(p);
        continue;
      }
      s << "<text x=\"" << X(p.x) << "\" y=\"" << mt + 12 * (k + 1) << "\" fill=\"" << col
        << "\" text-anchor=\"middle\">" << c.missing_mark << "</text>\n";
    }
    s << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2\" points=\"" << solid << "\"/>\n"
      << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-dasharray=\"5,4\" points=\"" << dashed << "\"/>\n"
      << "<text x=\"" << W - mr + 10 << "\" y=\"" << mt + 18 * k + 10 << "\" fill=\"" << col << "\">" << se.label
      << "</text>\n";
  }
  s << "<text x=\"" << W - mr + 10 << "\" y=\"" << mt + 18 * c.series.size() + 20 << "\">" << c.solid_legend
    << "</text>\n<text x=\"" << W - mr + 10 << "\" y=\"" << mt + 18 * c.series.size() + 36 << "\">"
    << c.dashed_legend << "</text>\n</svg>\n";
  return s.str();
}

}  // namespace qlora
