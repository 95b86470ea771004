// The agent daemon: a TLS connection to the upstream around the sans-I/O Session.
#include "silo_agent/agent.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "silo_agent/builtin_trainer.h"
#include "silo_agent/external_trainer.h"
#include "transport/runtime.h"

namespace xsilo::agent {

namespace asio = boost::asio;
using transport::awaitable;
using transport::Channel;

std::unique_ptr<Trainer> make_trainer(const AgentConfig& cfg) {
  if (cfg.trainer == TrainerKind::External) return std::make_unique<ExternalTrainer>(cfg);
  LocalData data = load_local_data(cfg);
  spdlog::info("local data: {} training rows, {} test rows, {} features", data.train.rows, data.test.rows,
               data.train.features);
  return std::make_unique<BuiltinTrainer>(cfg, std::move(data));
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
  return s;
}

class Agent {
 public:
  Agent(const AgentConfig& cfg, std::unique_ptr<Trainer> trainer, std::unique_ptr<FaultHook> hook)
      : cfg_(cfg), trainer_(std::move(trainer)), hook_(hook ? std::move(hook) : std::make_unique<FaultHook>()),
        tls_(transport::make_tls_context(cfg.tls)), me_(transport::own_identity(cfg.tls)), session_(session_config(cfg), *trainer_, *hook_),
        upstream_(rt_.io(), tls_,
                  {cfg.upstreams, cfg.trust, {cfg.federation, wire::SILO, {"plain"}}, cfg.channel,
                   cfg.reconnect, cfg.failover_probe}) {}

  int run() {
    std::filesystem::create_directories(cfg_.state_dir);
    return rt_.run([this] { asio::co_spawn(rt_.io(), upstream(), asio::detached); }, [this](int) { stop(130); });
  }

 private:
  awaitable<void> upstream() {
    transport::Upstream::Session session = [this](std::shared_ptr<Channel> ch, const Endpoint& at) -> awaitable<void> {
      channel_ = ch;
      // The silo's name is its own certificate's, whatever the upstream says it read.
      if (ch->welcome().peer_identity() != me_.name) {
        spdlog::warn("{} calls this silo {}; its certificate says {}", ch->peer().str(), ch->welcome().peer_identity(),
                     me_.name);
      }
      spdlog::info("connected to {} at {} as {}", ch->peer().str(), at.str(), me_.name);
      session_.on_connected(me_.name, at.str(), ch->peer().name, ch->peer().str());
      apply();
      std::function<bool(const wire::Envelope&)> handle = [this](const wire::Envelope& e) {
        session_.on_message(e);
        apply();
        if (switching_ && !session_.in_round()) return false;  // between rounds: to the preferred upstream
        return !session_.finished();
      };
      co_await transport::serve_channel(ch, handle);
      channel_.reset();
      ch->close();
      session_.on_disconnected();
      apply();
      if (session_.finished() || rt_.stopping()) co_return;
      if (switching_) spdlog::info("the preferred upstream {} is back; moving to it", cfg_.upstreams[0].str());
      else spdlog::warn("lost the connection to {}; trying the upstreams in order", at.str());
      switching_ = false;
    };
    std::function<bool()> done = [this] { return session_.finished() || rt_.stopping(); };
    std::function<void()> preferred_back = [this] {
      // Leave now when idle, else right after this round ends.
      switching_ = true;
      if (channel_ && !session_.in_round()) channel_->close();
    };
    co_await upstream_.run(session, done, preferred_back);
    stop(upstream_.exhausted() ? 1 : 0);
  }

  void apply() {
    for (auto& a : session_.take_actions()) std::visit([this](auto& x) { run(x); }, a);
  }
  void run(action::Send& a) {
    if (channel_) channel_->send(std::move(a.env));
  }
  void run(action::SendStream& a) {
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
      append_durable(cfg_.state_dir / a.log, a.entry.dump() + "\n");
    } catch (const std::exception& e) {
      spdlog::warn("cannot write the silo's log {}: {}", a.log, e.what());
    }
  }
  void run(action::Finished&) {}
  void run(action::Fatal& a) {
    spdlog::error("stopping: {}", a.reason);
    stop(1);
  }

  void stop(int code) {
    upstream_.stop();
    trainer_->cancel();  // a training in progress ends now, not at its deadline
    rt_.stop(code, std::chrono::milliseconds(50), [this] {
      if (channel_) channel_->close();
    });
  }

  const AgentConfig& cfg_;
  transport::Runtime rt_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<FaultHook> hook_;
  transport::ssl::context tls_;
  transport::PeerIdentity me_;  // from its own certificate
  Session session_;
  transport::Upstream upstream_;
  std::shared_ptr<Channel> channel_;
  bool switching_ = false;
};

}  // namespace

int run_agent(const AgentConfig& cfg, AgentHooks hooks) {
  auto trainer = hooks.trainer ? std::move(hooks.trainer) : make_trainer(cfg);
  Agent agent(cfg, std::move(trainer), std::move(hooks.faults));
  return agent.run();
}

}  // namespace xsilo::agent
