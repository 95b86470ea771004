// The report's drawing vocabulary: inline SVG charts with titles, axis labels and legends, and
// fills that differ by pattern as well as by tone, so that no meaning rests on colour alone (a
// page printed in grey reads the same). Every string drawn is escaped here.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xsilo::tools::report {

std::string esc(std::string_view s);                 // for element text and quoted attributes
std::string fmt(double v, const char* format = "%.4g");
std::string bytes_text(double bytes);                // "1.50 MiB"

// The fills, by name: "committed", "surplus", "dropped", "byzantine", "kept", "clipped",
// "filtered", "phase0".."phase3", "up", "down", "plain". fill_defs() defines them once per page.
std::string fill_defs();
// An HTML legend: a swatch of each fill and its label.
std::string legend(const std::vector<std::pair<std::string, std::string>>& fills_and_labels);

// Consecutive items shown as one (rounds or silos) so that a chart has at most `most` columns.
struct Bins {
  std::size_t items = 0, per = 1;
  std::size_t count() const { return (items + per - 1) / per; }
  std::size_t first(std::size_t bin) const { return bin * per; }
  std::size_t end(std::size_t bin) const { return std::min(items, (bin + 1) * per); }
};
Bins bins(std::size_t items, std::size_t most);

// What every chart has: an id (unique in the page), a title and a description for readers
// that cannot see it, and its axes' labels.
struct Frame {
  std::string id, title, desc, x_label, y_label;
};

struct Series {
  std::string label;
  std::vector<double> ys;   // NaN: no value (the line breaks)
  int style = 0;            // 0..3: solid with circles, dashed with squares, dotted with triangles, dash-dot
};
struct LineChart {
  Frame frame;
  std::vector<double> xs;
  std::vector<Series> series;
  std::optional<double> reference;  // a dashed horizontal line, labelled
  std::string reference_label;
  bool percent = false;
};
std::string line_chart(const LineChart& c);

// Bars over x, each made of segments (stacked, or side by side when !stacked).
struct BarChart {
  Frame frame;
  std::vector<std::string> x_labels;                  // one per bar
  std::vector<std::string> fills, labels;             // one per segment
  std::vector<std::vector<double>> values;            // [bar][segment]
  std::vector<std::string> hover;                     // one per bar: its <title>
  bool stacked = true;
  std::function<std::string(double)> y_text = [](double v) { return fmt(v); };
  std::optional<double> reference;
  std::string reference_label;
};
std::string bar_chart(const BarChart& c);

// Rows x columns of cells, each a fill, an optional letter (drawn when cells are large enough)
// and a hover text. Rows may carry a group label (drawn once where it changes).
struct Grid {
  Frame frame;
  std::vector<std::string> columns, rows, row_groups;
  struct Cell {
    std::size_t row = 0, column = 0;
    std::string fill, letter, hover;
  };
  std::vector<Cell> cells;
};
std::string grid_chart(const Grid& g);

}  // namespace xsilo::tools::report
