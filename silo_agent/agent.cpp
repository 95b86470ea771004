// The agent daemon: a TLS connection to the upstream around the sans-I/O Session.
#include "silo_agent/agent.h"

#include <algorithm>
#include <chrono>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "silo_agent/builtin_trainer.h"
#include "silo_agent/external_trainer.h"
#include "silo_agent/privacy_budget.h"
#include "silo_agent/silo_state.h"
#include "silo_agent/stats_trainer.h"
#include "common/prometheus.h"
#include "transport/metrics_endpoint.h"
#include "transport/runtime.h"
#include "transport/tls.h"

namespace xsilo::agent {

namespace asio = boost::asio;
using transport::awaitable;
using transport::Channel;

std::unique_ptr<Trainer> make_trainer(const AgentConfig& cfg) {
  if (cfg.trainer == TrainerKind::FeatureStats) return std::make_unique<FeatureStatsTrainer>(load_data_file(cfg, cfg.train_data));
  // Under a privacy budget every round is charged before its update can leave.
  std::shared_ptr<const PrivacyBudget> budget;
  if (cfg.privacy.on()) budget = std::make_shared<PrivacyBudget>(cfg.privacy, cfg.state_dir / "sent.jsonl");
  std::unique_ptr<Trainer> t;
  if (cfg.trainer == TrainerKind::External) {
    t = std::make_unique<ExternalTrainer>(cfg);
  } else {
    LocalData data = load_local_data(cfg);
    spdlog::info("local data: {} training rows, {} test rows, {} features", data.train.rows, data.test.rows,
                 data.train.features);
    t = std::make_unique<BuiltinTrainer>(cfg, std::move(data), budget);
  }
  if (!budget) return t;
  spdlog::info("privacy budget: epsilon {} at delta {}, enforced by this silo (docs/privacy.md)",
               cfg.privacy.max_epsilon, cfg.privacy.delta);
  return std::make_unique<BudgetedTrainer>(std::move(t), std::move(budget));
}

namespace {

SessionConfig session_config(const AgentConfig& cfg) {
  SessionConfig s;
  s.federation = cfg.federation;
  s.chunk_bytes = cfg.chunk_bytes;
  s.signer = transport::load_signer(cfg.tls);
  s.ca = transport::load_verifier(cfg.tls);
  if (auto it = cfg.trust.names().find(wire::SERVER); it != cfg.trust.names().end() && !it->second.count("*")) {
    s.servers = it->second;
  }
  if (!cfg.state_dir.empty()) s.momentum_file = cfg.state_dir / "momentum.safetensors";
  if (!cfg.state_dir.empty()) s.residual_file = cfg.state_dir / "error_feedback.safetensors";
  if (!cfg.state_dir.empty()) s.witnessed = last_witnessed(cfg.state_dir);
  if (!cfg.state_dir.empty()) s.unmask_released = unmask_releases(cfg.state_dir, cfg.federation);
  s.floor = cfg.secure_floor;
  s.max_message_bytes = cfg.channel.max_frame_bytes;
  return s;
}

constexpr std::chrono::seconds kLeaveUnanswered{30};

class Agent {
 public:
  Agent(const AgentConfig& cfg, std::unique_ptr<Trainer> trainer, std::unique_ptr<FaultHook> hook)
      : cfg_(cfg), trainer_(std::move(trainer)), hook_(hook ? std::move(hook) : std::make_unique<FaultHook>()),
        tls_(transport::make_tls_context(cfg.tls)), me_(transport::own_identity(cfg.tls)), session_(session_config(cfg), *trainer_, *hook_),
        upstream_(rt_.io(), tls_,
                  {.endpoints = cfg.upstreams,
                   .upstreams = cfg.trust,
                   .me = {cfg.federation, wire::SILO, {"plain"}},
                   .channel = cfg.channel,
                   .reconnect = cfg.reconnect,
                   .probe = cfg.failover_probe}) {
    using T = MetricRegistry::Type;
    transport::declare_daemon_metrics(metrics_, "agent", cfg.tls);
    metrics_.declare("xsilo_round", T::Gauge, "The last round this silo was asked to train");
    metrics_.declare("xsilo_upstream_connected", T::Gauge, "1 while connected to the server or an edge");
    metrics_.declare("xsilo_upstream_connects_total", T::Counter, "Connections established upstream");
    metrics_.declare("xsilo_silo_rounds_total", T::Counter,
                     "Rounds this silo trained for, by outcome (committed, or not_committed: aborted or not needed)", true);
    metrics_.declare("xsilo_round_duration_seconds", T::Summary, "From RoundStart to RoundEnd, as this silo saw it");
    metrics_.declare("xsilo_uploads_total", T::Counter, "Updates uploaded");
    metrics_.declare("xsilo_trainer_failures_total", T::Counter, "Rounds in which the trainer could not produce an update");
    for (const char* o : {"committed", "not_committed"}) metrics_.set("xsilo_silo_rounds_total", 0, {{"outcome", o}});
  }

  int run() {
    return rt_.run(
        [this] {
          metrics_endpoint_ =
              transport::start_metrics(rt_.io().get_executor(), cfg_.metrics, metrics_, [this] { refresh_metrics(); });
          asio::co_spawn(rt_.io(), upstream(), asio::detached);
        },
        [this](int) { stop(130); });
  }

 private:
  awaitable<void> upstream() {
    transport::Upstream::Session session = [this](std::shared_ptr<Channel> ch, const Endpoint& at) -> awaitable<void> {
      channel_ = ch;
      metrics_.add("xsilo_upstream_connects_total");
      // The silo's name is its own certificate's, whatever the upstream says it read.
      if (ch->welcome().peer_identity() != me_.name) {
        spdlog::warn("{} calls this silo {}; its certificate says {}", ch->peer().str(), ch->welcome().peer_identity(),
                     me_.name);
      }
      spdlog::info("connected to {} at {} as {}", ch->peer().str(), at.str(), me_.name);
      session_.on_connected(me_.name, at.str(), ch->peer().name, ch->peer().str());
      apply();
      std::function<bool(const wire::Envelope&)> handle = [this](const wire::Envelope& e) {
        count(e);
        session_.on_message(e);
        apply();
        if (switching_ && may_leave()) return false;  // to the preferred upstream
        return !session_.finished();
      };
      co_await transport::serve_channel(ch, handle);
      bytes_in_ += ch->bytes_received();
      bytes_out_ += ch->bytes_sent();
      channel_.reset();
      ch->close();
      session_.on_disconnected();
      apply();
      if (session_.finished() || rt_.stopping()) co_return;
      if (switching_) spdlog::info("the preferred upstream {} is back; moving to it", cfg_.upstreams[0].str());
      else spdlog::warn("lost the connection to {}; trying the upstreams in order", at.str());
      switching_ = leave_unanswered_ = false;
      leave_timer_.cancel();
    };
    std::function<bool()> done = [this] { return session_.finished() || rt_.stopping(); };
    std::function<void()> preferred_back = [this] {
      // Ask to be selected for no more rounds here, and go once that is answered and no round
      // holds this silo: leaving right after a round would drop it from the next one, which the
      // server may have started with it already. An upstream that never answers (an edge that
      // drops the request) is left when the silo is idle after kLeaveUnanswered, or three probe
      // intervals if longer.
      switching_ = true;
      session_.request_leave();
      apply();
      leave_timer_.expires_after(std::max<std::chrono::steady_clock::duration>(kLeaveUnanswered, 3 * cfg_.failover_probe));
      leave_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (ec || !switching_) return;
        leave_unanswered_ = true;
        if (channel_ && may_leave()) channel_->close();
      });
    };
    co_await upstream_.run(session, done, preferred_back);
    stop(upstream_.exhausted() ? 1 : 0);
  }

  void apply() {
    for (auto& a : session_.take_actions()) {
      if (halted_) return;  // a required record failed: nothing after it may happen
      std::visit([this](auto& x) { run(x); }, a);
    }
  }
  bool may_leave() const { return session_.may_leave() || (leave_unanswered_ && !session_.in_round()); }
  void run(action::Send& a) {
    if (a.env.has_error() && a.env.error().code() == wire::TRAINING_FAILED) metrics_.add("xsilo_trainer_failures_total");
    if (channel_) channel_->send(std::move(a.env));
  }
  void run(action::SendStream& a) {
    if (channel_ && a.update) metrics_.add("xsilo_uploads_total");
    if (channel_) channel_->send_stream([src = a.source, max = cfg_.channel.max_frame_bytes] { return src->next_frame(max); });
  }
  void run(action::Job& a) {
    rt_.work<SessionJobResult>(std::move(a.work), [this, id = a.id](SessionJobResult r) {
      session_.on_job_done(id, std::move(r));
      apply();
    });
  }
  void run(action::Record& a) {
    try {
      commit_record(cfg_.state_dir / a.log, a.entry, a.staged, a.onto);
    } catch (const std::exception& e) {
      if (a.required) {
        spdlog::error("stopping: cannot write the silo's log {} ({}), which must record this upload's privacy "
                      "spend before it leaves; the update stays here", a.log, e.what());
        halted_ = true;
        stop(1);
        return;
      }
      spdlog::warn("cannot write the silo's log {}: {}", a.log, e.what());
    }
  }
  void run(action::Finished&) {}
  void run(action::Fatal& a) {
    spdlog::error("stopping: {}", a.reason);
    stop(1);
  }

  // What the metrics count of the messages from upstream.
  void count(const wire::Envelope& e) {
    const auto now = std::chrono::steady_clock::now();
    if (e.has_round_start()) {
      round_started_ = now;
      metrics_.set("xsilo_round", static_cast<double>(e.round_start().round()));
    } else if (e.has_round_end() && round_started_) {
      metrics_.add("xsilo_silo_rounds_total", 1, {{"outcome", e.round_end().committed() ? "committed" : "not_committed"}});
      metrics_.observe("xsilo_round_duration_seconds", std::chrono::duration<double>(now - *round_started_).count());
      round_started_.reset();
    }
  }
  void refresh_metrics() {
    std::uint64_t in = bytes_in_, out = bytes_out_;
    if (channel_) {
      in += channel_->bytes_received();
      out += channel_->bytes_sent();
    }
    transport::set_connection_metrics(metrics_, in, out, {});
    metrics_.set("xsilo_upstream_connected", channel_ ? 1 : 0);
  }

  void stop(int code) {
    if (metrics_endpoint_) metrics_endpoint_->stop();
    upstream_.stop();
    trainer_->cancel();  // a training in progress ends now, not at its deadline
    rt_.stop(code, std::chrono::milliseconds(50), [this] {
      if (channel_) channel_->close();
    });
  }

  const AgentConfig& cfg_;
  bool halted_ = false;  // a required record could not be written: no action runs any more
  transport::Runtime rt_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<FaultHook> hook_;
  transport::ssl::context tls_;
  transport::PeerIdentity me_;  // from its own certificate
  Session session_;
  transport::Upstream upstream_;
  std::shared_ptr<Channel> channel_;
  bool switching_ = false;          // to the preferred upstream, which is back
  bool leave_unanswered_ = false;   // the request to leave went unanswered for a probe interval
  boost::asio::steady_timer leave_timer_{rt_.io()};
  MetricRegistry metrics_;
  std::unique_ptr<transport::MetricsEndpoint> metrics_endpoint_;
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;  // of connections already closed
  std::optional<std::chrono::steady_clock::time_point> round_started_;
};

}  // namespace

int run_agent(const AgentConfig& cfg, AgentHooks hooks) {
  // The kit is a silo's, before the state folder is touched.
  try {
    transport::own_identity_as(cfg.tls, wire::SILO);
  } catch (const std::exception& e) {
    throw ConfigError("config " + cfg.file.string() + ": .tls: " + e.what());
  }
  // The state folder first, as a crash may have left it (silo_state.h): the session reads it.
  // One that cannot be made is the operator's to mend, as a config error (exit 2: a unit that
  // restarts on failure does not retry it forever).
  std::error_code made;
  std::filesystem::create_directories(cfg.state_dir, made);
  if (made) {
    throw ConfigError("config " + cfg.file.string() + ": .state_dir: cannot create " + cfg.state_dir.string() + ": " +
                      made.message());
  }
  for (const auto& repaired : repair_state(cfg.state_dir)) spdlog::warn("state {}: {}", cfg.state_dir.string(), repaired);
  auto trainer = hooks.trainer ? std::move(hooks.trainer) : make_trainer(cfg);
  // TLS files that are missing, do not fit, or carry an expired revocation list: the operator's
  // to mend (one line, exit 2), as a config error.
  std::unique_ptr<Agent> agent;
  try {
    agent = std::make_unique<Agent>(cfg, std::move(trainer), std::move(hooks.faults));
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError("config " + cfg.file.string() + ": .tls: " + e.what());
  }
  return agent->run();
}

}  // namespace xsilo::agent
