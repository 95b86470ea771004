// The report in a real browser: `xsilo sim` runs configs/report_demo.json (two edges, secure
// groups, Multi-Krum across them, a sign-flipping attacker, a silo that signs unusable keys, a
// silo killed in round 3, random-k uploads), and headless Chromium (Debian's `chromium`) draws
// the report.html the sim wrote. The screenshot must show the report's own fills; the DOM the
// browser built must hold every section and the hover texts of what happened.
#include <gtest/gtest.h>
#include <zlib.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <regex>
#include <sstream>

#include "common/fs.h"
#include "common/process.h"
#include "tests/testlib.h"

namespace xsilo::tools {
namespace {

using namespace std::chrono_literals;

// Chromium on PATH ("chromium" on Debian), or nullopt.
std::optional<std::string> chromium() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
      const auto p = std::filesystem::path(dir) / name;
      if (reachable(p)) return p.string();
    }
  }
  return std::nullopt;
}

// An 8-bit RGB or RGBA PNG, decoded (zlib, then the five scanline filters of the PNG spec).
struct Image {
  std::uint32_t width = 0, height = 0;
  std::vector<std::array<std::uint8_t, 3>> pixels;
};

std::uint32_t be32(const std::string& s, std::size_t at) {
  return static_cast<std::uint32_t>(static_cast<std::uint8_t>(s[at])) << 24 |
         static_cast<std::uint32_t>(static_cast<std::uint8_t>(s[at + 1])) << 16 |
         static_cast<std::uint32_t>(static_cast<std::uint8_t>(s[at + 2])) << 8 | static_cast<std::uint8_t>(s[at + 3]);
}

Image decode_png(const std::string& png) {
  Image img;
  if (png.size() < 8 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) throw std::runtime_error("not a PNG");
  std::string idat;
  int channels = 0;
  for (std::size_t at = 8; at + 12 <= png.size();) {
    const std::uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    if (type == "IHDR") {
      img.width = be32(png, at + 8);
      img.height = be32(png, at + 12);
      const int depth = png[at + 16], color = png[at + 17], interlace = png[at + 20];
      if (depth != 8 || (color != 2 && color != 6) || interlace != 0) throw std::runtime_error("not 8-bit RGB(A)");
      channels = color == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      idat += png.substr(at + 8, len);
    }
    at += 12 + len;
  }
  const std::size_t stride = static_cast<std::size_t>(img.width) * static_cast<std::size_t>(channels);
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(img.height) * (stride + 1));
  uLongf size = raw.size();
  if (uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      size != raw.size()) {
    throw std::runtime_error("PNG data does not inflate to its size");
  }
  std::vector<std::uint8_t> prev(stride, 0), row(stride);
  const std::size_t bpp = static_cast<std::size_t>(channels);
  for (std::uint32_t y = 0; y < img.height; ++y) {
    const std::uint8_t* in = raw.data() + y * (stride + 1);
    for (std::size_t i = 0; i < stride; ++i) {
      const int a = i >= bpp ? row[i - bpp] : 0, b = prev[i], c = i >= bpp ? prev[i - bpp] : 0;
      int pred = 0;
      switch (in[0]) {
        case 0: pred = 0; break;
        case 1: pred = a; break;
        case 2: pred = b; break;
        case 3: pred = (a + b) / 2; break;
        default: {  // Paeth
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
        }
      }
      row[i] = static_cast<std::uint8_t>(in[1 + i] + pred);
    }
    for (std::size_t x = 0; x < img.width; ++x) img.pixels.push_back({row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]});
    prev = row;
  }
  return img;
}

std::size_t count(const Image& img, std::array<std::uint8_t, 3> rgb) {
  return static_cast<std::size_t>(std::count(img.pixels.begin(), img.pixels.end(), rgb));
}

// Runs the browser on a page: `flags` then the page's file URL; its stdout in `out`.
int browse(const std::string& browser, const test::TempDir& dir, const std::vector<std::string>& flags,
           const std::filesystem::path& page, const std::filesystem::path& out) {
  std::string cmd = "exec '" + browser + "' --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run " +
                    "--user-data-dir='" + (dir / "profile").string() + "'";
  for (const auto& f : flags) cmd += " '" + f + "'";
  cmd += " 'file://" + page.string() + "' > '" + out.string() + "'";
  Process p({"/bin/sh", "-c", cmd}, dir / "browser.log");
  return p.wait(120s).value_or(-1);
}

TEST(ReportInABrowser, DrawsTheReportOfAFederationWithEdgesDropoutsAnAttackerAndCompression) {
  const auto browser = chromium();
  if (!browser) GTEST_SKIP() << "no chromium on PATH (the Debian package chromium; scripts/install-deps.sh installs it)";
  test::TempDir dir;
  const auto out = dir / "run";
  Process sim({test::xsilo_bin(), "sim", "--quiet", "--config", std::string(XSILO_SOURCE_DIR) + "/configs/report_demo.json",
               "--out", out.string()},
              dir / "sim.log");
  ASSERT_EQ(sim.wait(300s), 0) << read_file(dir / "sim.log");
  const auto page = out / "report.html";
  const std::string html = read_file(page);
  // One file: nothing fetched, nothing run.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_FALSE(std::regex_search(html, std::regex("(src|href)=['\"]?(https?:)?//")));
  // `xsilo report RUN` draws the same page from the same files.
  Process again({test::xsilo_bin(), "report", out.string(), "--out", (dir / "again.html").string()}, dir / "report.log");
  ASSERT_EQ(again.wait(60s), 0) << read_file(dir / "report.log");
  EXPECT_EQ(read_file(dir / "again.html"), html);

  ASSERT_EQ(browse(*browser, dir, {"--window-size=1000,2400", "--screenshot=" + (dir / "shot.png").string()}, page,
                   dir / "shot.log"),
            0)
      << read_file(dir / "browser.log");
  const Image shot = decode_png(read_file(dir / "shot.png"));
  ASSERT_EQ(shot.width, 1000u);
  ASSERT_EQ(shot.height, 2400u);
  const std::size_t white = count(shot, {255, 255, 255});
  EXPECT_LT(white, shot.pixels.size() * 95 / 100) << "a blank page";
  // The fills of the grids (tools/report_svg.cpp) rendered: committed, and kept by the rule.
  EXPECT_GT(count(shot, {0x1b, 0x78, 0x37}), 2000u) << "no committed cells drawn";
  EXPECT_GT(count(shot, {0x43, 0x93, 0xc3}), 2000u) << "no kept cells drawn";

  ASSERT_EQ(browse(*browser, dir, {"--dump-dom"}, page, dir / "dom.html"), 0) << read_file(dir / "browser.log");
  const std::string dom = read_file(dir / "dom.html");
  for (const char* id : {"audit", "curves", "participation", "robust", "evaluation", "timeline", "bytes", "rounds",
                         "silos", "gaps", "accuracy-chart", "participation-grid", "robust-grid", "timeline-chart",
                         "bytes-chart"}) {
    EXPECT_NE(dom.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  }
  EXPECT_NE(dom.find("<strong>VERIFIED:</strong>"), std::string::npos);
  EXPECT_NE(dom.find("8 rounds recorded: 8 committed, 0 aborted; 20 silos, 2 edges; 8 rounds under secure aggregation"),
            std::string::npos);
  EXPECT_NE(dom.find("<title>round 1, hospital-03 via edge-01: excluded as Byzantine in secure (excluded)"),
            std::string::npos);
  EXPECT_NE(dom.find("<title>round 3, hospital-05 via edge-01: dropped in "), std::string::npos);
  EXPECT_TRUE(std::regex_search(dom, std::regex("<title>round \\d, hospital-20 via edge-02: as a member of secure group "
                                                "\\d \\(the mean of \\d silos\\): filtered by multi_krum")));
  EXPECT_NE(dom.find("Uploads: compressed (random_k fraction 0.2, error feedback)"), std::string::npos);
  EXPECT_NE(dom.find("unmask (secure rounds)"), std::string::npos);
}

}  // namespace
}  // namespace xsilo::tools
