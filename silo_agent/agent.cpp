#include "silo_agent/agent.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <random>

#include "common/fs.h"
#include "common/mlp.h"
#include "crypto/hash.h"
#include "silo_agent/trainer.h"
#include "transport/tensor_stream.h"

namespace xsilo::agent {

namespace asio = boost::asio;
using transport::awaitable;

namespace {

std::string now_iso() {
  const auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

LocalData load_local_data(const AgentConfig& cfg) {
  LocalData d;
  if (cfg.trainer != "builtin") return d;
  d.train = load_csv(cfg.train_data);
  if (!cfg.test_data.empty()) d.test = load_csv(cfg.test_data);
  if (cfg.standardize == "local") {
    const auto s = Standardizer::fit(d.train);
    s.apply(d.train);
    if (d.test.rows) s.apply(d.test);
  } else if (cfg.standardize == "given") {
    cfg.given.apply(d.train);
    if (d.test.rows) cfg.given.apply(d.test);
  }
  if (cfg.attack.kind == "label_flip") {
    for (auto& y : d.train.y) y = d.train.classes - 1 - y;
  }
  for (const auto& h : cfg.attack.honest) {
    Dataset t = load_csv(h.train);
    if (cfg.standardize == "given") cfg.given.apply(t);
    if (cfg.standardize == "local") Standardizer::fit(t).apply(t);
    d.honest.push_back({h.silo, std::move(t)});
  }
  return d;
}

RoundOutput run_local_round(const AgentConfig& cfg, const LocalData& data, const Model& global,
                            const wire::TrainingPlan& plan, std::uint64_t round,
                            const std::string& silo, std::shared_ptr<Model> reuse) {
  RoundOutput out;
  if (reuse && reuse.use_count() == 1 && reuse->same_layout(global)) {
    out.update = std::move(reuse);  // every element is overwritten below
  } else {
    out.update = std::make_shared<Model>(global.zeros_like());
  }
  if (cfg.trainer == "synthetic") {
    // Benchmarks: a deterministic pseudo-random update, no data and as little compute as
    // possible: a 64 Ki-element random block from splitmix64, tiled over the model and scaled
    // by a per-tile factor.
    out.num_samples = cfg.synthetic_samples;
    out.weight = static_cast<double>(out.num_samples);
    std::uint64_t z = round_seed(plan.seed(), round, silo);
    auto next = [&z] {
      z += 0x9e3779b97f4a7c15ull;
      std::uint64_t x = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      return x ^ (x >> 27);
    };
    constexpr std::size_t kBlock = 1 << 16;
    std::vector<float> block(kBlock);
    const float scale = static_cast<float>(out.weight) * 2e-3f / 16777216.0f;
    for (auto& v : block) v = static_cast<float>(static_cast<std::int64_t>(next() >> 40) - (1 << 23)) * scale;
    auto flat = out.update->flat();
    for (std::size_t i = 0; i < flat.size(); i += kBlock) {
      const float f = 0.5f + static_cast<float>(next() >> 40) / 16777216.0f;
      const std::size_t n = std::min(kBlock, flat.size() - i);
      for (std::size_t k = 0; k < n; ++k) flat[i + k] = block[k] * f;
    }
    out.sha256 = crypto::sha256_hex(out.update->flat());
    return out;
  }
  const Network net(global);
  if (net.inputs() != data.train.features) {
    throw std::runtime_error("local data has " + std::to_string(data.train.features) +
                             " features but the federation's model takes " +
                             std::to_string(net.inputs()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (data.test.rows) {
    const auto ev = net.evaluate(global.flat(), data.test);
    out.metrics.set_eval_loss(ev.loss);
    out.metrics.set_eval_accuracy(ev.accuracy);
    out.metrics.set_eval_samples(ev.samples);
  }
  if (!plan.train()) return out;
  TrainOptions opts;
  opts.epochs = plan.local_epochs();
  opts.batch_size = plan.batch_size();
  opts.learning_rate = plan.learning_rate();
  opts.weight_decay = plan.weight_decay();
  // One silo's delta (local model - global model) on its data, seeded by its name.
  auto train_delta = [&](const Dataset& train, const std::string& name, std::span<float> delta) {
    Model local = global;
    TrainOptions o = opts;
    o.seed = round_seed(plan.seed(), round, name);
    const auto stats = train_sgd(net, local.flat(), train, o);
    const auto loc = local.flat();
    const auto glo = global.flat();
    for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = loc[i] - glo[i];
    return stats;
  };
  auto upd = out.update->flat();
  const auto stats = train_delta(data.train, silo, upd);
  out.metrics.set_train_loss(stats.mean_loss);
  if (cfg.attack.active()) {
    apply_attack(cfg.attack, upd, round_seed(plan.seed() ^ 0xa77ac4, round, silo), [&] {
      std::vector<std::vector<float>> deltas;
      for (const auto& h : data.honest) {
        deltas.emplace_back(global.size());
        train_delta(h.train, h.silo, deltas.back());
      }
      return deltas;
    });
  }
  out.num_samples = data.train.rows;
  out.weight = static_cast<double>(out.num_samples);
  if (plan.max_weight() > 0) out.weight = std::min(out.weight, static_cast<double>(plan.max_weight()));
  // The upload is weight * delta: the server divides the sum by the summed weights.
  const auto w = static_cast<float>(out.weight);
  for (auto& v : upd) v *= w;
  out.sha256 = crypto::sha256_hex(out.update->flat());
  out.metrics.set_train_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return out;
}

namespace {

class Agent {
 public:
  Agent(const AgentConfig& cfg, LocalData data)
      : cfg_(cfg), data_(std::move(data)), pool_(1), signals_(io_, SIGINT, SIGTERM),
        tls_(transport::make_tls_context(cfg.tls)), backoff_(cfg.reconnect) {}

  int run() {
    std::filesystem::create_directories(cfg_.state_dir);
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      spdlog::warn("signal {}: stopping", sig);
      exit_code_ = 130;
      stop();
    });
    asio::co_spawn(io_, main_loop(), asio::detached);
    io_.run();
    pool_.join();
    return exit_code_;
  }

 private:
  awaitable<void> main_loop() {
    std::size_t next = 0;
    while (!stopped_) {
      const auto& up = cfg_.upstreams[next % cfg_.upstreams.size()];
      auto r = co_await transport::dial_once(io_.get_executor(), tls_, up, upstream_roles_, me_,
                                             cfg_.channel);
      if (stopped_) break;
      if (r) {
        backoff_.reset();
        name_ = (*r)->welcome().peer_identity();
        spdlog::info("connected to {} at {} as {}", (*r)->peer().str(), up.str(), name_);
        const std::size_t index = next % cfg_.upstreams.size();
        if (index > 0) {
          // A backup: look for the preferred upstream now and then, and go back between rounds.
          asio::co_spawn(io_, probe_preferred(*r), asio::detached);
        }
        co_await session(*r, up);
        if (finished_ || stopped_) break;
        if (switching_) {
          spdlog::info("the preferred upstream {} is back; moving to it", cfg_.upstreams[0].str());
          switching_ = false;
        } else {
          spdlog::warn("lost the connection to {}; trying the upstreams in order", up.str());
        }
        next = 0;  // start again from the preferred upstream
        continue;
      }
      spdlog::warn("{}", r.status().message);
      if (cfg_.reconnect.max_attempts > 0 && backoff_.attempts() >= cfg_.reconnect.max_attempts) {
        spdlog::error("giving up after {} attempts", backoff_.attempts());
        exit_code_ = 1;
        break;
      }
      ++next;
      asio::steady_timer t(io_, backoff_.next());
      boost::system::error_code ec;
      co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    stop();
  }

  // While `current` (a backup upstream) is in use: every probe interval, dial the preferred
  // upstream; when it answers and no round is in progress here, leave the backup.
  awaitable<void> probe_preferred(std::shared_ptr<transport::Channel> current) {
    while (!stopped_ && current->is_open()) {
      asio::steady_timer t(io_, cfg_.failover_probe);
      boost::system::error_code ec;
      co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (stopped_ || !current->is_open()) break;
      auto r = co_await transport::dial_once(io_.get_executor(), tls_, cfg_.upstreams[0], upstream_roles_, me_,
                                             cfg_.channel);
      if (!r) continue;
      (*r)->close();
      if (in_round_ || !current->is_open()) continue;
      switching_ = true;
      current->close();
      break;
    }
  }

  awaitable<void> session(std::shared_ptr<transport::Channel> ch, const Endpoint& up) {
    channel_ = ch;
    for (;;) {
      auto env = co_await ch->read();
      if (!env) {
        if (env.status().code != wire::ERROR_UNSPECIFIED) {
          spdlog::warn("{}: {}", ch->peer().str(), env.status().message);
          ch->close_with_error(env.status().code, env.status().message);
        }
        break;
      }
      handle(*env, up);
      if (finished_) break;
    }
    channel_.reset();
    ++generation_;  // whatever was in flight belongs to a connection that is gone
    pending_.reset();
    in_round_ = false;
    co_return;
  }

  void handle(const wire::Envelope& env, const Endpoint& up) {
    using B = wire::Envelope::BodyCase;
    switch (env.body_case()) {
      case B::kRoundStart: {
        const auto& rs = env.round_start();
        ++generation_;
        pending_.reset();
        in_round_ = true;
        round_ = rs.round();
        plan_ = rs.plan();
        expected_sha_ = rs.model_sha256();
        Model layout_only;
        for (const auto& t : rs.tensors()) layout_only.add_layout(t.name(), {t.shape().begin(), t.shape().end()});
        // Reuse last round's buffer when nothing else holds it: no fresh pages every round.
        if (!global_ || global_.use_count() > 1 || !global_->same_layout(layout_only)) {
          global_ = std::make_shared<Model>();
          for (const auto& t : layout_only.tensors()) global_->add(t.name, t.shape);
        }
        // TLS authenticates every byte on the way; the announced hash is recorded in the
        // silo's log rather than recomputed (one SHA-256 pass per round saved).
        rx_.reset(global_->flat(), global_->tensors(), /*hash=*/false);
        if (rx_.complete()) on_model(up);
        break;
      }
      case B::kTensorChunk: {
        if (!global_ || env.round() != round_) {
          reply_error(wire::WRONG_ROUND, "model chunk for a round that has not started here");
          break;
        }
        auto st = rx_.add(env.tensor_chunk());
        if (!st) {
          spdlog::error("round {}: bad model chunk: {}", round_, st.message);
          reply_error(wire::BAD_UPDATE, st.message);
          global_.reset();
          break;
        }
        if (rx_.complete()) on_model(up);
        break;
      }
      case B::kUploadGrant:
        if (!pending_ || env.round() != pending_round_) {
          reply_error(wire::UNEXPECTED, "UploadGrant but no update is ready for round " +
                                            std::to_string(env.round()));
          break;
        }
        upload(up);
        break;
      case B::kRoundEnd:
        spdlog::info("round {} ended for this silo: {}{}", env.round(),
                     env.round_end().committed() ? "committed" : "not committed",
                     env.round_end().reason().empty() ? "" : " (" + env.round_end().reason() + ")");
        if (env.round() == round_) {
          ++generation_;
          in_round_ = false;
          if (pending_) spare_ = std::move(pending_);
        }
        break;
      case B::kFinished:
        spdlog::info("the federation finished after {} rounds: {}", env.finished().rounds(),
                     env.finished().reason());
        finished_ = true;
        break;
      case B::kError:
        spdlog::warn("{} reports: {}", channel_ ? channel_->peer().str() : "upstream",
                     env.error().message());
        break;
      default:
        reply_error(wire::UNEXPECTED, "a silo does not expect " + proto::body_name(env));
    }
  }

  void reply_error(wire::ErrorCode code, const std::string& msg) {
    if (!channel_) return;
    auto e = transport::envelope(cfg_.federation, round_);
    e.mutable_error()->set_code(code);
    e.mutable_error()->set_message(msg);
    channel_->send(std::move(e));
  }

  // The whole model has arrived: evaluate and train off the network thread.
  void on_model(const Endpoint& up) {
    const std::uint64_t gen = generation_, round = round_;
    auto model = global_;
    auto plan = plan_;
    spdlog::info("round {}: model received ({} parameters); training", round, model->size());
    asio::post(pool_, [this, gen, round, model, plan, up, spare = std::move(spare_)]() mutable {
      RoundOutput out;
      std::string error;
      try {
        out = run_local_round(cfg_, data_, *model, plan, round, name_, std::move(spare));
      } catch (const std::exception& e) {
        error = e.what();
      }
      asio::post(io_, [this, gen, round, out = std::move(out), error] {
        if (gen != generation_ || !channel_) return;  // the round or connection moved on
        if (!error.empty()) {
          spdlog::error("round {}: {}", round, error);
          reply_error(wire::BAD_UPDATE, error);
          return;
        }
        pending_ = out.update;
        pending_round_ = round;
        pending_model_sha_ = expected_sha_;
        pending_out_ = out;
        auto e = transport::envelope(cfg_.federation, round);
        auto* r = e.mutable_update_ready();
        r->set_num_samples(out.num_samples);
        *r->mutable_metrics() = out.metrics;
        if (plan_.train()) {
          channel_->send(std::move(e));
          spdlog::info("round {}: trained on {} samples (loss {:.4f}); update ready", round,
                       out.num_samples, out.metrics.train_loss());
        }
      });
    });
  }

  void upload(const Endpoint& up) {
    auto src = std::make_shared<transport::ChunkSource>(
        pending_, pending_->flat(), pending_->tensors(), cfg_.federation, pending_round_,
        cfg_.chunk_bytes);
    channel_->send_stream([src, max = cfg_.channel.max_frame_bytes] { return src->next_frame(max); });
    auto e = transport::envelope(cfg_.federation, pending_round_);
    auto* end = e.mutable_update_end();
    end->set_weight(pending_out_.weight);
    end->set_num_samples(pending_out_.num_samples);
    end->set_update_sha256(pending_out_.sha256);
    *end->mutable_metrics() = pending_out_.metrics;
    channel_->send(std::move(e));
    // The silo's own record of what left the building: hashes, never data.
    nlohmann::json rec = {{"time", now_iso()},
                          {"round", pending_round_},
                          {"upstream", up.str()},
                          {"upstream_identity", channel_->peer().str()},
                          {"model_sha256", pending_model_sha_},
                          {"update_sha256", pending_out_.sha256},
                          {"weight", pending_out_.weight},
                          {"num_samples", pending_out_.num_samples}};
    try {
      append_durable(cfg_.state_dir / "sent.jsonl", rec.dump() + "\n");
    } catch (const std::exception& ex) {
      spdlog::warn("cannot write the silo's send log: {}", ex.what());
    }
    spdlog::info("round {}: uploading {} bytes", pending_round_, pending_->bytes());
  }

  void stop() {
    stopped_ = true;
    if (channel_) channel_->close();
    signals_.cancel();
    // Give queued messages a moment, then stop the loop.
    auto t = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
    t->async_wait([this, t](boost::system::error_code) { io_.stop(); });
  }

  const AgentConfig& cfg_;
  // GCC 12 miscompiles braced lists inside co_await expressions; keep them out here.
  const std::set<wire::Role> upstream_roles_{wire::SERVER, wire::EDGE};
  const transport::LocalInfo me_{cfg_.federation, wire::SILO, {"plain"}};
  LocalData data_;
  asio::io_context io_;
  asio::thread_pool pool_;
  asio::signal_set signals_;
  transport::ssl::context tls_;
  transport::Backoff backoff_;
  std::shared_ptr<transport::Channel> channel_;
  std::string name_;
  bool stopped_ = false, finished_ = false;
  bool in_round_ = false, switching_ = false;
  int exit_code_ = 0;

  std::uint64_t generation_ = 0;
  std::uint64_t round_ = 0;
  wire::TrainingPlan plan_;
  std::string expected_sha_;
  std::shared_ptr<Model> global_;
  transport::TensorReceiver rx_;
  std::shared_ptr<Model> pending_;
  std::shared_ptr<Model> spare_;  // last round's update buffer, reused
  std::uint64_t pending_round_ = 0;
  std::string pending_model_sha_;
  RoundOutput pending_out_;
};

}  // namespace

int run_agent(const AgentConfig& cfg) {
  LocalData data = load_local_data(cfg);
  if (cfg.trainer == "builtin") {
    spdlog::info("local data: {} training rows, {} test rows, {} features", data.train.rows,
                 data.test.rows, data.train.features);
  }
  Agent agent(cfg, std::move(data));
  return agent.run();
}

}  // namespace xsilo::agent
