#include "server/daemon.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <spdlog/spdlog.h>

#include <fstream>
#include <deque>
#include <map>

#include "common/fs.h"
#include "common/mlp.h"
#include "server/coordinator.h"
#include "server/state.h"
#include "transport/listener.h"
#include "transport/runtime.h"
#include "protocol/tensor_stream.h"

namespace xsilo::server {

namespace asio = boost::asio;

namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Peak resident memory of this process (VmHWM), in bytes.
std::uint64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

class Server {
 public:
  Server(const ServerConfig& cfg, ServerState& state, Coordinator& coord)
      : cfg_(cfg), state_(state), coord_(coord), tls_(transport::make_tls_context(cfg.tls)),
        events_(cfg.state_dir / "events.jsonl", std::ios::app) {
    for (auto t : {Timer::Join, Timer::Train, Timer::Upload, Timer::SecAgg, Timer::Unmask}) {
      timers_.emplace(t, std::make_unique<asio::steady_timer>(rt_.io()));
    }
  }

  int run() {
    const int code = rt_.run(
        [this] {
          listener_ = std::make_unique<transport::Listener>(
              rt_.io().get_executor(), tls_, cfg_.listen, cfg_.channel, cfg_.allow,
              transport::LocalInfo{cfg_.federation, wire::SERVER, {"plain", "edges"}},
              [this](std::shared_ptr<transport::Channel> ch) { on_channel(std::move(ch)); },
              [this] { return coord_.round(); });
          listener_->start();
          spdlog::info("server for federation {} listening on {}:{}", cfg_.federation, cfg_.listen.host,
                       listener_->port());
          if (!cfg_.port_file.empty()) atomic_write_file(cfg_.port_file, std::to_string(listener_->port()) + "\n");
          coord_.start(now_ms());
          drain();
        },
        [this](int) {
          spdlog::warn("stopping; the round in progress is not committed");
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
    std::function<bool(const wire::Envelope&)> handle = [this, id](const wire::Envelope& e) {
      coord_.on_message(id, e, now_ms());
      drain();
      return true;
    };
    co_await transport::serve_channel(ch, handle);
    bytes_in_ += ch->bytes_received();
    bytes_out_ += ch->bytes_sent();
    channels_.erase(id);
    coord_.on_disconnect(id, now_ms());
    drain();
  }

  void drain() {
    for (auto& a : coord_.take_actions()) std::visit([this](auto& x) { apply(x); }, a);
  }

  transport::Channel* channel(SessionId id) {
    auto it = channels_.find(id);
    return it == channels_.end() ? nullptr : it->second.get();
  }

  void apply(action::Send& a) {
    if (auto* ch = channel(a.to)) ch->send(std::move(a.env));
  }
  // Models go out to at most `kBroadcastsAtOnce` silos at a time: the first silos get the
  // whole model early, train and upload while the broadcast to the others goes on, instead of
  // every silo receiving its last chunk at the same late moment.
  static constexpr int kBroadcastsAtOnce = 2;
  struct BroadcastSlot {
    explicit BroadcastSlot(Server* s) : server(s) {}
    BroadcastSlot(const BroadcastSlot&) = delete;
    BroadcastSlot& operator=(const BroadcastSlot&) = delete;
    Server* server;
    ~BroadcastSlot() {
      Server* s = server;
      asio::post(s->rt_.io(), [s] {
        --s->broadcasting_;
        s->start_broadcasts();
      });
    }
  };
  void apply(action::SendModel& a) {
    pending_broadcasts_.push_back(std::move(a));
    start_broadcasts();
  }
  void start_broadcasts() {
    while (broadcasting_ < kBroadcastsAtOnce && !pending_broadcasts_.empty()) {
      auto a = std::move(pending_broadcasts_.front());
      pending_broadcasts_.pop_front();
      auto* ch = channel(a.to);
      if (!ch || !ch->is_open()) continue;
      auto src = std::make_shared<protocol::ChunkSource>(a.model, a.model->flat(), a.model->tensors(),
                                                          cfg_.federation, a.round, cfg_.chunk_bytes);
      // The slot is released when the stream is finished or dropped with its connection.
      auto slot = std::make_shared<BroadcastSlot>(this);
      ++broadcasting_;
      ch->send_stream([src, slot, max = cfg_.channel.max_frame_bytes] { return src->next_frame(max); });
    }
  }
  void apply(action::Close& a) {
    if (auto* ch = channel(a.id)) ch->close_with_error(a.code, a.reason);
  }
  void apply(action::StartTimer& a) {
    auto& t = *timers_.at(a.timer);
    t.expires_after(a.after);
    const Timer which = a.timer;
    t.async_wait([this, which](boost::system::error_code ec) {
      if (ec) return;
      coord_.on_timer(which, now_ms());
      drain();
    });
  }
  void apply(action::CancelTimer& a) { timers_.at(a.timer)->cancel(); }
  // A job that throws stops the server with exit code 1 (the runtime logs why); committed
  // rounds are safe on disk.
  void apply(action::Job& a) {
    rt_.work<JobResult>(std::move(a.work), [this, id = a.id](JobResult result) {
      coord_.on_job_done(id, std::move(result), now_ms());
      drain();
    });
  }
  void apply(action::Background& a) { rt_.background(std::move(a.work)); }
  // Progress events, one JSON object per line, for whoever follows the federation (xsilo sim
  // fires its rehearsed faults from them).
  void apply(action::Event& a) {
    const nlohmann::json e = {{"time", iso_time(now_ms())}, {"event", a.name}, {"round", a.round}, {"detail", a.detail}};
    events_ << e.dump() << '\n' << std::flush;
  }
  void apply(action::Finished& a) {
    spdlog::info("federation finished: {} rounds committed, {} aborted", a.committed, a.aborted);
    state_.record({{"event", "federation_end"},
                   {"federation", cfg_.federation},
                   {"rounds_committed", a.committed},
                   {"rounds_aborted", a.aborted},
                   {"model_sha256", coord_.model_sha256()},
                   {"time", iso_time(now_ms())}},
                  nullptr);
    // Let the Finished messages reach the silos, then stop.
    shutdown(a.aborted == 0 ? 0 : 3, std::chrono::milliseconds(300));
  }

  void shutdown(int code, std::chrono::milliseconds linger = std::chrono::milliseconds(0)) {
    stopping_ = true;
    rt_.stop(code, linger, [this] {
      if (listener_) listener_->stop();
      for (auto& [id, ch] : channels_) {
        bytes_in_ += ch->bytes_received();
        bytes_out_ += ch->bytes_sent();
        ch->close();
      }
      for (auto& [t, timer] : timers_) timer->cancel();
    });
  }

  void write_stats() {
    nlohmann::json stats = {{"peak_rss_bytes", peak_rss_bytes()},
                            {"bytes_in", bytes_in_},
                            {"bytes_out", bytes_out_},
                            {"rounds_committed", coord_.committed()},
                            {"rounds_aborted", coord_.aborted()},
                            {"model_bytes", coord_.model()->bytes()}};
    atomic_write_file(cfg_.state_dir / "server_stats.json", stats.dump(2) + "\n");
  }

  const ServerConfig& cfg_;
  ServerState& state_;
  Coordinator& coord_;
  transport::Runtime rt_;
  transport::ssl::context tls_;
  std::unique_ptr<transport::Listener> listener_;
  std::map<SessionId, std::shared_ptr<transport::Channel>> channels_;
  std::map<Timer, std::unique_ptr<asio::steady_timer>> timers_;
  std::deque<action::SendModel> pending_broadcasts_;
  int broadcasting_ = 0;
  SessionId next_id_ = 0;
  bool stopping_ = false;
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;
  std::ofstream events_;
};

}  // namespace

int run_server(const ServerConfig& cfg) {
  ServerState state(cfg.state_dir, cfg.keep_checkpoints);
  Model initial = init_model(cfg.model);
  Resume resume = state.recover(initial);
  Model model = resume.model ? std::move(*resume.model) : std::move(initial);
  ServerOptimizer optimizer(cfg.optimizer, model);
  if (resume.optimizer_state) optimizer.load_state(*resume.optimizer_state);
  const std::uint64_t first_round = resume.last_round + 1;
  if (resume.committed_round > 0) {
    spdlog::info("resuming after committed round {} (next round {})", resume.committed_round, first_round);
  }
  const std::string sha = crypto::sha256_hex(model.flat());
  state.record({{"event", "federation_start"},
                {"federation", cfg.federation},
                {"config_sha256", cfg.config_sha256},
                {"rounds", cfg.rounds},
                {"first_round", first_round},
                {"resumed_from_round", resume.committed_round},
                {"model_sha256", sha},
                {"time", iso_time(now_ms())}},
               nullptr);
  RoundConfig rounds(cfg);
  if (resume.clip_norm && rounds.aggregation.adaptive_clip.on()) {
    rounds.aggregation.adaptive_clip.initial = *resume.clip_norm;  // adaptive clipping goes on where it was
  }
  // The server checks silos' signatures (joins through edges, secure aggregation) against the
  // federation CA and its revocation list, and signs round starts and secure setups with its key.
  rounds.ca = transport::load_verifier(cfg.tls);
  rounds.signer = transport::load_signer(cfg.tls);
  Coordinator coord(std::move(rounds), std::move(model), std::move(optimizer), state, first_round);
  Server server(cfg, state, coord);
  return server.run();
}

}  // namespace xsilo::server
