// The report's sections, each a piece of HTML drawn from a Run (tools/report_data.h). Large
// federations are drawn aggregated: at most kMostColumns columns of rounds and kMostRows rows
// of silos per grid (the same columns of rounds for bars and table rows); a bin's hover text
// gives its counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/report_data.h"
#include "tools/report_svg.h"

namespace xsilo::tools::report {

inline constexpr std::size_t kMostColumns = 40, kMostRows = 40;

// The rounds with records, in order, and the silos in row order: grouped by the edge that
// carried each most often (silos that spoke to the server straight come last), then by name.
struct Layout {
  std::vector<const Round*> rounds;
  std::vector<std::uint32_t> order;          // silo ids, row by row
  std::vector<std::size_t> row_of;           // silo id -> its row
  std::vector<std::uint32_t> primary_edge;   // silo id -> edge id
  Bins columns, rows;  // rounds per column (of grids, bar charts and the round table), silos per row
};
Layout layout_of(const Run& run);
// "12" or "12-45": the rounds of column bin `bin`.
std::string round_span(const Layout& l, std::size_t bin);

// report_grids.cpp
std::string participation_section(const Run& run, const Layout& l);
std::string decisions_section(const Run& run, const Layout& l);
std::string silos_table(const Run& run, const Layout& l);

// report_charts.cpp
std::string curves_section(const Run& run);
std::string curves_svg(const Run& run);  // the two curves as one standalone SVG (report.svg)
std::string evaluation_section(const Layout& l);
std::string timeline_section(const Layout& l);
std::string silo_time_section(const Run& run, const Layout& l);  // each silo's round in parts
std::string bytes_section(const Run& run, const Layout& l);
std::string privacy_section(const Layout& l);  // "" when no record carries privacy fields
std::string rounds_table(const Layout& l);

}  // namespace xsilo::tools::report
