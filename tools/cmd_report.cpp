// xsilo report tensorboard: a server's metrics.csv as TensorBoard event files (the scalars the
// sim's report.tensorboard writes: tensorboard_scalars in tools/report.cpp).
#include <cmath>
#include <cstdio>

#include "common/config.h"
#include "common/tensorboard.h"
#include "tools/commands.h"
#include "tools/sim.h"

namespace xsilo::tools {

void add_report(CLI::App& app, int& exit_code) {
  auto* report = app.add_subcommand("report", "turn a federation's records into the formats researchers read");
  report->require_subcommand(1);
  auto* tb = report->add_subcommand(
      "tensorboard", "write a server's metrics.csv (state_dir/metrics.csv) as TensorBoard event files, step = round");
  auto metrics = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  tb->add_option("metrics", *metrics, "the server's metrics.csv")->required();
  tb->add_option("out", *out, "the folder for the event files (tensorboard --logdir OUT)")->required();
  tb->callback([metrics, out, &exit_code] {
    std::vector<server::MetricsRow> rows;
    try {
      rows = server::read_metrics(*metrics);
    } catch (const std::exception& e) {
      throw ConfigError(std::string("report tensorboard: ") + e.what());
    }
    TensorBoardWriter writer(*out);
    for (const auto& r : rows) writer.write(static_cast<std::int64_t>(r.round), tensorboard_scalars(r, NAN, NAN));
    std::printf("wrote %zu rounds to %s\n", rows.size(), writer.file().string().c_str());
    exit_code = 0;
  });
}

}  // namespace xsilo::tools
