// The edge daemon: real connections around the sans-I/O Relay.
#include "edge_aggregator/edge.h"

#include "common/config.h"
#include "transport/tls.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <spdlog/spdlog.h>

#include <map>

#include "common/fs.h"
#include "common/thread_check.h"
#include "edge_aggregator/relay.h"
#include "edge_aggregator/silo_links.h"
#include "common/prometheus.h"
#include "transport/listener.h"
#include "transport/metrics_endpoint.h"
#include "transport/runtime.h"

namespace xsilo::edge {

namespace asio = boost::asio;
using transport::awaitable;
using transport::Channel;

namespace {

class Edge {
 public:
  Edge(const EdgeConfig& cfg, std::unique_ptr<EdgeHook> hook)
      : cfg_(cfg), hook_(std::move(hook)), rt_(cfg.network_threads), tls_(transport::make_tls_context(cfg.tls)), relay_({cfg.federation, cfg.chunk_bytes}),
        upstream_(rt_.io(), tls_,
                  {.endpoints = cfg.upstreams,
                   .upstreams = {wire::SERVER},
                   .me = {cfg.federation, wire::EDGE, {"plain"}},
                   .channel = cfg.channel,
                   .reconnect = cfg.reconnect,
                   .probe = std::chrono::milliseconds(0)}) {
    using T = MetricRegistry::Type;
    transport::declare_daemon_metrics(metrics_, "edge", cfg.tls);
    metrics_.declare("xsilo_round", T::Gauge, "The round the edge relays now, or the last one");
    metrics_.declare("xsilo_silos_connected", T::Gauge, "Silos connected to this edge");
    metrics_.declare("xsilo_upstream_connected", T::Gauge, "1 while connected to the server");
    metrics_.declare("xsilo_upstream_connects_total", T::Counter, "Connections established to the server");
    metrics_.declare("xsilo_region_uploads_total", T::Counter, "Partial sums (one per region or secure group) uploaded");
    metrics_.declare("xsilo_edge_refused_updates_total", T::Counter, "Silo updates the edge refused before summing");
  }

  int run() {
    return rt_.run([this] {
      listener_ = std::make_unique<transport::Listener>(
          rt_.io().get_executor(), tls_, cfg_.listen, cfg_.channel, cfg_.allow,
          transport::LocalInfo{cfg_.federation, wire::EDGE, {"plain"}},
          [this](std::shared_ptr<Channel> ch) { on_silo(std::move(ch)); }, [this] { return relay_.round(); });
      // The silos' connections spread over the network threads; the relay and the upstream
      // connection stay on the first.
      listener_->place_connections([this] { return rt_.connection_executor(); });
      listener_->start();
      spdlog::info("edge for federation {} listening on {}:{}", cfg_.federation, cfg_.listen.host, listener_->port());
      if (rt_.network_threads() > 1) spdlog::info("{} network threads", rt_.network_threads());
      if (!cfg_.port_file.empty()) atomic_write_file(cfg_.port_file, std::to_string(listener_->port()) + "\n");
      metrics_endpoint_ = transport::start_metrics(rt_.io().get_executor(), cfg_.metrics, metrics_, [this] { refresh_metrics(); });
      asio::co_spawn(rt_.io(), upstream(), asio::detached);
    }, [this](int) { stop(130); });
  }

 private:
  awaitable<void> upstream() {
    transport::Upstream::Session session = [this](std::shared_ptr<Channel> ch, const Endpoint& at) -> awaitable<void> {
          up_ = ch;
          metrics_.add("xsilo_upstream_connects_total");
          spdlog::info("connected to {} at {}", ch->peer().str(), at.str());
          relay_.on_server_up();
          apply();
          // Named, not a temporary inside co_await: GCC 12 destroys such temporaries twice.
          std::function<bool(const wire::Envelope&)> handle = [this](const wire::Envelope& e) {
            relay_.on_server_message(e);
            apply();
            return !relay_.finished();
          };
          co_await transport::serve_channel(ch, handle);
          count_bytes(*ch);
          up_.reset();
          relay_.on_server_down();
          if (!relay_.finished() && !rt_.stopping()) spdlog::warn("lost the server; reconnecting");
    };
    std::function<bool()> done = [this] { return relay_.finished() || rt_.stopping(); };
    const std::function<void()> no_probe;
    co_await upstream_.run(session, done, no_probe);
    stop(upstream_.exhausted() ? 1 : 0);
  }

  void on_silo(std::shared_ptr<Channel> ch) {
    const std::string name = ch->peer().name;
    if (auto old = silos_.replace(name, ch)) {
      old->close_with_error(wire::UNEXPECTED, "replaced by a newer connection");
      relay_.on_silo_down(name);
    }
    relay_.on_silo_up(name);
    apply();
    asio::co_spawn(rt_.io(), serve(name, ch), asio::detached);
  }

  awaitable<void> serve(std::string name, std::shared_ptr<Channel> ch) {
    // A message the connection read after a newer one replaced it is not the silo's any more:
    // dropped, and this connection (closing already) is served no further.
    // An upload chunk's data stays in its frame until the relay copies it into the slot.
    std::function<bool(const proto::Message&)> handle = [this, name, conn = ch.get()](const proto::Message& m) {
      if (!silos_.current(name, conn)) return false;
      relay_.on_silo_message(name, m);
      apply();
      return true;
    };
    co_await transport::serve_messages(ch, handle);
    count_bytes(*ch);
    if (silos_.drop(name, ch.get())) {
      relay_.on_silo_down(name);
      apply();
    }
  }

  // Every call into the relay is followed by an apply: the first network thread's only.
  void apply() {
    core_.check("the edge's relay (on the core's network thread only)");
    for (auto& a : relay_.take_actions()) std::visit([this](auto& x) { run(x); }, a);
  }
  void run(action::ToServer& a) {
    if (hook_ && !hook_->to_server(a.env)) return;
    if (up_) up_->send(std::move(a.env));
  }
  void run(action::StreamToServer& a) {
    if (up_) metrics_.add("xsilo_region_uploads_total");
    if (up_) up_->send_stream([src = a.source, max = cfg_.channel.max_frame_bytes] { return src->next_frame(max); });
  }
  void run(action::ToSilo& a) {
    if (hook_ && !hook_->to_silo(a.silo, a.env)) return;
    if (auto* ch = silos_.find(a.silo)) ch->send(std::move(a.env));
  }
  void run(action::ToSilos& a) {
    if (hook_) {  // a hostile edge (docs/security.md) may alter what each silo gets
      for (auto& silo : a.silos) {
        action::ToSilo one{std::move(silo), a.env};
        run(one);
      }
      return;
    }
    auto frame = proto::encode_frame(a.env, cfg_.channel.max_frame_bytes);
    if (!frame) {
      spdlog::error("not relaying {}: {}", proto::body_name(a.env), frame.error().message());
      return;
    }
    const auto shared = std::make_shared<const std::string>(std::move(*frame));
    for (const auto& silo : a.silos) {
      if (auto* ch = silos_.find(silo)) ch->send_frame(shared);
    }
  }
  void run(action::Background& a) { rt_.background(std::move(a.work)); }
  void run(action::Job& a) {
    rt_.work<Status>(std::move(a.work), [this, id = a.id](Status folded) {
      if (!folded) metrics_.add("xsilo_edge_refused_updates_total");
      relay_.on_job_done(id, folded);
      apply();
    });
  }

  // Stops accepting, lets queued messages (Finished) reach the silos, then closes.
  void stop(int code) {
    upstream_.stop();
    if (listener_) listener_->stop();
    if (metrics_endpoint_) metrics_endpoint_->stop();
    rt_.stop(code, std::chrono::milliseconds(300), [this] {
      if (up_) up_->close();
      for (auto& [name, ch] : silos_.all()) ch->close();
    });
  }

  void count_bytes(const Channel& ch) {
    bytes_in_ += ch.bytes_received();
    bytes_out_ += ch.bytes_sent();
  }
  void refresh_metrics() {
    std::uint64_t in = bytes_in_, out = bytes_out_;
    auto live = [&](const Channel& ch) {
      in += ch.bytes_received();
      out += ch.bytes_sent();
    };
    if (up_) live(*up_);
    for (const auto& [name, ch] : silos_.all()) live(*ch);
    transport::set_connection_metrics(metrics_, in, out, listener_ ? listener_->refused_by_reason() : std::map<std::string, std::uint64_t>{});
    metrics_.set("xsilo_round", static_cast<double>(relay_.round()));
    metrics_.set("xsilo_silos_connected", static_cast<double>(silos_.size()));
    metrics_.set("xsilo_upstream_connected", up_ ? 1 : 0);
  }

  const EdgeConfig& cfg_;
  std::unique_ptr<EdgeHook> hook_;
  transport::Runtime rt_;
  transport::ssl::context tls_;
  Relay relay_;
  transport::Upstream upstream_;
  std::unique_ptr<transport::Listener> listener_;
  std::shared_ptr<Channel> up_;
  SiloLinks<Channel> silos_;
  MetricRegistry metrics_;
  std::unique_ptr<transport::MetricsEndpoint> metrics_endpoint_;
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;  // of connections already closed
  ThreadCheck core_;  // the relay's calls: one thread (the first network thread)
};

}  // namespace

int run_edge(const EdgeConfig& cfg, std::unique_ptr<EdgeHook> hook) {
  // TLS files that are missing, do not fit, or carry an expired revocation list: the operator's
  // to mend (one line, exit 2), as a config error.
  std::unique_ptr<Edge> edge;
  try {
    transport::own_identity_as(cfg.tls, wire::EDGE);
    edge = std::make_unique<Edge>(cfg, std::move(hook));
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError("config " + cfg.file.string() + ": .tls: " + e.what());
  }
  return edge->run();
}

}  // namespace xsilo::edge
