#include "tools/admin_client.h"

#include <optional>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <fmt/format.h>

#include "transport/dialer.h"
#include "transport/pki.h"
#include "transport/tls.h"

namespace xsilo::tools {

namespace {

namespace asio = boost::asio;

AdminReply failed(std::string why) { return Error(std::move(why)); }

asio::awaitable<AdminReply> call(asio::io_context& io, transport::ssl::context& tls, Endpoint server,
                                 std::string federation, wire::AdminRequest::Command command) {
  transport::ChannelOptions opts;
  opts.heartbeat_interval = std::chrono::milliseconds(0);
  // Named, not temporaries inside co_await: GCC 12 mishandles those.
  const transport::AllowList servers{wire::SERVER};
  transport::LocalInfo me;
  me.federation = federation;
  me.role = wire::ADMIN;
  auto ex = io.get_executor();
  auto dialled = co_await transport::dial_once(ex, tls, server, servers, me, opts);
  if (!dialled) co_return failed(dialled.error().message());
  auto ch = *dialled;
  ch->start();
  wire::Envelope req;
  req.set_federation(federation);
  req.mutable_admin_request()->set_command(command);
  ch->send(std::move(req));
  for (;;) {
    auto msg = co_await ch->read();
    if (!msg) {
      ch->close();
      co_return failed("no answer from the server: " + msg.error().message());
    }
    if (msg->has_error()) {
      ch->close();
      co_return failed("refused by the server: " + msg->error().message());
    }
    if (!msg->has_admin_reply()) continue;  // e.g. a Finished sent to everyone connected
    const auto& r = msg->admin_reply();
    ch->close();
    if (!r.ok()) co_return failed(r.message());
    AdminAnswer out{.message = r.message(), .status = {}};
    if (!r.status_json().empty()) out.status = nlohmann::json::parse(r.status_json(), nullptr, false);
    co_return out;
  }
}

// asio's use_future needs a default-constructible value, which a Result is not: the reply is kept
// in `out` instead.
asio::awaitable<void> call_into(std::optional<AdminReply>& out, asio::io_context& io, transport::ssl::context& tls,
                                Endpoint server, std::string federation, wire::AdminRequest::Command command) {
  out = co_await call(io, tls, std::move(server), std::move(federation), command);
}

std::string days_left(const nlohmann::json& e) {
  if (!e.contains("certificate_expires")) return "";
  return fmt::format("certificate expires {} ({} days)", e["certificate_expires"].get<std::string>(),
                     e.value("certificate_days_left", 0));
}

}  // namespace

AdminReply admin_call(const Endpoint& server, const std::filesystem::path& kit, wire::AdminRequest::Command command,
                      std::chrono::milliseconds timeout) {
  try {
    const auto files = transport::TlsFiles::from_kit(kit);
    const auto role = transport::own_identity(files).role;
    if (role != wire::ADMIN) {
      return failed("the kit " + kit.string() + " holds a " + transport::role_name(role) +
                    " certificate; status and admin commands need one issued with --role admin");
    }
    auto tls = transport::make_tls_context(files);
    asio::io_context io;
    std::optional<AdminReply> reply;
    auto done = asio::co_spawn(io, call_into(reply, io, tls, server, transport::federation_of_ca(files.ca), command),
                               asio::use_future);
    io.run_for(timeout);
    if (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      return failed("no answer from " + server.str() + " within " + std::to_string(timeout.count() / 1000) + " s");
    }
    done.get();  // rethrows what the call threw
    return std::move(*reply);
  } catch (const std::exception& e) {
    return failed(e.what());
  }
}

std::string format_status(const nlohmann::json& s) {
  std::string out;
  auto line = [&out](const std::string& l) { out += l + "\n"; };
  line(fmt::format("federation {}: round {} of {}, phase {} for {:.1f} s{}{}", s.value("federation", "?"),
                   s.value("round", 0), s.value("rounds", 0), s.value("phase", "?"), s.value("phase_seconds", 0.0),
                   s.value("paused", false) ? ", PAUSED by " + s.value("paused_by", "?") : "",
                   s.value("stopping", false) ? ", STOPPING (asked by " + s.value("stopped_by", "?") + ")" : ""));
  line(fmt::format("since this server started: {} rounds committed, {} aborted; model {}", s.value("committed", 0), s.value("aborted", 0),
                   s.value("model_sha256", "").substr(0, 16)));
  if (s.contains("awaiting_model")) {
    const auto& a = s["awaiting_model"];
    line(fmt::format("AWAITING the model of committed round {} ({}) from the silos: the state folder lost it; no "
                     "round starts until a silo's copy is in{}",
                     a.value("round", 0), a.value("model_sha256", "").substr(0, 16),
                     a.contains("asking") ? " (asking " + a.value("asking", "?") + ")" : ""));
    for (const auto& why : a.value("answered", nlohmann::json::array())) line("  could not give it: " + why.get<std::string>());
  }
  if (s.contains("server")) {
    line(fmt::format("server {} since {}; {}", s["server"].value("version", "?"), s["server"].value("started_at", "?"),
                     days_left(s["server"])));
  }
  for (const auto& d : s.value("deadlines", nlohmann::json::array())) {
    // Paused, the join deadline starts no round: a countdown to it would say one starts.
    if (s.value("paused", false) && d.value("deadline", "") == "join") {
      line(fmt::format("paused by {}: no round starts until `xsilo admin resume`", s.value("paused_by", "?")));
      continue;
    }
    line(fmt::format("deadline {} at {} (in {:.1f} s)", d.value("deadline", "?"), d.value("at", "?"), d.value("in_s", 0.0)));
  }
  const auto silos = s.value("silos", nlohmann::json::array());
  line(fmt::format("\nsilos connected: {}", silos.size()));
  for (const auto& e : silos) {
    line(fmt::format("  {:<24} {:<22} {}", e.value("silo", "?"), e.contains("edge") ? "via " + e.value("edge", "") : "direct",
                     days_left(e)));
  }
  if (s.contains("privacy")) {
    line("\nrecord-level privacy (each silo's own account, from its last counted update):");
    for (const auto& [silo, p] : s["privacy"].items()) {
      line(fmt::format("  {:<24} epsilon {:.3f} of {} (delta {})", silo, p.value("epsilon", 0.0), p.value("max_epsilon", 0.0),
                       p.value("delta", 0.0)));
    }
  }
  const auto edges = s.value("edges", nlohmann::json::array());
  line(fmt::format("edges connected: {}", edges.size()));
  for (const auto& e : edges) line(fmt::format("  {:<24} {:<22} {}", e.value("name", "?"), e.value("address", ""), days_left(e)));
  const auto members = s.value("members", nlohmann::json::array());
  if (!members.empty()) {
    line(fmt::format("\nround {}: {} selected", s.value("round", 0), members.size()));
    for (const auto& m : members) {
      line(fmt::format("  {:<24} {}{}", m.value("silo", "?"), m.value("state", "?"),
                       m.contains("reason") ? ": " + m.value("reason", "") : ""));
    }
  }
  const auto recent = s.value("recent_rounds", nlohmann::json::array());
  if (!recent.empty()) line("\nlast rounds:");
  for (const auto& r : recent) {
    line(fmt::format("  round {:<5} {:<9} {:>7.1f} s  {} of {} updates{}", r.value("round", 0), r.value("status", "?"),
                     r.value("seconds", 0.0), r.value("updates", 0), r.value("selected", 0),
                     r.contains("reason") ? "  (" + r.value("reason", "") + ")" : ""));
    for (const auto& d : r.value("dropouts", nlohmann::json::array())) {
      line(fmt::format("      - {} dropped in {} ({}): {}", d.value("silo", "?"), d.value("phase", "?"), d.value("cause", "?"),
                       d.value("reason", "")));
    }
  }
  const auto warnings = s.value("certificate_warnings", nlohmann::json::array());
  if (!warnings.empty()) line("\ncertificates to renew:");
  for (const auto& w : warnings) line("  ! " + w.get<std::string>());
  return out;
}

}  // namespace xsilo::tools
