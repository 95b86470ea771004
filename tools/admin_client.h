// The operator's side of the admin connection: `xsilo status` and `xsilo admin pause|resume|
// stop` dial the server with an admin kit, send one AdminRequest and read the reply.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "common/net.h"
#include "common/result.h"
#include "proto/xsilo.pb.h"

namespace xsilo::tools {

// The server's answer to a command it carried out; the error says why there is none (refused by
// the server, unreachable, a kit that is not an admin's).
struct AdminAnswer {
  std::string message;
  nlohmann::json status;  // STATUS: the federation now
};
using AdminReply = Result<AdminAnswer>;

// Dials `server` with the kit's certificate (role admin), federation from the kit's CA.
// Never throws for a network or protocol failure: the reply says what went wrong.
AdminReply admin_call(const Endpoint& server, const std::filesystem::path& kit, wire::AdminRequest::Command command,
                      std::chrono::milliseconds timeout = std::chrono::seconds(15));

// The status as people read it: a few aligned lines per section.
std::string format_status(const nlohmann::json& status);

}  // namespace xsilo::tools
