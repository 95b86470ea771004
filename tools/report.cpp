// report.svg / report.html: accuracy and loss per round, readable in any browser.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/fs.h"
#include "tools/sim.h"

namespace xsilo::tools {

namespace {

// One panel: a polyline of ys over xs inside the box (x0, y0, w, h).
std::string panel(const std::string& title, const std::vector<double>& xs,
                  const std::vector<double>& ys, double x0, double y0, double w, double h,
                  const std::string& color, double ref, bool percent) {
  std::ostringstream s;
  // Values not measured (NaN: a script that does not evaluate) are left out of the scale and the line.
  double lo = INFINITY, hi = -INFINITY;
  for (double y : ys) {
    if (std::isnan(y)) continue;
    lo = std::min(lo, y);
    hi = std::max(hi, y);
  }
  if (lo > hi) lo = 0, hi = 1;
  if (ref >= 0) {
    lo = std::min(lo, ref);
    hi = std::max(hi, ref);
  }
  if (hi - lo < 1e-9) {
    hi += 0.5;
    lo -= 0.5;
  }
  const double pad = 0.05 * (hi - lo);
  lo -= pad;
  hi += pad;
  const double xmin = xs.empty() ? 0 : xs.front(), xmax = xs.empty() ? 1 : std::max(xs.back(), xmin + 1);
  auto px = [&](double x) { return x0 + (x - xmin) / (xmax - xmin) * w; };
  auto py = [&](double y) { return y0 + h - (y - lo) / (hi - lo) * h; };
  s << "<text x='" << x0 << "' y='" << y0 - 10 << "' font-size='15' font-weight='bold'>" << title << "</text>\n";
  s << "<rect x='" << x0 << "' y='" << y0 << "' width='" << w << "' height='" << h
    << "' fill='none' stroke='#888'/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4.0;
    char label[32];
    std::snprintf(label, sizeof label, percent ? "%.1f%%" : "%.3f", percent ? 100 * v : v);
    s << "<line x1='" << x0 << "' x2='" << x0 + w << "' y1='" << py(v) << "' y2='" << py(v)
      << "' stroke='#eee'/><text x='" << x0 - 6 << "' y='" << py(v) + 4
      << "' font-size='11' text-anchor='end'>" << label << "</text>\n";
  }
  const int xticks = static_cast<int>(std::min<double>(10, xmax - xmin));
  for (int i = 0; i <= xticks; ++i) {
    const double x = xmin + (xmax - xmin) * i / std::max(1, xticks);
    s << "<text x='" << px(x) << "' y='" << y0 + h + 16 << "' font-size='11' text-anchor='middle'>"
      << static_cast<long>(std::lround(x)) << "</text>\n";
  }
  s << "<text x='" << x0 + w / 2 << "' y='" << y0 + h + 34 << "' font-size='12' text-anchor='middle'>round</text>\n";
  if (ref >= 0) {
    s << "<line x1='" << x0 << "' x2='" << x0 + w << "' y1='" << py(ref) << "' y2='" << py(ref)
      << "' stroke='#999' stroke-dasharray='6,4'/><text x='" << x0 + w - 4 << "' y='" << py(ref) - 5
      << "' font-size='11' text-anchor='end' fill='#666'>centralized</text>\n";
  }
  s << "<polyline fill='none' stroke='" << color << "' stroke-width='2' points='";
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (!std::isnan(ys[i])) s << px(xs[i]) << "," << py(ys[i]) << " ";
  }
  s << "'/>\n";
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (std::isnan(ys[i])) continue;
    s << "<circle cx='" << px(xs[i]) << "' cy='" << py(ys[i]) << "' r='2.5' fill='" << color << "'/>\n";
  }
  return s.str();
}

}  // namespace

void write_report(const std::filesystem::path& out, const std::string& title,
                  const std::vector<double>& rounds, const std::vector<double>& accuracy,
                  const std::vector<double>& loss, double baseline_accuracy) {
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='980' height='400' font-family='sans-serif'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='20' y='24' font-size='17'>xsilo sim: " << title << "</text>\n"
      << panel("Test accuracy", rounds, accuracy, 80, 70, 380, 260, "#1f77b4", baseline_accuracy, true)
      << panel("Test loss", rounds, loss, 570, 70, 380, 260, "#d62728", -1, false) << "</svg>\n";
  atomic_write_file(out / "report.svg", svg.str());
  std::ostringstream html;
  html << "<!doctype html><html><head><meta charset='utf-8'><title>xsilo sim: " << title
       << "</title></head><body style='font-family:sans-serif'>\n"
       << svg.str() << "<table border='1' cellpadding='4' style='border-collapse:collapse'>"
       << "<tr><th>round</th><th>test accuracy</th><th>test loss</th></tr>\n";
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    char acc[32] = "not measured", l[32] = "not measured", row[160];
    if (!std::isnan(accuracy[i])) std::snprintf(acc, sizeof acc, "%.2f%%", 100 * accuracy[i]);
    if (!std::isnan(loss[i])) std::snprintf(l, sizeof l, "%.4f", loss[i]);
    std::snprintf(row, sizeof row, "<tr><td>%.0f</td><td>%s</td><td>%s</td></tr>\n", rounds[i], acc, l);
    html << row;
  }
  html << "</table>";
  if (baseline_accuracy >= 0) {
    char b[128];
    std::snprintf(b, sizeof b, "<p>Centralized training on the pooled data: %.2f%%</p>", 100 * baseline_accuracy);
    html << b;
  }
  html << "</body></html>\n";
  atomic_write_file(out / "report.html", html.str());
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const server::MetricsRow& r, double test_accuracy,
                                                                double test_loss) {
  std::vector<std::pair<std::string, double>> s = {{"round/committed", r.committed ? 1 : 0},
                                                   {"round/silos_reporting", static_cast<double>(r.reported)},
                                                   {"round/dropped", static_cast<double>(r.dropped)},
                                                   {"round/seconds", r.seconds},
                                                   {"round/upload_bytes", static_cast<double>(r.upload_bytes)}};
  if (r.committed) s.emplace_back("train/loss", r.train_loss);
  if (!std::isnan(test_accuracy)) s.emplace_back("test/accuracy", test_accuracy);
  if (!std::isnan(test_loss)) s.emplace_back("test/loss", test_loss);
  if (r.fed_eval_accuracy > 0 || r.fed_eval_loss > 0) {
    s.insert(s.end(), {{"federated_eval/accuracy", r.fed_eval_accuracy}, {"federated_eval/loss", r.fed_eval_loss}});
  }
  return s;
}

}  // namespace xsilo::tools
