// xsilo status | xsilo admin pause|resume|stop: an operator's view of a running federation and
// its hand on it, over an admin connection (docs/operations.md).
#include <iostream>

#include "common/config.h"
#include "common/net.h"
#include "tools/admin_client.h"
#include "tools/commands.h"

namespace xsilo::tools {

namespace {

struct Target {
  std::string server, kit;
  int timeout_s = 15;
};

void add_target_options(CLI::App* cmd, Target& t) {
  cmd->add_option("--server", t.server, "the server's HOST:PORT")->required();
  cmd->add_option("--kit", t.kit, "an admin kit (xsilo pki issue --role admin)")->required();
  cmd->add_option("--timeout", t.timeout_s, "seconds to wait for the answer")->check(CLI::Range(1, 3600));
}

Endpoint endpoint(const Target& t) {
  try {
    return parse_endpoint(t.server);
  } catch (const std::exception& e) {
    throw ConfigError(std::string("--server: ") + e.what());
  }
}

}  // namespace

void add_admin(CLI::App& app, int& exit_code) {
  auto* status = app.add_subcommand("status", "show a running federation: round, phase, silos, last rounds");
  auto st = std::make_shared<Target>();
  auto json = std::make_shared<bool>(false);
  add_target_options(status, *st);
  status->add_flag("--json", *json, "print the status as one JSON object");
  status->callback([st, json, &exit_code] {
    const auto r = admin_call(endpoint(*st), st->kit, wire::AdminRequest::STATUS, std::chrono::seconds(st->timeout_s));
    if (!r || !r->status.is_object()) {
      const std::string& why = r ? r->message : r.error().message();
      std::cerr << "xsilo status: " << (why.empty() ? "no status in the reply" : why) << "\n";
      exit_code = 1;
      return;
    }
    std::cout << (*json ? r->status.dump(2) + "\n" : format_status(r->status));
    exit_code = 0;
  });

  auto* admin = app.add_subcommand("admin", "pause, resume or stop a running federation (between rounds; audited)");
  admin->require_subcommand(1);
  for (auto [name, command, help] :
       {std::tuple{"pause", wire::AdminRequest::PAUSE, "start no new round until resumed (the round in progress finishes)"},
        std::tuple{"resume", wire::AdminRequest::RESUME, "start rounds again"},
        std::tuple{"stop", wire::AdminRequest::STOP, "end the federation after the round in progress"}}) {
    auto* sub = admin->add_subcommand(name, help);
    auto t = std::make_shared<Target>();
    add_target_options(sub, *t);
    sub->callback([t, command = command, &exit_code] {  // (a structured binding is not capturable in clang 14)
      const auto r = admin_call(endpoint(*t), t->kit, command, std::chrono::seconds(t->timeout_s));
      if (r) {
        std::cout << r->message << "\n";
      } else {
        std::cerr << "xsilo admin: " << r.error().message() << "\n";
      }
      exit_code = r ? 0 : 1;
    });
  }
}

}  // namespace xsilo::tools
