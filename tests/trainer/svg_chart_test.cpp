// cli/svg_chart.h: the bench sweep's chart is a well-formed SVG document, read back by Python's
// xml.etree (an independent XML parser): one solid and one dashed polyline per series with a
// vertex per present point, a mark per missing point, the legend and the axis labels.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/files.h"
#include "cli/svg_chart.h"
#include "tests/test_util.h"

namespace qlora {
namespace {

TEST(SvgChart, ParsesAsSvgWithOnePolylinePairPerSeries) {
  LineChart c;
  c.title = "qlora bench tiny on cpu";
  c.x_label = "sequence length (tokens)";
  c.y_label = "peak RSS growth (GiB)";
  c.x_ticks = {512, 1024, 2048};
  c.series = {{"batch 1", {{512, 0.5}, {1024, 1.0}, {2048, 2.0}}, {{512, 0.4}, {1024, 0.9}, {2048, 1.9}}},
              {"batch 4", {{512, 1.5}, {1024, 3.0}, {2048, 0, /*missing=*/true}}, {{512, 1.4}, {1024, 2.9}, {2048, 6.0}}}};
  const std::filesystem::path dir = test::fresh_temp_dir("svg_chart");
  const std::string path = (dir / "chart.svg").string();
  std::ofstream(path) << svg_line_chart(c);
  const std::string py =
      "import sys, xml.etree.ElementTree as E\n"
      "r = E.parse(sys.argv[1]).getroot(); ns = '{http://www.w3.org/2000/svg}'\n"
      "assert r.tag == ns + 'svg', r.tag\n"
      "lines = r.findall(ns + 'polyline')\n"
      "print(len(lines), *[len(l.get('points').split()) for l in lines])\n"
      "print('|'.join(t.text for t in r.findall(ns + 'text')))\n";
  std::ofstream(dir / "check.py") << py;
  const test::CommandResult r =
      test::run_command(::qlora::test::python_exe() + " " + (dir / "check.py").string() + " " + path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "4 3 3 2 3");  // batch 4's 2048 point is missing
  const std::string texts = r.out.substr(r.out.find('\n') + 1);
  for (const char* t : {"qlora bench tiny on cpu", "sequence length (tokens)", "peak RSS growth (GiB)", "|512|",
                        "|2048|", "|OOM|", "|batch 1|", "|batch 4|", "|solid: measured|", "dashed: estimated",
                        "|6.00|"})  // y axis up to the largest value, 6 GiB
    EXPECT_NE(texts.find(t), std::string::npos) << t << " in " << texts;
  qlora::remove_tree(dir);
}

}  // namespace
}  // namespace qlora
