#include "server/daemon.h"
#include "server/config_privacy.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <fstream>
#include <iostream>
#include <deque>
#include <map>
#include <set>

#include "common/config.h"
#include "transport/tls.h"
#include "common/fs.h"
#include "common/mlp.h"
#include "protocol/round_start.h"
#include "common/prometheus.h"
#include "common/build_info.h"
#include "common/process.h"
#include "common/thread_check.h"
#include "server/broadcast_planner.h"
#include "server/config_privacy.h"
#include "server/coordinator.h"
#include "server/state.h"
#include "transport/deadline_timer.h"
#include "transport/listener.h"
#include "transport/metrics_endpoint.h"
#include "transport/runtime.h"
#include "protocol/tensor_stream.h"

namespace xsilo::server {

namespace asio = boost::asio;

namespace {

// The CPU time this process has used, user and system, every thread (`xsilo bench round`
// compares it with what the bytes' encryption and hashing alone cost).
double process_cpu_seconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class Server {
 public:
  Server(const ServerConfig& cfg, ServerState& state, Coordinator& coord, std::unique_ptr<ServerHook> hook)
      : cfg_(cfg), state_(state), coord_(coord), rt_(cfg.network_threads), hook_(std::move(hook)),
        broadcasts_(cfg.broadcasts_at_once),
        tls_(transport::make_tls_context(cfg.tls)),
        events_(cfg.state_dir / "events.jsonl", std::ios::app) {
    for (auto t : {Timer::Join, Timer::Train, Timer::Upload, Timer::SecAgg, Timer::Unmask}) {
      timers_.emplace(t, std::make_unique<transport::DeadlineTimer>(rt_.io()));
    }
    declare_metrics();
  }

  // Binds the listening port: a port in use is the operator's to mend (exit 2), found before
  // anything is written to the audit log.
  void bind() {
    try {
      listener_ = std::make_unique<transport::Listener>(
          rt_.io().get_executor(), tls_, cfg_.listen, cfg_.channel, cfg_.allow,
          transport::LocalInfo{cfg_.federation, wire::SERVER, {"plain", "edges"}},
          [this](std::shared_ptr<transport::Channel> ch) { on_channel(std::move(ch)); }, [this] { return coord_.round(); });
      // Each connection's TLS on one of the network threads; the coordinator on the core's.
      listener_->place_connections([this] { return rt_.connection_executor(); });
    } catch (const boost::system::system_error& e) {
      throw ConfigError("config " + cfg_.file.string() + ": .listen: cannot listen on " + cfg_.listen.host + ":" +
                        std::to_string(cfg_.listen.port) + ": " + e.code().message());
    }
  }

  int run() {
    const int code = rt_.run(
        [this] {
          listener_->start();
          spdlog::info("server for federation {} listening on {}:{}", cfg_.federation, cfg_.listen.host,
                       listener_->port());
          if (!cfg_.port_file.empty()) atomic_write_file(cfg_.port_file, std::to_string(listener_->port()) + "\n");
          metrics_endpoint_ = transport::start_metrics(rt_.io().get_executor(), cfg_.metrics, metrics_,
                                                       [this] { refresh_metrics(); });
          if (auto paused = read_pause_file()) coord_.start_paused(*paused);
          if (rt_.network_threads() > 1) spdlog::info("{} network threads", rt_.network_threads());
          coord_.start(now_ms());
          drain();
        },
        [this](int) {
          // Only a round past its join (members chosen, updates coming) has anything to lose.
          const Phase p = coord_.phase();
          if (p == Phase::Collecting || p == Phase::Unmasking || p == Phase::Closing) {
            spdlog::warn("stopping; round {} in progress is not committed", coord_.round());
          } else {
            spdlog::warn("stopping; no round in progress");
          }
          shutdown(130);
        });
    write_stats();
    return code;
  }

 private:
  void on_channel(std::shared_ptr<transport::Channel> ch) {
    if (stopping_) {
      ch->close_with_error(wire::SHUTTING_DOWN, "the server is shutting down");
      return;
    }
    const SessionId id = ++next_id_;
    channels_[id] = ch;
    if (ch->peer().role == wire::ADMIN) {
      // An operator's tool: no part in the rounds, only AdminRequests.
      spdlog::info("admin {} connected from {}", ch->peer().name, ch->remote());
      asio::co_spawn(rt_.io(), serve(id, ch), asio::detached);
      return;
    }
    if (ch->peer().role == wire::EDGE) {
      coord_.on_edge_connect(id, ch->peer().name, now_ms());
    } else {
      coord_.on_connect(id, ch->peer().name, now_ms());
    }
    drain();
    asio::co_spawn(rt_.io(), serve(id, ch), asio::detached);
  }

  asio::awaitable<void> serve(SessionId id, std::shared_ptr<transport::Channel> ch) {
    // Named, not a temporary inside co_await: GCC 12 destroys such temporaries twice.
    const bool admin = ch->peer().role == wire::ADMIN;
    std::function<bool(const proto::Message&)> handle = [this, id, admin, ch](const proto::Message& msg) {
      const wire::Envelope& e = msg.env;
      if (e.has_admin_request()) {
        on_admin_request(*ch, e.admin_request());
        return true;
      }
      if (admin) {
        ch->close_with_error(wire::UNEXPECTED, "an admin connection carries AdminRequests only, got " + proto::body_name(e));
        return false;
      }
      if (hook_ && msg.viewed) {
        hooked_in(id, *ch, msg.owned());  // a hook sees whole Envelopes
      } else if (hook_) {
        hooked_in(id, *ch, msg.env);
      }
      coord_.on_message(id, msg, now_ms());
      drain();
      return true;
    };
    co_await transport::serve_messages(ch, handle);
    bytes_in_ += ch->bytes_received();
    bytes_out_ += ch->bytes_sent();
    channels_.erase(id);
    if (admin) co_return;
    coord_.on_disconnect(id, now_ms());
    drain();
  }

  // ---- operators: xsilo status and xsilo admin ----

  void on_admin_request(transport::Channel& ch, const wire::AdminRequest& req) {
    const auto& who = ch.peer();
    wire::Envelope reply;
    reply.set_federation(cfg_.federation);
    reply.set_round(coord_.round());
    auto* r = reply.mutable_admin_reply();
    const std::string command = wire::AdminRequest::Command_Name(req.command());
    if (who.role != wire::ADMIN) {
      // A silo's or an edge's certificate, directly or relayed: refused, logged, counted.
      ++admin_refused_;
      // Logged at most once a second: a silo cannot flood the log with them.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_refusal_log_ > std::chrono::seconds(1)) {
        last_refusal_log_ = now;
        spdlog::warn("refused admin command {} from {} at {}: only an admin certificate (allow.admin) may send it "
                     "({} refused so far)",
                     command, who.str(), ch.remote(), admin_refused_);
      }
      reply.mutable_error()->set_code(wire::NOT_ALLOWED);
      reply.mutable_error()->set_message("admin commands need an admin certificate; this is " + who.str());
      ch.send(std::move(reply));
      return;
    }
    if (req.command() == wire::AdminRequest::STATUS) {
      r->set_ok(true);
      r->set_status_json(status().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    } else {
      const auto [ok, message] = coord_.admin(req.command(), who.name, now_ms());
      spdlog::info("admin {}: {} -> {}", who.name, command, message);
      std::string saved;
      try {
        if (ok) write_pause_file(req.command(), who.name);
      } catch (const std::exception& e) {
        saved = "; but " + pause_file().string() + " could not be updated (" + e.what() +
                "): a server restarted now would not know";
        spdlog::error("admin {}: {}{}", who.name, command, saved);
      }
      r->set_ok(ok);
      r->set_message(message + saved);
      drain();
    }
    ch.send(std::move(reply));
  }

  // The pause outlives a restart: a server restarted while paused starts paused.
  std::filesystem::path pause_file() const { return cfg_.state_dir / "paused.json"; }
  void write_pause_file(wire::AdminRequest::Command command, const std::string& admin) {
    // A stop ends the pause too: a server started again afterwards goes on.
    if (command == wire::AdminRequest::PAUSE) {
      atomic_write_file(pause_file(), nlohmann::json{{"by", admin}, {"since", iso_time(now_ms())}}.dump() + "\n");
    } else {
      std::filesystem::remove(pause_file());
    }
  }
  std::optional<std::string> read_pause_file() const {
    if (!std::filesystem::exists(pause_file())) return std::nullopt;
    try {
      return nlohmann::json::parse(read_file(pause_file())).at("by").get<std::string>();
    } catch (const std::exception& e) {
      spdlog::warn("{} unreadable ({}): starting paused anyway; `xsilo admin resume` goes on", pause_file().string(), e.what());
      return std::string("?");
    }
  }

  static std::string expiry_text(std::chrono::system_clock::time_point t) {
    return t == std::chrono::system_clock::time_point{} ? "" : transport::utc_day(t);
  }

  nlohmann::json status() {
    const auto now = now_ms();
    nlohmann::json j = coord_.status(now);
    const auto clock_now = std::chrono::system_clock::now();
    auto expiry = [&](nlohmann::json& e, const transport::PeerIdentity& id) {
      if (id.not_after == std::chrono::system_clock::time_point{}) return;
      e["certificate_expires"] = expiry_text(id.not_after);
      e["certificate_days_left"] = transport::days_left(id.not_after, clock_now);
      if (auto w = transport::expiry_warning(id, cfg_.channel.certificate_warn_days, clock_now); !w.empty()) {
        j["certificate_warnings"].push_back(w);
      }
    };
    j["certificate_warnings"] = nlohmann::json::array();
    j["time"] = iso_time(now);
    j["server"] = {{"version", build_info()}, {"started_at", iso_time(started_ms_)}, {"port", listener_ ? listener_->port() : 0}};
    expiry(j["server"], server_identity_);
    std::map<std::string, const transport::PeerIdentity*> direct;
    nlohmann::json edges = nlohmann::json::array(), admins = nlohmann::json::array();
    for (const auto& [id, ch] : channels_) {
      const auto& peer = ch->peer();
      if (peer.role == wire::SILO) direct[peer.name] = &peer;
      if (peer.role != wire::EDGE && peer.role != wire::ADMIN) continue;
      nlohmann::json e = {{"name", peer.name}, {"address", ch->remote()}};
      expiry(e, peer);
      (peer.role == wire::EDGE ? edges : admins).push_back(std::move(e));
    }
    for (auto& e : j["silos"]) {
      const std::string silo = e["silo"];
      if (auto it = direct.find(silo); it != direct.end() && !e.contains("edge")) {
        expiry(e, *it->second);
      } else if (auto t = coord_.relayed_not_after(silo)) {
        expiry(e, transport::PeerIdentity{silo, wire::SILO, std::chrono::system_clock::from_time_t(*t)});
      }
    }
    j["edges"] = std::move(edges);
    j["admins"] = std::move(admins);
    nlohmann::json deadlines = nlohmann::json::array();
    for (const auto& [timer, due] : deadlines_) {
      deadlines.push_back({{"deadline", timer_name(timer)}, {"at", iso_time(due)}, {"in_s", static_cast<double>(due - now) / 1000.0}});
    }
    j["deadlines"] = std::move(deadlines);
    return j;
  }

  static const char* timer_name(Timer t) {
    switch (t) {
      case Timer::Join: return "join";
      case Timer::Train: return "train";
      case Timer::Upload: return "upload";
      case Timer::SecAgg: return "secure_keys";
      case Timer::Unmask: return "unmask";
    }
    return "?";
  }

  // ---- metrics ----

  void declare_metrics() {
    using T = MetricRegistry::Type;
    transport::declare_daemon_metrics(metrics_, "server", cfg_.tls);
    auto& m = metrics_;
    m.declare("xsilo_rounds_total", T::Counter, "Rounds finished since this server started, by status", true);
    m.declare("xsilo_round", T::Gauge, "The round in progress or next");
    m.declare("xsilo_paused", T::Gauge, "1 while an admin has paused the federation");
    m.declare("xsilo_phase_duration_seconds", T::Summary,
              "Time spent in each phase of a round (join, collect, unmask, commit)", true);
    m.declare("xsilo_silos_connected", T::Gauge, "Silos connected, directly or through an edge");
    m.declare("xsilo_edges_connected", T::Gauge, "Edge aggregators connected");
    m.declare("xsilo_upload_bytes_total", T::Counter, "Bytes of updates and partial sums uploaded");
    m.declare("xsilo_upload_throughput_bytes_per_second", T::Gauge,
              "The last finished round's upload bytes over its duration");
    m.declare("xsilo_dropouts_total", T::Counter, "Silos dropped from a round, by cause", true);
    m.declare("xsilo_secure_group_failures_total", T::Counter, "Secure groups whose sum could not be used");
    m.declare("xsilo_robust_rejections_total", T::Counter, "Inputs a robust rule left out");
    m.declare("xsilo_admin_commands_total", T::Counter, "Admin commands that changed something (pause, resume, stop)");
    for (const char* status : {"committed", "aborted"}) m.set("xsilo_rounds_total", 0, {{"status", status}});
  }

  void refresh_metrics() {
    auto& m = metrics_;
    std::uint64_t in = bytes_in_, out = bytes_out_;
    std::size_t edges = 0;
    for (const auto& [id, ch] : channels_) {
      in += ch->bytes_received();
      out += ch->bytes_sent();
      edges += ch->peer().role == wire::EDGE ? 1 : 0;
    }
    auto refused = listener_ ? listener_->refused_by_reason() : std::map<std::string, std::uint64_t>{};
    if (admin_refused_) refused["admin_not_allowed"] = admin_refused_;
    transport::set_connection_metrics(m, in, out, refused);
    m.set("xsilo_rounds_total", static_cast<double>(coord_.committed()), {{"status", "committed"}});
    m.set("xsilo_rounds_total", static_cast<double>(coord_.aborted()), {{"status", "aborted"}});
    m.set("xsilo_round", static_cast<double>(coord_.round()));
    m.set("xsilo_paused", coord_.paused() ? 1 : 0);
    const auto& t = coord_.totals();
    for (const auto& [phase, st] : t.phase_seconds) m.set_summary("xsilo_phase_duration_seconds", st.first, st.second, {{"phase", phase}});
    m.set("xsilo_silos_connected", static_cast<double>(coord_.connected()));
    m.set("xsilo_edges_connected", static_cast<double>(edges));
    m.set("xsilo_upload_bytes_total", static_cast<double>(t.upload_bytes));
    if (!coord_.recent().empty()) {
      const auto& last = coord_.recent().back();
      const double secs = static_cast<double>(last.ended_ms - last.started_ms) / 1000.0;
      m.set("xsilo_upload_throughput_bytes_per_second", secs > 0 ? static_cast<double>(last.upload_bytes) / secs : 0);
    }
    for (const auto& [cause, n] : t.dropouts) m.set("xsilo_dropouts_total", static_cast<double>(n), {{"cause", cause}});
    m.set("xsilo_secure_group_failures_total", static_cast<double>(t.secure_group_failures));
    m.set("xsilo_robust_rejections_total", static_cast<double>(t.robust_rejected));
    m.set("xsilo_admin_commands_total", static_cast<double>(t.admin_commands));
  }

  // Every call into the coordinator is followed by a drain: the core's thread is the only one
  // that may make them (transport/runtime.h).
  void drain() {
    core_.check("the server's coordinator (on the core's network thread only)");
    for (auto& a : coord_.take_actions()) std::visit([this](auto& x) { apply(x); }, a);
  }

  transport::Channel* channel(SessionId id) {
    auto it = channels_.find(id);
    return it == channels_.end() ? nullptr : it->second.get();
  }

  void apply(action::Send& a) {
    auto* ch = channel(a.to);
    if (!ch) return;
    if (hook_) {
      const std::string silo = a.env.silo().empty() && ch->peer().role == wire::SILO ? ch->peer().name : a.env.silo();
      if (!silo.empty() && !hook_->to_silo(silo, a.env)) return;
    }
    ch->send(std::move(a.env));
    if (hook_) send_hooked();
  }
  // A simulation's hook (ServerHook) sees a silo's message, and its own messages go out by the
  // route the silo's last message came in on.
  void hooked_in(SessionId id, const transport::Channel& ch, const wire::Envelope& e) {
    const bool relayed = ch.peer().role == wire::EDGE;
    const std::string silo = relayed ? e.silo() : ch.peer().name;
    if (silo.empty()) return;
    hook_routes_[silo] = {id, relayed};
    hook_->from_silo(silo, e);
    send_hooked();
  }
  void send_hooked() {
    for (auto& [silo, e] : hook_->take_out()) {
      const auto route = hook_routes_.find(silo);
      auto* ch = route == hook_routes_.end() ? nullptr : channel(route->second.first);
      if (!ch) continue;
      if (route->second.second) e.set_silo(silo);
      ch->send(std::move(e));
    }
  }
  // Model streams go out as the broadcast planner says (server/broadcast_planner.h): by
  // default to every receiver at once, each paced by its own connection's writes.
  // A running stream's place in the planner; when the stream ends, written whole or dropped with
  // its connection, the place is given back (and a whole one goes into the members' timeline).
  struct BroadcastSlot {
    BroadcastSlot(Server* s, SessionId to, std::uint64_t round) : server(s), to(to), round(round) {}
    BroadcastSlot(const BroadcastSlot&) = delete;
    BroadcastSlot& operator=(const BroadcastSlot&) = delete;
    Server* server;
    SessionId to;
    std::uint64_t round;
    bool whole = false;  // its last frame was made
    ~BroadcastSlot() {
      asio::post(server->rt_.io(), [s = server, to = to, round = round, whole = whole] {
        if (whole) s->coord_.on_model_sent(to, round, now_ms());
        s->broadcasts_.finished();
        s->start_broadcasts();
      });
    }
  };
  void apply(action::SendModel& a) {
    broadcasts_.add(std::move(a));
    start_broadcasts();
  }
  void start_broadcasts() {
    while (auto next = broadcasts_.next()) {
      auto a = std::move(*next);
      auto* ch = channel(a.to);
      if (!ch || !ch->is_open()) {
        broadcasts_.finished();
        continue;
      }
      auto src = a.delta ? std::make_shared<protocol::ChunkSource>(a.delta, cfg_.federation, a.round)
                         : std::make_shared<protocol::ChunkSource>(a.model, a.model->flat(), a.model->tensors(),
                                                                   cfg_.federation, a.round, cfg_.chunk_bytes);
      // The slot is released when the stream is finished or dropped with its connection.
      auto slot = std::make_shared<BroadcastSlot>(this, a.to, a.round);
      ch->send_stream([src, slot, max = cfg_.channel.max_frame_bytes] {
        auto frame = src->next_frame(max);
        if (!frame) slot->whole = true;
        return frame;
      });
    }
  }
  void apply(action::Close& a) {
    if (auto* ch = channel(a.id)) ch->close_with_error(a.code, a.reason);
  }
  void apply(action::StartTimer& a) {
    const Timer which = a.timer;
    deadlines_[which] = now_ms() + a.after.count();
    timers_.at(which)->start(a.after, [this, which] {
      deadlines_.erase(which);
      coord_.on_timer(which, now_ms());
      drain();
    });
  }
  void apply(action::CancelTimer& a) {
    timers_.at(a.timer)->cancel();
    deadlines_.erase(a.timer);
  }
  // A job that throws stops the server with exit code 1 (the runtime logs why); committed
  // rounds are safe on disk.
  void apply(action::Job& a) {
    rt_.work<JobResult>(std::move(a.work), [this, id = a.id](JobResult result) {
      coord_.on_job_done(id, std::move(result), now_ms());
      drain();
    });
  }
  void apply(action::Background& a) { rt_.background(std::move(a.work)); }
  void apply(action::Stop& a) {
    spdlog::error("stopping: {}", a.reason);
    std::cerr << "xsilo server: " << a.reason << "\n";
    shutdown(2);
  }
  // Progress events, one JSON object per line, for whoever follows the federation (xsilo sim
  // fires its rehearsed faults from them).
  void apply(action::Event& a) {
    const nlohmann::json e = {{"time", iso_time(now_ms())}, {"event", a.name}, {"round", a.round}, {"detail", a.detail}};
    events_ << e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n' << std::flush;
    if (a.name == "round_started") warn_relayed_expiry();
    // Every connection of a round is open when its collection closes: that is the sample
    // server_stats.json keeps the largest of (xsilo bench round reports it).
    if (a.name == "round_closed") {
      if (const auto r = process_resources()) peak_descriptors_ = std::max(peak_descriptors_, r->open_descriptors);
    }
  }
  // Silos behind edges: their certificates reach the server inside their signed joins. Each one
  // about to expire is named once per server run (the edge warns of its own connections).
  void warn_relayed_expiry() {
    for (const auto& m : coord_.members()) {
      if (!m.via_edge() || warned_.count(m.silo)) continue;
      const auto t = coord_.relayed_not_after(m.silo);
      if (!t) continue;
      const transport::PeerIdentity id{m.silo, wire::SILO, std::chrono::system_clock::from_time_t(*t)};
      if (auto w = transport::expiry_warning(id, cfg_.channel.certificate_warn_days); !w.empty()) {
        spdlog::warn("{} (behind edge {})", w, m.edge);
        warned_.insert(m.silo);
      }
    }
  }
  void apply(action::Finished& a) {
    spdlog::info("federation finished: {} rounds committed, {} aborted", a.committed, a.aborted);
    nlohmann::json rec = {{"event", "federation_end"},
                          {"federation", cfg_.federation},
                          {"rounds_committed", a.committed},
                          {"rounds_aborted", a.aborted},
                          {"reason", a.reason},
                          {"model_sha256", coord_.model_sha256()},
                          {"time", iso_time(now_ms())}};
    // On the worker, after every record queued before it (an admin's stop is one): the audit
    // log has one writer. Then the Finished messages get time to reach the silos.
    // The federation ran to its end (or an operator stopped it): a success whatever rounds
    // aborted on the way, which the audit log and the metrics say (a service manager must not
    // restart a server whose work is done).
    rt_.work<int>(
        [this, rec = std::move(rec)] {
          state_.record(rec, nullptr);
          return 0;
        },
        [this](int) { shutdown(0, std::chrono::milliseconds(300)); });
  }

  void shutdown(int code, std::chrono::milliseconds linger = std::chrono::milliseconds(0)) {
    stopping_ = true;
    rt_.stop(code, linger, [this] {
      if (listener_) listener_->stop();
      if (metrics_endpoint_) metrics_endpoint_->stop();
      for (auto& [id, ch] : channels_) {
        bytes_in_ += ch->bytes_received();
        bytes_out_ += ch->bytes_sent();
        ch->close();
      }
      for (auto& [t, timer] : timers_) timer->cancel();
    });
  }

  void write_stats() {
    const auto r = process_resources();
    nlohmann::json stats = {{"peak_rss_bytes", r ? r->peak_rss_bytes : 0},
                            {"peak_open_descriptors", std::max(peak_descriptors_, r ? r->open_descriptors : 0)},
                            {"bytes_in", bytes_in_},
                            {"bytes_out", bytes_out_},
                            {"rounds_committed", coord_.committed()},
                            {"rounds_aborted", coord_.aborted()},
                            {"model_bytes", coord_.model()->bytes()},
                            {"cpu_seconds", process_cpu_seconds()}};
    atomic_write_file(cfg_.state_dir / "server_stats.json", stats.dump(2) + "\n");
  }

  const ServerConfig& cfg_;
  ServerState& state_;
  Coordinator& coord_;
  // First of the owned members, so it is destroyed last: a broadcast slot that a pending handler
  // or a channel still holds posts to this context when it goes.
  transport::Runtime rt_;
  std::unique_ptr<ServerHook> hook_;                                 // a simulation's; none in production
  BroadcastPlanner<action::SendModel> broadcasts_;                  // the model streams of a round
  std::map<std::string, std::pair<SessionId, bool>> hook_routes_;  // silo -> (session, through an edge)
  transport::ssl::context tls_;
  std::unique_ptr<transport::Listener> listener_;
  MetricRegistry metrics_;
  std::unique_ptr<transport::MetricsEndpoint> metrics_endpoint_;
  std::map<Timer, std::int64_t> deadlines_;  // running timers: when they expire (unix ms)
  std::set<std::string> warned_;             // relayed silos whose expiry was logged
  std::uint64_t admin_refused_ = 0;          // admin commands from non-admin certificates
  std::chrono::steady_clock::time_point last_refusal_log_{};
  std::int64_t started_ms_ = now_ms();
  transport::PeerIdentity server_identity_ = transport::own_identity(cfg_.tls);
  std::map<SessionId, std::shared_ptr<transport::Channel>> channels_;
  std::map<Timer, std::unique_ptr<transport::DeadlineTimer>> timers_;
  SessionId next_id_ = 0;
  bool stopping_ = false;
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;
  std::size_t peak_descriptors_ = 0;  // open descriptors, the most seen as a round closed
  std::ofstream events_;
  ThreadCheck core_;  // the coordinator's calls: one thread (the first network thread)
};

// The records of a start, once the state checks out, the listener is bound and the model is in:
// what was repaired, an operator's decision, the start.
void announce_start(ServerState& state, const ServerConfig& cfg, const Resume& resume,
                    const std::vector<std::string>& repairs, std::uint64_t first_round, const std::string& sha) {
  const auto now = now_ms();
  if (!repairs.empty()) {
    for (const auto& r : repairs) spdlog::warn("state repaired: {}", r);
    state.record({{"event", "state_repair"}, {"repairs", repairs}, {"time", iso_time(now)}}, nullptr);
  }
  if (resume.decision) {
    auto d = *resume.decision;
    d["by"] = "operator (--resume-from-round)";
    d["time"] = iso_time(now);
    spdlog::warn("the operator's decision: going on from committed round {}; rounds {} superseded",
                 d["from_round"].get<std::uint64_t>(), d["superseded_rounds"].dump());
    state.record(d, nullptr);
  }
  state.record({{"event", "federation_start"},
                {"federation", cfg.federation},
                {"config_sha256", cfg.config_sha256},
                {"rounds", cfg.rounds},
                {"first_round", first_round},
                {"resumed_from_round", resume.committed_round},
                {"model_sha256", sha},
                {"time", iso_time(now)}},
               nullptr);
}

// Silo-level DP after a restart: the budget goes on from what the audit chain says was spent,
// and distributed mode's gamma and mu are chosen for the model's size. Throws ConfigError when
// the config cannot hold the sum, or when the log has committed rounds released without noise.
void resume_privacy(const ServerConfig& cfg, const Resume& resume, const Model& model, RoundConfig& rounds) {
  if (rounds.distributed_dp) {
    // Gamma and mu for what the silos encode (the model, or RANDOM_K's kept coordinates): a
    // config whose bits cannot hold the sum stops here.
    check_distributed_dp(*rounds.distributed_dp, protocol::skellam_dim(cfg.compression, model.tensors()),
                         "config " + cfg.file.string());
    if (resume.committed_without_central_dp > 0) {
      throw ConfigError("config " + cfg.file.string() + ": .privacy: the audit log has " +
                        std::to_string(resume.committed_without_central_dp) +
                        " committed rounds without silo-level DP noise: their models were released without it, so "
                        "no budget can cover this federation; start a new federation (a new state_dir) with the "
                        "privacy block from its first round");
    }
    rounds.distributed_dp->spent = resume.central_dp;  // from the audit chain, never a counter
    // The round's multiplier, as the records state it, and with a count word the update's beside it.
    const auto& dp = *rounds.distributed_dp;
    spdlog::info("distributed DP: gamma {:.6g}, Skellam variance {:.6g} (noise_multiplier {:.4g}{}), {} bits, "
                 "rotated length {}; epsilon {:.4g} of {:.4g} spent before this start",
                 dp.gamma, dp.variance, round_noise_multiplier(dp),
                 dp.count_scale > 0 ? fmt::format(", update_noise_multiplier {:.4g}, count_scale {}", dp.noise_multiplier,
                                                  dp.count_scale)
                                    : std::string(),
                 dp.bits, dp.padded,
                 epsilon_of(resume.central_dp, rounds.distributed_dp->delta), rounds.distributed_dp->epsilon);
  }
  if (rounds.central_dp) {
    // Models this federation released without the noise are outside any guarantee it could give.
    if (resume.committed_without_central_dp > 0) {
      throw ConfigError("config " + cfg.file.string() + ": .privacy: the audit log has " +
                        std::to_string(resume.committed_without_central_dp) +
                        " committed rounds without central DP noise: their models were released without it, so no "
                        "budget can cover this federation; start a new federation (a new state_dir) with the privacy "
                        "block from its first round");
    }
    // The budget goes on from what the audit chain says was spent, never from a counter.
    rounds.central_dp->spent = resume.central_dp;
    if (!resume.central_dp.steps.empty()) {
      spdlog::info("central DP: epsilon {:.4g} of {:.4g} spent before this start (from the audit log)",
                   epsilon_of(resume.central_dp, rounds.central_dp->delta), rounds.central_dp->epsilon);
    }
  }
}

}  // namespace

int run_server(const ServerConfig& cfg, const StartOptions& start, std::unique_ptr<ServerHook> hook) {
  // 0. The kit is a server's, before anything is written to the state folder.
  try {
    transport::own_identity_as(cfg.tls, wire::SERVER);
  } catch (const std::exception& e) {
    throw ConfigError("config " + cfg.file.string() + ": .tls: " + e.what());
  }
  // 1. The state as a whole (state.h): nothing is written to the audit log before it checks out
  //    and the listener is bound.
  ServerState state(StateOptions{.dir = cfg.state_dir,
                                        .mirror = cfg.state_mirror,
                                        .keep_checkpoints = cfg.keep_checkpoints,
                                        .resume_from_round = start.resume_from_round});
  Model initial = init_model(cfg.model);
  Resume resume = state.recover(initial);
  Model model = resume.model ? std::move(*resume.model) : std::move(initial);
  ServerOptimizer optimizer(cfg.optimizer, model);
  if (resume.optimizer_state) optimizer.load_state(*resume.optimizer_state);
  const std::uint64_t first_round = resume.last_round + 1;
  if (resume.committed_round > 0) {
    spdlog::info("resuming after committed round {} (next round {})", resume.committed_round, first_round);
  }
  if (first_round > cfg.rounds) {
    spdlog::warn("all {} rounds of config {} have run: nothing to run now (the silos that connect are told the "
                 "federation has finished). To go on with it, raise \"rounds\" in the config and start again",
                 cfg.rounds, cfg.file.string());
  }
  const std::string sha = crypto::sha256_hex(model.flat());
  RoundConfig rounds(cfg);
  if (resume.clip_norm && rounds.aggregation.adaptive_clip.on()) {
    rounds.aggregation.adaptive_clip.initial = *resume.clip_norm;  // adaptive clipping goes on where it was
  }
  resume_privacy(cfg, resume, model, rounds);
  // 2. TLS: the server checks silos' signatures (joins through edges, secure aggregation) against
  //    the federation CA and its revocation list, and signs round starts and secure setups with
  //    its key. A file that is missing or does not fit its certificate is a config error.
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<Server> server;
  try {
    rounds.ca = transport::load_verifier(cfg.tls);
    rounds.signer = transport::load_signer(cfg.tls);
    coord = std::make_unique<Coordinator>(std::move(rounds), std::move(model), std::move(optimizer), state, first_round);
    coord->resume_version(resume.commits);  // buffered rounds' versions count commits, not rounds
    if (hook) {
      spdlog::warn("SIMULATION: this server runs a hostile hook (--simulate): it deviates from the protocol on "
                   "purpose; never use it for a real federation");
    }
    server = std::make_unique<Server>(cfg, state, *coord, std::move(hook));
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError("config " + cfg.file.string() + ": .tls: " + e.what());
  }
  // 3. The port.
  server->bind();
  // 4. Only now, the records of this start: what was repaired, an operator's decision, the start.
  //    Where the last committed model is in no copy here, they wait until a silo has sent it
  //    (Coordinator::await_model): a server that then refuses to start has signed nothing.
  auto announce = [&](const std::vector<std::string>& repairs, const std::string& sha) {
    announce_start(state, cfg, resume, repairs, first_round, sha);
  };
  if (!resume.missing) {
    announce(resume.repairs, sha);
  } else {
    const Resume::Missing missing = *resume.missing;
    coord->await_model(missing.round, missing.model_sha256,
                       [&state, &announce, missing, repairs = resume.repairs](const Model& m) mutable {
                         repairs.push_back(state.restore_model(missing, m));
                         announce(repairs, missing.model_sha256);
                       },
                       state.missing_model_error(missing));
  }
  return server->run();
}

}  // namespace xsilo::server
