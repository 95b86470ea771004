#include "edge_aggregator/edge.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <map>

#include "common/fs.h"
#include "common/model.h"
#include "transport/dialer.h"
#include "transport/listener.h"
#include "protocol/tensor_stream.h"

namespace xsilo::edge {

namespace asio = boost::asio;
using transport::awaitable;
using transport::Channel;

namespace {

enum class SiloState { Training, Ready, Uploading, Done, Gone };

// The edge's part of a round: which of its silos take part, their uploads one at a time into
// `current`, folded into the regional sum `acc` once complete and finite.
struct Region {
  std::uint64_t round = 0;
  std::vector<TensorInfo> layout;
  std::map<std::string, SiloState> silos;
  std::map<std::string, std::pair<std::uint64_t, double>> samples_weight;
  std::deque<std::string> ready;
  std::string uploading;
  std::shared_ptr<Model> acc;      // shared with the fold on the worker and the upload stream
  std::shared_ptr<Model> current;
  // Secure aggregation: masked words, summed per secure group (mod 2^bits).
  bool secure = false;
  wire::DType dtype = wire::U32;
  std::size_t word = 4, words = 0;
  std::map<std::string, std::uint32_t> group_of;
  std::shared_ptr<std::vector<std::uint8_t>> current_words;
  std::map<std::uint32_t, std::shared_ptr<std::vector<std::uint8_t>>> group_sum;
  std::map<std::uint32_t, std::vector<wire::Contributor>> group_contributors;
  std::deque<std::uint32_t> unsent_groups;  // granted: the groups whose sums still go up
  protocol::TensorReceiver rx;
  std::vector<wire::Contributor> contributors;
  bool folding = false;
  bool finalize = false;   // the server granted the region's upload
  bool announced = false;  // told the server the region is ready
  bool sent = false;
};

class Edge {
 public:
  explicit Edge(const EdgeConfig& cfg)
      : cfg_(cfg), pool_(1), signals_(io_, SIGINT, SIGTERM), tls_(transport::make_tls_context(cfg.tls)),
        backoff_(cfg.reconnect) {}

  int run() {
    listener_ = std::make_unique<transport::Listener>(
        io_.get_executor(), tls_, cfg_.listen, cfg_.channel, cfg_.allow,
        transport::LocalInfo{cfg_.federation, wire::EDGE, {"plain"}},
        [this](std::shared_ptr<Channel> ch) { on_silo(std::move(ch)); },
        [this] { return region_.round; });
    listener_->start();
    spdlog::info("edge for federation {} listening on {}:{}", cfg_.federation, cfg_.listen.host,
                 listener_->port());
    if (!cfg_.port_file.empty()) atomic_write_file(cfg_.port_file, std::to_string(listener_->port()) + "\n");
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      spdlog::warn("signal {}: stopping", sig);
      exit_code_ = 130;
      stop();
    });
    asio::co_spawn(io_, upstream_loop(), asio::detached);
    io_.run();
    pool_.join();
    return exit_code_;
  }

 private:
  // ---- upstream: the server -------------------------------------------------------------
  awaitable<void> upstream_loop() {
    std::size_t next = 0;
    while (!stopped_) {
      const auto& to = cfg_.upstreams[next % cfg_.upstreams.size()];
      auto r = co_await transport::dial_once(io_.get_executor(), tls_, to, server_role_, me_, cfg_.channel);
      if (stopped_) break;
      if (!r) {
        spdlog::warn("{}", r.status().message);
        if (cfg_.reconnect.max_attempts > 0 && backoff_.attempts() >= cfg_.reconnect.max_attempts) {
          spdlog::error("giving up on the server after {} attempts", backoff_.attempts());
          exit_code_ = 1;
          break;
        }
        ++next;
        asio::steady_timer t(io_, backoff_.next());
        boost::system::error_code ec;
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      backoff_.reset();
      next = 0;
      up_ = *r;
      spdlog::info("connected to {} at {}", up_->peer().str(), to.str());
      send_region_status();
      for (;;) {
        auto env = co_await up_->read();
        if (!env) {
          if (env.status().code != wire::ERROR_UNSPECIFIED) {
            up_->close_with_error(env.status().code, env.status().message);
          }
          break;
        }
        from_server(*env);
        if (finished_) break;
      }
      up_.reset();
      region_ = Region{};  // the round (if any) is void without the server
      if (finished_ || stopped_) break;
      spdlog::warn("lost the server; reconnecting");
    }
    stop();
  }

  void to_server(wire::Envelope e) {
    if (up_) up_->send(std::move(e));
  }

  void send_region_status() {
    auto e = transport::envelope(cfg_.federation, region_.round);
    auto* status = e.mutable_region_status();  // set even when the region is empty
    for (const auto& [name, ch] : silos_) status->add_silos(name);
    to_server(std::move(e));
  }

  void from_server(const wire::Envelope& e) {
    using B = wire::Envelope::BodyCase;
    switch (e.body_case()) {
      case B::kRoundStart: start_round(e); break;
      case B::kSecaggKeyList:
      case B::kSecaggShareDelivery:
      case B::kSecaggUnmaskRequest:
        if (!e.silo().empty()) to_silo(e.silo(), e);  // the edge only carries them
        break;
      case B::kTensorChunk:
        // The model passes through: each chunk goes on to the selected silos as it arrives.
        if (e.round() != region_.round) break;
        for (const auto& [name, state] : region_.silos) {
          if (state != SiloState::Gone) to_silo(name, e);
        }
        break;
      case B::kUploadGrant:
        if (e.round() != region_.round) break;
        if (region_.sent) {
          send_next_group();  // one grant per secure group's partial sum
          break;
        }
        region_.finalize = true;
        maybe_finish_region();
        break;
      case B::kRoundEnd:
        // The server ended this silo's round (dropped, surplus or done): the region stops
        // waiting for it.
        if (!e.silo().empty() && e.round() == region_.round) silo_gone(e.silo());
        [[fallthrough]];
      case B::kError:
        if (!e.silo().empty()) {
          to_silo(e.silo(), e);
        } else if (e.has_error()) {
          spdlog::warn("server reports: {}", e.error().message());
        }
        break;
      case B::kFinished:
        spdlog::info("the federation finished: {}", e.finished().reason());
        for (const auto& [name, ch] : silos_) to_silo(name, e);
        finished_ = true;
        break;
      default: spdlog::warn("unexpected {} from the server", proto::body_name(e));
    }
  }

  // One RoundStart per selected silo (each with its own secure group, if any); the first of a
  // new round sets the region up.
  void start_round(const wire::Envelope& e) {
    const auto& rs = e.round_start();
    if (rs.round() != region_.round || !region_.acc) {
      region_ = Region{};
      region_.round = rs.round();
      Model layout;
      for (const auto& t : rs.tensors()) layout.add_layout(t.name(), {t.shape().begin(), t.shape().end()});
      region_.layout = layout.tensors();
      region_.secure = rs.has_secagg();
      if (region_.secure) {
        region_.dtype = rs.secagg().modulus_bits() == 64 ? wire::U64 : wire::U32;
        region_.word = rs.secagg().modulus_bits() / 8;
        region_.words = rs.secagg().vector_length();
        region_.current_words = std::make_shared<std::vector<std::uint8_t>>(region_.words * region_.word);
        region_.acc = std::make_shared<Model>();  // unused, marks the region as set up
      } else {
        region_.acc = std::make_shared<Model>();
        for (const auto& t : region_.layout) region_.acc->add(t.name, t.shape);
        region_.current = std::make_shared<Model>(region_.acc->zeros_like());
      }
      spdlog::info("round {} starts", region_.round);
    }
    const std::string silo = e.silo();
    if (rs.has_secagg()) region_.group_of[silo] = rs.secagg().group();
    if (!silos_.count(silo)) {
      region_.silos[silo] = SiloState::Gone;
      return;
    }
    region_.silos[silo] = SiloState::Training;
    to_silo(silo, e);
  }

  // ---- downstream: the region's silos ---------------------------------------------------
  void to_silo(const std::string& name, wire::Envelope e) {
    auto it = silos_.find(name);
    if (it == silos_.end()) return;
    e.clear_silo();
    it->second->send(std::move(e));
  }

  void on_silo(std::shared_ptr<Channel> ch) {
    const std::string name = ch->peer().name;
    if (finished_) {
      auto e = transport::envelope(cfg_.federation, region_.round);
      e.mutable_finished()->set_reason("the federation has finished");
      ch->send(std::move(e));
      return;
    }
    if (auto old = silos_.find(name); old != silos_.end()) {
      old->second->close_with_error(wire::UNEXPECTED, "replaced by a newer connection");
      silo_gone(name);
    }
    silos_[name] = ch;
    spdlog::info("silo {} joined ({} in the region)", name, silos_.size());
    send_region_status();
    asio::co_spawn(io_, serve_silo(name, ch), asio::detached);
  }

  awaitable<void> serve_silo(std::string name, std::shared_ptr<Channel> ch) {
    for (;;) {
      auto env = co_await ch->read();
      if (!env) {
        if (env.status().code != wire::ERROR_UNSPECIFIED) ch->close_with_error(env.status().code, env.status().message);
        break;
      }
      from_silo(name, *env);
    }
    if (auto it = silos_.find(name); it != silos_.end() && it->second == ch) {
      silos_.erase(it);
      silo_gone(name);
      spdlog::info("silo {} left ({} in the region)", name, silos_.size());
      send_region_status();
    }
  }

  void silo_error(const std::string& name, wire::ErrorCode code, const std::string& msg) {
    auto e = transport::envelope(cfg_.federation, region_.round);
    e.mutable_error()->set_code(code);
    e.mutable_error()->set_message(msg);
    to_silo(name, std::move(e));
  }

  void from_silo(const std::string& name, const wire::Envelope& e) {
    using B = wire::Envelope::BodyCase;
    auto st = region_.silos.find(name);
    const bool in_round = st != region_.silos.end() && e.round() == region_.round && !region_.sent;
    switch (e.body_case()) {
      case B::kSecaggKeys:
      case B::kSecaggShares:
      case B::kSecaggUnmaskShares: {
        wire::Envelope relay = e;  // masked protocol messages pass through unread
        relay.set_silo(name);
        to_server(std::move(relay));
        break;
      }
      case B::kUpdateReady: {
        if (!in_round || st->second != SiloState::Training) {
          silo_error(name, wire::WRONG_ROUND, "UpdateReady not expected for round " + std::to_string(e.round()));
          return;
        }
        st->second = SiloState::Ready;
        region_.samples_weight[name] = {e.update_ready().num_samples(), 0};
        wire::Envelope relay = e;
        relay.set_silo(name);
        to_server(std::move(relay));  // the server tracks every silo's readiness and metrics
        region_.ready.push_back(name);
        pump();
        break;
      }
      case B::kTensorChunk: {
        if (!in_round || region_.uploading != name || region_.folding) {
          silo_error(name, wire::UNEXPECTED, "TensorChunk without an UploadGrant");
          return;
        }
        auto s = region_.rx.add(e.tensor_chunk());
        if (!s) {
          silo_error(name, s.code, s.message);
          st->second = SiloState::Gone;
          region_.uploading.clear();
          pump();
        }
        break;
      }
      case B::kUpdateEnd: {
        if (!in_round || region_.uploading != name || region_.folding) {
          silo_error(name, wire::UNEXPECTED, "UpdateEnd without an UploadGrant");
          return;
        }
        const double w = e.update_end().weight();
        if (!region_.rx.complete() || (!region_.secure && (!std::isfinite(w) || w <= 0))) {
          silo_error(name, wire::BAD_UPDATE, "incomplete update or non-positive weight");
          st->second = SiloState::Gone;
          region_.uploading.clear();
          pump();
          return;
        }
        region_.samples_weight[name].second = w;
        fold(name);
        break;
      }
      case B::kError: spdlog::warn("silo {} reports: {}", name, e.error().message()); break;
      default: silo_error(name, wire::UNEXPECTED, "a silo may not send " + proto::body_name(e));
    }
  }

  // Checks the upload for non-finite values and adds it to the region's sum on the worker.
  void fold(const std::string& name) {
    region_.folding = true;
    const std::uint64_t round = region_.round;
    if (region_.secure) {
      const std::uint32_t g = region_.group_of[name];
      auto& sum = region_.group_sum[g];
      if (!sum) sum = std::make_shared<std::vector<std::uint8_t>>(region_.words * region_.word, 0);
      asio::post(pool_, [this, name, round, sum, cur = region_.current_words, word = region_.word] {
        // Masked words of one group add up mod 2^bits; the edge never sees anything else.
        const std::size_t n = cur->size() / word;
        for (std::size_t i = 0; i < n; ++i) {
          if (word == 4) {
            std::uint32_t a, b;
            std::memcpy(&a, sum->data() + 4 * i, 4);
            std::memcpy(&b, cur->data() + 4 * i, 4);
            a += b;
            std::memcpy(sum->data() + 4 * i, &a, 4);
          } else {
            std::uint64_t a, b;
            std::memcpy(&a, sum->data() + 8 * i, 8);
            std::memcpy(&b, cur->data() + 8 * i, 8);
            a += b;
            std::memcpy(sum->data() + 8 * i, &a, 8);
          }
        }
        asio::post(io_, [this, name, round] {
          if (round != region_.round) return;
          region_.folding = false;
          region_.uploading.clear();
          region_.silos[name] = SiloState::Done;
          wire::Contributor c;
          c.set_silo(name);
          c.set_num_samples(region_.samples_weight[name].first);
          region_.group_contributors[region_.group_of[name]].push_back(c);
          region_.contributors.push_back(c);
          pump();
        });
      });
      return;
    }
    asio::post(pool_, [this, name, round, acc_model = region_.acc, cur_model = region_.current] {
      const auto cur = cur_model->flat();
      bool finite = true;
      for (float v : cur) finite = finite && std::isfinite(v);
      if (finite) {
        auto acc = acc_model->flat();
        for (std::size_t i = 0; i < cur.size(); ++i) acc[i] += cur[i];
      }
      asio::post(io_, [this, name, round, finite] {
        if (round != region_.round) return;
        region_.folding = false;
        region_.uploading.clear();
        if (!finite) {
          silo_error(name, wire::BAD_UPDATE, "update contains NaN or infinite values");
          region_.silos[name] = SiloState::Gone;
        } else {
          region_.silos[name] = SiloState::Done;
          wire::Contributor c;
          c.set_silo(name);
          c.set_num_samples(region_.samples_weight[name].first);
          c.set_weight(region_.samples_weight[name].second);
          region_.contributors.push_back(c);
        }
        pump();
      });
    });
  }

  void silo_gone(const std::string& name) {
    auto st = region_.silos.find(name);
    if (st == region_.silos.end()) return;
    if (region_.uploading == name && !region_.folding) region_.uploading.clear();
    if (st->second != SiloState::Done) st->second = SiloState::Gone;
    pump();
  }

  // Grants the next silo's upload, or finishes the region when nothing is left to wait for.
  void pump() {
    if (region_.sent || !region_.acc || region_.folding) return;
    if (!region_.finalize && region_.uploading.empty()) {
      while (!region_.ready.empty()) {
        const std::string next = region_.ready.front();
        region_.ready.pop_front();
        if (region_.silos[next] != SiloState::Ready) continue;
        region_.silos[next] = SiloState::Uploading;
        region_.uploading = next;
        if (region_.secure) {
          region_.rx.reset_words(*region_.current_words, {{"masked", {region_.words}, 0}}, region_.dtype,
                                 /*hash=*/false);
        } else {
          region_.rx.reset(region_.current->flat(), region_.layout, /*hash=*/false);
        }
        auto g = transport::envelope(cfg_.federation, region_.round);
        g.mutable_upload_grant();
        to_silo(next, std::move(g));
        return;
      }
    }
    maybe_finish_region();
  }

  void maybe_finish_region() {
    if (region_.sent || !region_.acc || region_.folding) return;
    bool waiting = false;
    for (const auto& [name, state] : region_.silos) {
      waiting = waiting || state == SiloState::Training || state == SiloState::Ready || state == SiloState::Uploading;
    }
    if (!region_.finalize) {
      if (!waiting && !region_.announced) {
        // Every selected silo is done or gone: ask the server for the upload slot.
        region_.announced = true;
        auto e = transport::envelope(cfg_.federation, region_.round);
        std::uint64_t n = 0;
        for (const auto& c : region_.contributors) n += c.num_samples();
        e.mutable_update_ready()->set_num_samples(n);
        to_server(std::move(e));
      }
      return;
    }
    // Granted (or forced at the server's deadline): send the sum of what arrived.
    region_.sent = true;
    if (!region_.uploading.empty()) {
      silo_error(region_.uploading, wire::UNEXPECTED, "the region's upload closed before yours arrived");
      region_.uploading.clear();
    }
    if (region_.secure && !region_.group_contributors.empty()) {
      // One partial sum per secure group, each in its own upload slot: the server grants the
      // next once it has folded the last (UpdateEnd.more says another one follows).
      for (const auto& [g, contributors] : region_.group_contributors) region_.unsent_groups.push_back(g);
      spdlog::info("round {}: masked partial sums of {} silos in {} groups to send", region_.round,
                   region_.contributors.size(), region_.group_contributors.size());
      send_next_group();
      return;
    }
    double weight = 0;
    auto end = transport::envelope(cfg_.federation, region_.round);
    for (const auto& c : region_.contributors) {
      weight += c.weight();
      *end.mutable_update_end()->add_contributors() = c;
    }
    end.mutable_update_end()->set_weight(weight);
    if (!region_.contributors.empty() && !region_.secure) {
      auto src = std::make_shared<protocol::ChunkSource>(region_.acc, region_.acc->flat(), region_.layout,
                                                          cfg_.federation, region_.round, cfg_.chunk_bytes);
      up_->send_stream([src, max = cfg_.channel.max_frame_bytes] { return src->next_frame(max); });
    }
    to_server(std::move(end));
    spdlog::info("round {}: partial sum of {} silos sent", region_.round, region_.contributors.size());
  }

  void send_next_group() {
    if (region_.unsent_groups.empty() || !up_) return;
    const std::uint32_t g = region_.unsent_groups.front();
    region_.unsent_groups.pop_front();
    const auto& sum = region_.group_sum[g];
    auto src = std::make_shared<protocol::ChunkSource>(sum, *sum, region_.dtype,
                                                        std::vector<TensorInfo>{{"masked", {region_.words}, 0}},
                                                        cfg_.federation, region_.round, cfg_.chunk_bytes);
    up_->send_stream([src, max = cfg_.channel.max_frame_bytes] { return src->next_frame(max); });
    auto end = transport::envelope(cfg_.federation, region_.round);
    auto* u = end.mutable_update_end();
    u->set_group(g);
    u->set_more(!region_.unsent_groups.empty());
    for (const auto& c : region_.group_contributors[g]) *u->add_contributors() = c;
    to_server(std::move(end));
    spdlog::info("round {}: masked partial sum of group {} ({} silos) sent", region_.round, g,
                 region_.group_contributors[g].size());
  }

  // Stops accepting, lets queued messages (Finished) reach the silos, then closes.
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    if (listener_) listener_->stop();
    signals_.cancel();
    auto t = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(300));
    t->async_wait([this, t](boost::system::error_code) {
      if (up_) up_->close();
      for (auto& [name, ch] : silos_) ch->close();
      io_.stop();
    });
  }

  const EdgeConfig& cfg_;
  const std::set<wire::Role> server_role_{wire::SERVER};
  const transport::LocalInfo me_{cfg_.federation, wire::EDGE, {"plain"}};
  asio::io_context io_;
  asio::thread_pool pool_;
  asio::signal_set signals_;
  transport::ssl::context tls_;
  transport::Backoff backoff_;
  std::unique_ptr<transport::Listener> listener_;
  std::shared_ptr<Channel> up_;
  std::map<std::string, std::shared_ptr<Channel>> silos_;
  Region region_;
  bool stopped_ = false, finished_ = false;
  int exit_code_ = 0;
};

}  // namespace

int run_edge(const EdgeConfig& cfg) {
  Edge edge(cfg);
  return edge.run();
}

}  // namespace xsilo::edge
