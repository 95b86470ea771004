#include "tools/report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace xsilo::tools::report {

namespace {

// Each fill: a background tone and a pattern drawn over it (none: solid).
// Each fill: a background tone, a pattern drawn over it in `ink` (none: solid), and the colour
// of a letter written on it.
struct FillSpec {
  const char* name;
  const char* background;
  const char* ink;
  enum Kind { Solid, Diagonal, Cross, Dots, Horizontal, Vertical } kind;
  const char* letter;
};
constexpr FillSpec kFills[] = {
    {"committed", "#1b7837", "", FillSpec::Solid, "#fff"},
    {"surplus", "#e0e0e0", "#606060", FillSpec::Dots, "#000"},
    {"dropped", "#ffffff", "#d95f02", FillSpec::Diagonal, "#000"},
    {"byzantine", "#b2182b", "#f4a5a5", FillSpec::Cross, "#fff"},
    {"kept", "#4393c3", "", FillSpec::Solid, "#000"},
    {"clipped", "#ffffff", "#2166ac", FillSpec::Horizontal, "#000"},
    {"filtered", "#40004b", "#b08cc0", FillSpec::Cross, "#fff"},
    {"phase0", "#66c2a5", "", FillSpec::Solid, "#000"},
    {"phase1", "#ffffff", "#e6550d", FillSpec::Diagonal, "#000"},
    {"phase2", "#dadaeb", "#54278f", FillSpec::Dots, "#000"},
    {"phase3", "#f1b6da", "#8e0152", FillSpec::Cross, "#000"},
    {"plain", "#ffffff", "#636363", FillSpec::Vertical, "#000"},
    {"up", "#2166ac", "", FillSpec::Solid, "#fff"},
    {"down", "#ffffff", "#b2182b", FillSpec::Diagonal, "#000"},
};

const char* letter_color(const std::string& fill) {
  for (const auto& f : kFills) {
    if (fill == f.name) return f.letter;
  }
  return "#000";
}

struct SeriesLook {
  const char* color;
  const char* dash;
};
constexpr SeriesLook kLooks[] = {{"#1f77b4", ""}, {"#d62728", "7,4"}, {"#2ca02c", "2,3"}, {"#555555", "9,3,2,3"}};

// A marker of style 0..3 (circle, square, triangle, diamond) at (x, y).
std::string marker(int style, double x, double y, const char* color) {
  char b[200];
  switch (style % 4) {
    case 0: std::snprintf(b, sizeof b, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>", x, y, color); break;
    case 1: std::snprintf(b, sizeof b, "<rect x='%.1f' y='%.1f' width='6' height='6' fill='%s'/>", x - 3, y - 3, color); break;
    case 2:
      std::snprintf(b, sizeof b, "<path d='M%.1f %.1fl3.5 6h-7z' fill='%s'/>", x, y - 3.5, color);
      break;
    default: std::snprintf(b, sizeof b, "<path d='M%.1f %.1fl4 4-4 4-4-4z' fill='%s'/>", x, y - 4, color); break;
  }
  return b;
}

struct Box {
  double left, top, width, height;
};

// The svg element with its accessible name and description, and the title drawn on top.
std::string open_svg(const Frame& f, double width, double height) {
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " << width << " " << height << "' width='" << width
    << "' height='" << height << "' role='img' aria-labelledby='" << f.id << "-t " << f.id << "-d' id='" << f.id
    << "' font-family='sans-serif' font-size='11'>\n<title id='" << f.id << "-t'>" << esc(f.title) << "</title><desc id='"
    << f.id << "-d'>" << esc(f.desc) << "</desc>\n<rect width='100%' height='100%' fill='#fff'/>\n";
  return s.str();
}

// Axis labels and the plot's frame.
std::string axes(const Frame& f, const Box& b) {
  std::ostringstream s;
  s << "<rect x='" << b.left << "' y='" << b.top << "' width='" << b.width << "' height='" << b.height
    << "' fill='none' stroke='#888'/>\n<text x='" << b.left + b.width / 2 << "' y='" << b.top + b.height + 38
    << "' text-anchor='middle' font-size='12'>" << esc(f.x_label) << "</text>\n<text transform='translate(16,"
    << b.top + b.height / 2 << ") rotate(-90)' text-anchor='middle' font-size='12'>" << esc(f.y_label) << "</text>\n";
  return s.str();
}

// Five horizontal grid lines from lo to hi, labelled by `label`.
std::string y_ticks(const Box& b, double lo, double hi, const std::function<std::string(double)>& label) {
  std::ostringstream s;
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4.0;
    const double y = b.top + b.height - b.height * i / 4.0;
    s << "<line x1='" << b.left << "' x2='" << b.left + b.width << "' y1='" << y << "' y2='" << y
      << "' stroke='#eee'/><text x='" << b.left - 6 << "' y='" << y + 4 << "' text-anchor='end'>" << esc(label(v))
      << "</text>\n";
  }
  return s.str();
}

std::string reference_line(const Box& b, double y, const std::string& label) {
  std::ostringstream s;
  s << "<line x1='" << b.left << "' x2='" << b.left + b.width << "' y1='" << y << "' y2='" << y
    << "' stroke='#777' stroke-dasharray='6,4'/><text x='" << b.left + b.width - 4 << "' y='" << y - 5
    << "' text-anchor='end' fill='#444'>" << esc(label) << "</text>\n";
  return s.str();
}

}  // namespace

std::string esc(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (const char c : in) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(double v, const char* format) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? fmt(bytes, "%.0f") + " B" : fmt(bytes, "%.2f") + " " + units[u];
}

std::string fill_defs() {
  std::ostringstream s;
  s << "<svg width='0' height='0' style='position:absolute' aria-hidden='true' focusable='false'><defs>\n";
  for (const auto& f : kFills) {
    s << "<pattern id='f-" << f.name << "' width='6' height='6' patternUnits='userSpaceOnUse'"
      << (f.kind == FillSpec::Diagonal ? " patternTransform='rotate(45)'" : "") << "><rect width='6' height='6' fill='"
      << f.background << "'/>";
    switch (f.kind) {
      case FillSpec::Solid: break;
      case FillSpec::Diagonal:
      case FillSpec::Vertical: s << "<rect width='2.5' height='6' fill='" << f.ink << "'/>"; break;
      case FillSpec::Horizontal: s << "<rect width='6' height='2' fill='" << f.ink << "'/>"; break;
      case FillSpec::Dots: s << "<circle cx='3' cy='3' r='1.3' fill='" << f.ink << "'/>"; break;
      case FillSpec::Cross: s << "<path d='M0 0L6 6M6 0L0 6' stroke='" << f.ink << "' stroke-width='0.8'/>"; break;
    }
    s << "</pattern>\n";
  }
  s << "</defs></svg>\n";
  return s.str();
}

std::string legend(const std::vector<std::pair<std::string, std::string>>& items) {
  std::ostringstream s;
  s << "<ul class='legend'>";
  for (const auto& [fill, label] : items) {
    s << "<li><svg width='18' height='12' aria-hidden='true'><rect x='0.5' y='0.5' width='17' height='11' fill='url(#f-"
      << fill << ")' stroke='#333'/></svg> " << esc(label) << "</li>";
  }
  s << "</ul>\n";
  return s.str();
}

Bins bins(std::size_t items, std::size_t most) {
  Bins b;
  b.items = items;
  b.per = most == 0 || items <= most ? 1 : (items + most - 1) / most;
  return b;
}

std::string line_chart(const LineChart& c) {
  const Box b{72, 40, 800, 220};
  std::ostringstream s;
  s << open_svg(c.frame, 900, 312);
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& series : c.series) {
    for (double v : series.ys) {
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  if (c.reference) lo = std::min(lo, *c.reference), hi = std::max(hi, *c.reference);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-9) lo -= 0.5, hi += 0.5;
  const double pad = 0.05 * (hi - lo);
  lo -= pad, hi += pad;
  const double x0 = c.xs.empty() ? 0 : c.xs.front();
  const double x1 = c.xs.empty() ? 1 : std::max(c.xs.back(), x0 + 1);
  auto px = [&](double x) { return b.left + (x - x0) / (x1 - x0) * b.width; };
  auto py = [&](double y) { return b.top + b.height - (y - lo) / (hi - lo) * b.height; };
  s << "<text x='" << b.left << "' y='22' font-size='14' font-weight='bold'>" << esc(c.frame.title) << "</text>\n"
    << y_ticks(b, lo, hi, [&](double v) { return c.percent ? fmt(100 * v, "%.1f") + "%" : fmt(v, "%.3g"); });
  const int xticks = static_cast<int>(std::min<double>(10, x1 - x0));
  for (int i = 0; i <= xticks; ++i) {
    const double x = x0 + (x1 - x0) * i / std::max(1, xticks);
    s << "<text x='" << px(x) << "' y='" << b.top + b.height + 16 << "' text-anchor='middle'>" << std::lround(x)
      << "</text>\n";
  }
  s << axes(c.frame, b);
  if (c.reference) s << reference_line(b, py(*c.reference), c.reference_label);
  for (std::size_t k = 0; k < c.series.size(); ++k) {
    const auto& series = c.series[k];
    const SeriesLook& look = kLooks[series.style % 4];
    std::string points;
    auto flush = [&] {
      if (!points.empty()) {
        s << "<polyline fill='none' stroke='" << look.color << "' stroke-width='2' stroke-dasharray='" << look.dash
          << "' points='" << points << "'/>\n";
      }
      points.clear();
    };
    for (std::size_t i = 0; i < c.xs.size() && i < series.ys.size(); ++i) {
      if (!std::isfinite(series.ys[i])) {
        flush();
        continue;
      }
      points += fmt(px(c.xs[i]), "%.1f") + "," + fmt(py(series.ys[i]), "%.1f") + " ";
    }
    flush();
    if (c.xs.size() <= 60) {
      for (std::size_t i = 0; i < c.xs.size() && i < series.ys.size(); ++i) {
        if (std::isfinite(series.ys[i])) s << marker(series.style, px(c.xs[i]), py(series.ys[i]), look.color);
      }
      s << "\n";
    }
    // The legend: a sample of the line with its marker, and the series' name.
    const double ly = 20 + 14.0 * static_cast<double>(k), lx = b.left + b.width - 260;
    s << "<line x1='" << lx << "' x2='" << lx + 28 << "' y1='" << ly - 4 << "' y2='" << ly - 4 << "' stroke='"
      << look.color << "' stroke-width='2' stroke-dasharray='" << look.dash << "'/>" << marker(series.style, lx + 14, ly - 4, look.color)
      << "<text x='" << lx + 34 << "' y='" << ly << "'>" << esc(series.label) << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

std::string bar_chart(const BarChart& c) {
  const Box b{80, 40, 790, 220};
  std::ostringstream s;
  s << open_svg(c.frame, 900, 312);
  double hi = 0;
  for (const auto& bar : c.values) {
    double sum = 0;
    for (double v : bar) {
      const double x = std::isfinite(v) ? std::max(0.0, v) : 0;
      sum = c.stacked ? sum + x : std::max(sum, x);
    }
    hi = std::max(hi, sum);
  }
  if (c.reference) hi = std::max(hi, *c.reference);
  if (hi <= 0) hi = 1;
  hi *= 1.05;
  auto py = [&](double y) { return b.top + b.height - y / hi * b.height; };
  s << "<text x='" << b.left << "' y='22' font-size='14' font-weight='bold'>" << esc(c.frame.title) << "</text>\n"
    << y_ticks(b, 0, hi, c.y_text) << axes(c.frame, b);
  const std::size_t n = c.values.size(), segments = c.fills.size();
  const double slot = n ? b.width / static_cast<double>(n) : b.width;
  const std::size_t label_every = std::max<std::size_t>(1, (n + 11) / 12);
  for (std::size_t i = 0; i < n; ++i) {
    const double x = b.left + slot * static_cast<double>(i) + slot * 0.1, w = slot * 0.8;
    s << "<g>";
    if (i < c.hover.size()) s << "<title>" << esc(c.hover[i]) << "</title>";
    double base = 0;
    for (std::size_t k = 0; k < segments && k < c.values[i].size(); ++k) {
      const double v = std::isfinite(c.values[i][k]) ? std::max(0.0, c.values[i][k]) : 0;
      if (v <= 0) continue;
      const double sw = c.stacked ? w : w / static_cast<double>(segments);
      const double sx = c.stacked ? x : x + sw * static_cast<double>(k);
      const double top = py(c.stacked ? base + v : v), bottom = py(c.stacked ? base : 0);
      s << "<rect x='" << fmt(sx, "%.1f") << "' y='" << fmt(top, "%.1f") << "' width='" << fmt(sw, "%.1f")
        << "' height='" << fmt(std::max(0.5, bottom - top), "%.1f") << "' fill='url(#f-" << c.fills[k]
        << ")' stroke='#333' stroke-width='0.5'/>";
      if (c.stacked) base += v;
    }
    s << "</g>\n";
    if (i % label_every == 0 && i < c.x_labels.size()) {
      s << "<text x='" << fmt(x + w / 2, "%.1f") << "' y='" << b.top + b.height + 16 << "' text-anchor='middle'>"
        << esc(c.x_labels[i]) << "</text>\n";
    }
  }
  if (c.reference) s << reference_line(b, py(*c.reference), c.reference_label);
  s << "</svg>\n";
  std::vector<std::pair<std::string, std::string>> items;
  for (std::size_t k = 0; k < segments && k < c.labels.size(); ++k) items.emplace_back(c.fills[k], c.labels[k]);
  return s.str() + legend(items);
}

std::string grid_chart(const Grid& g) {
  std::size_t longest = 0, longest_group = 0;
  for (const auto& r : g.rows) longest = std::max(longest, r.size());
  for (const auto& r : g.row_groups) longest_group = std::max(longest_group, r.size());
  const double group_w = longest_group ? std::min<double>(120, 7.0 * static_cast<double>(longest_group) + 10) : 0;
  const double left = group_w + std::min<double>(260, 6.2 * static_cast<double>(longest) + 12);
  const double cols = static_cast<double>(std::max<std::size_t>(1, g.columns.size()));
  const double rows = static_cast<double>(std::max<std::size_t>(1, g.rows.size()));
  const double cw = std::clamp(std::floor(820.0 / cols), 3.0, 34.0), rh = std::clamp(std::floor(600.0 / rows), 6.0, 18.0);
  const Box b{left, 48, cw * cols, rh * rows};
  const bool letters = cw >= 12 && rh >= 11;
  std::ostringstream s;
  s << open_svg(g.frame, std::max(b.left + b.width + 20, 600.0), b.top + b.height + 50);
  s << "<text x='4' y='18' font-size='14' font-weight='bold'>" << esc(g.frame.title) << "</text>\n";
  std::size_t widest = 0;
  for (const auto& c : g.columns) widest = std::max(widest, c.size());
  const auto label_every = static_cast<std::size_t>(std::ceil((6.0 * static_cast<double>(widest) + 8) / cw));
  for (std::size_t c = 0; c < g.columns.size(); c += label_every) {
    const double x = b.left + cw * (static_cast<double>(c) + 0.5);
    s << "<text x='" << x << "' y='" << b.top - 6 << "' text-anchor='middle' font-size='10'>" << esc(g.columns[c])
      << "</text>\n";
  }
  std::ostringstream separators;  // between rows of different groups
  for (std::size_t r = 0; r < g.rows.size(); ++r) {
    const double y = b.top + rh * (static_cast<double>(r) + 0.5) + 3.5;
    if (rh >= 8 || r % 2 == 0) {
      s << "<text x='" << b.left - 4 << "' y='" << y << "' text-anchor='end' font-size='" << (rh >= 10 ? 10 : 8) << "'>"
        << esc(g.rows[r]) << "</text>\n";
    }
    if (r < g.row_groups.size() && (r == 0 || g.row_groups[r] != g.row_groups[r - 1])) {
      s << "<text x='4' y='" << y << "' font-size='10' font-weight='bold'>" << esc(g.row_groups[r]) << "</text>\n";
      if (r > 0) {  // drawn over the cells
        separators << "<line x1='4' x2='" << b.left + b.width << "' y1='" << b.top + rh * static_cast<double>(r)
                   << "' y2='" << b.top + rh * static_cast<double>(r) << "' stroke='#000' stroke-width='1.5'/>\n";
      }
    }
  }
  s << "<rect x='" << b.left << "' y='" << b.top << "' width='" << b.width << "' height='" << b.height
    << "' fill='none' stroke='#bbb'/>\n";
  s << "<g stroke='#fff' stroke-width='0.5'>\n";
  for (const auto& cell : g.cells) {
    s << "<rect x='" << b.left + cw * static_cast<double>(cell.column) << "' y='"
      << b.top + rh * static_cast<double>(cell.row) << "' width='" << cw << "' height='" << rh << "' fill='url(#f-"
      << cell.fill << ")'><title>" << esc(cell.hover) << "</title></rect>\n";
  }
  s << "</g>\n";
  if (letters) {  // over the cells; the cell below keeps the hover
    s << "<g text-anchor='middle' font-size='10' font-weight='bold' pointer-events='none'>";
    for (const auto& cell : g.cells) {
      if (cell.letter.empty()) continue;
      s << "<text x='" << b.left + cw * (static_cast<double>(cell.column) + 0.5) << "' y='"
        << b.top + rh * static_cast<double>(cell.row) + rh / 2 + 4 << "' fill='" << letter_color(cell.fill) << "'>"
        << esc(cell.letter) << "</text>";
    }
    s << "</g>\n";
  }
  s << separators.str() << "<text x='" << b.left + b.width / 2 << "' y='" << b.top + b.height + 20 << "' text-anchor='middle' font-size='12'>"
    << esc(g.frame.x_label) << "</text>\n<text x='4' y='" << b.top - 6 << "' font-size='12'>" << esc(g.frame.y_label)
    << "</text>\n</svg>\n";
  return s.str();
}

}  // namespace xsilo::tools::report
