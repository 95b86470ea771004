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
#include "crypto/secagg.h"

#include <sodium.h>
#include <cstring>
#include <optional>
#include "silo_agent/trainer.h"
#include "protocol/tensor_stream.h"

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
  if (cfg.local.workers > 1) {  // written once, as loaded and standardized: what the workers read
    d.workers_train = cfg.state_dir / "local" / "train.csv";
    save_csv(d.workers_train, d.train);
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
  TrainStats stats;
  if (cfg.local.workers > 1) {
    // The silo's own rows, trained by its local workers; the result must equal the single
    // process's within float tolerance, whatever workers die on the way.
    Model local = global;
    TrainOptions o = opts;
    o.seed = round_seed(plan.seed(), round, silo);
    const auto dir = cfg.state_dir / "local" / ("round-" + std::to_string(round));
    const auto r = train_with_workers(cfg.local, dir, local, data.workers_train, o);
    for (const auto& e : r.events) spdlog::warn("round {}: local workers: {}", round, e);
    spdlog::info("round {}: {} local workers trained {} steps", round, cfg.local.workers, r.stats.steps);
    std::filesystem::remove_all(dir);
    stats = r.stats;
    const auto loc = local.flat();
    const auto glo = global.flat();
    for (std::size_t i = 0; i < upd.size(); ++i) upd[i] = loc[i] - glo[i];
  } else {
    stats = train_delta(data.train, silo, upd);
  }
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
      if (!current->is_open()) break;
      switching_ = true;
      // Leave now when idle, else right after this round ends (rounds may follow each other
      // so closely that an idle moment never coincides with a probe).
      if (!in_round_) current->close();
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
    if (crashing_) return;
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
        secure_.reset();
        secure_setup_.reset();
        shares_in_ = false;
        masked_.reset();
        if (rs.has_secagg()) start_secure(rs.secagg());
        if (rx_.complete()) on_model(up);
        break;
      }
      case B::kSecaggKeyList: {
        if (!secure_ || env.round() != round_) break;
        crypto::secagg::KeyList list;
        for (const auto& e : env.secagg_key_list().entries()) {
          crypto::secagg::PublicKeys k;
          if (e.cipher_pk().size() != 32 || e.mask_pk().size() != 32 || e.self_mask_commitment().size() != 32) continue;
          std::memcpy(k.cipher_pk.data(), e.cipher_pk().data(), 32);
          std::memcpy(k.mask_pk.data(), e.mask_pk().data(), 32);
          std::memcpy(k.self_mask_commitment.data(), e.self_mask_commitment().data(), 32);
          list[e.silo()] = k;
        }
        auto shares = secure_->share(list);
        if (!crypto::secagg::ok(shares)) {
          spdlog::error("round {}: secure aggregation: {}", round_, crypto::secagg::error(shares));
          reply_error(wire::UNEXPECTED, crypto::secagg::error(shares));
          break;
        }
        auto out = transport::envelope(cfg_.federation, round_);
        for (const auto& [to, c] : crypto::secagg::value(shares)) {
          auto* e = out.mutable_secagg_shares()->add_entries();
          e->set_recipient(to);
          e->set_ciphertext(c);
        }
        channel_->send(std::move(out));
        maybe_crash("shares");
        break;
      }
      case B::kSecaggShareDelivery: {
        if (!secure_ || env.round() != round_) break;
        crypto::secagg::Ciphertexts from;
        for (const auto& e : env.secagg_share_delivery().entries()) from[e.sender()] = e.ciphertext();
        if (auto err = secure_->receive(from); !err.empty()) {
          spdlog::error("round {}: secure aggregation: {}", round_, err);
          reply_error(wire::BAD_UPDATE, err);
          break;
        }
        shares_in_ = true;
        mask_when_ready();
        break;
      }
      case B::kSecaggUnmaskRequest: {
        if (!secure_ || env.round() != round_) break;
        crypto::secagg::UnmaskRequest req;
        req.dropped.assign(env.secagg_unmask_request().dropped().begin(), env.secagg_unmask_request().dropped().end());
        req.survivors.assign(env.secagg_unmask_request().survivors().begin(),
                             env.secagg_unmask_request().survivors().end());
        auto reply = secure_->unmask(req);
        if (!crypto::secagg::ok(reply)) {
          spdlog::error("round {}: refusing to unmask: {}", round_, crypto::secagg::error(reply));
          reply_error(wire::UNEXPECTED, crypto::secagg::error(reply));
          break;
        }
        auto out = transport::envelope(cfg_.federation, round_);
        for (const auto& [owner, share] : crypto::secagg::value(reply).mask_key_shares) {
          auto* e = out.mutable_secagg_unmask_shares()->add_entries();
          e->set_owner(owner);
          e->set_is_mask_key(true);
          e->set_share(share);
        }
        for (const auto& [owner, share] : crypto::secagg::value(reply).self_mask_shares) {
          auto* e = out.mutable_secagg_unmask_shares()->add_entries();
          e->set_owner(owner);
          e->set_is_mask_key(false);
          e->set_share(share);
        }
        channel_->send(std::move(out));
        spdlog::info("round {}: unmasking shares sent", round_);
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
          if (switching_ && channel_) channel_->close();  // the preferred upstream is back
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

  // Secure aggregation: keys go out at once, overlapping with training.
  void start_secure(const wire::SecAggSetup& setup) {
    crypto::secagg::Params p;
    p.session = cfg_.federation + "/" + std::to_string(round_) + "/" + std::to_string(setup.group());
    p.members.assign(setup.members().begin(), setup.members().end());
    p.threshold = setup.threshold();
    p.bits = setup.modulus_bits();
    p.length = setup.vector_length();
    if (auto why = crypto::secagg::check_params(p); !why.empty() || !p.index_of(name_)) {
      spdlog::error("round {}: unusable secure group: {}", round_, why.empty() ? "this silo is not a member" : why);
      reply_error(wire::UNEXPECTED, "unusable secure group");
      return;
    }
    secure_setup_ = setup;
    secure_ = std::make_shared<crypto::secagg::Client>(p, name_);
    const auto keys = secure_->advertise();
    auto out = transport::envelope(cfg_.federation, round_);
    auto* k = out.mutable_secagg_keys();
    k->set_cipher_pk(std::string(keys.cipher_pk.begin(), keys.cipher_pk.end()));
    k->set_mask_pk(std::string(keys.mask_pk.begin(), keys.mask_pk.end()));
    k->set_self_mask_commitment(std::string(keys.self_mask_commitment.begin(), keys.self_mask_commitment.end()));
    channel_->send(std::move(out));
    spdlog::info("round {}: secure group {} of {} silos (threshold {}); keys advertised", round_, setup.group(),
                 setup.members_size(), setup.threshold());
    maybe_crash("keys");
  }

  // Masks the encoded update once both it and the share deliveries are here (on the worker:
  // one PRG expansion per group member), then announces it.
  void mask_when_ready() {
    if (!secure_ || !shares_in_ || !pending_ || masked_ || masking_) return;
    masking_ = true;
    const auto setup = *secure_setup_;
    const std::uint64_t gen = generation_, round = round_;
    asio::post(pool_, [this, gen, round, setup, client = secure_, update = pending_, weight = pending_out_.weight] {
      crypto::FixedPointParams codec{setup.modulus_bits(), setup.fraction_bits(), setup.clip_norm(), setup.max_weight()};
      const std::size_t d = update->size();
      auto words = std::make_shared<std::vector<std::uint8_t>>((d + 1) * (codec.bits / 8));
      // The upload is weight * delta: the codec wants delta and the weight separately.
      std::vector<float> delta(update->flat().begin(), update->flat().end());
      for (auto& v : delta) v = static_cast<float>(v / weight);
      std::uint64_t seed = 0;
      randombytes_buf(&seed, sizeof seed);
      std::string err;
      if (codec.bits == 32) {
        std::span<std::uint32_t> w(reinterpret_cast<std::uint32_t*>(words->data()), d + 1);
        crypto::encode(codec, delta, weight, seed, w);
        err = client->mask(w);
      } else {
        std::span<std::uint64_t> w(reinterpret_cast<std::uint64_t*>(words->data()), d + 1);
        crypto::encode(codec, delta, weight, seed, w);
        err = client->mask(w);
      }
      const std::string sha = crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(words->data()), words->size()));
      asio::post(io_, [this, gen, round, words, err, sha] {
        masking_ = false;
        if (gen != generation_ || !channel_) return;
        if (!err.empty()) {
          spdlog::error("round {}: masking failed: {}", round, err);
          return;
        }
        masked_ = words;
        pending_out_.sha256 = sha;
        auto e = transport::envelope(cfg_.federation, round);
        e.mutable_update_ready()->set_num_samples(1);  // the real count travels inside the masked sum
        *e.mutable_update_ready()->mutable_metrics() = pending_out_.metrics;
        channel_->send(std::move(e));
        spdlog::info("round {}: update encoded and masked; ready", round);
      });
    });
  }

  // Simulation only: the agent dies right after sending the named protocol step.
  void maybe_crash(const std::string& step) {
    if (cfg_.crash_step != step || cfg_.crash_round != round_) return;
    spdlog::warn("round {}: simulated crash after sending {}", round_, step);
    crashing_ = true;  // from here on the silo does nothing, as if it were already gone
    auto t = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(300));
    t->async_wait([t](boost::system::error_code) { std::_Exit(137); });
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
        if (secure_) {
          mask_when_ready();
          return;
        }
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
    std::shared_ptr<protocol::ChunkSource> src;
    if (secure_) {
      if (!masked_) {
        reply_error(wire::UNEXPECTED, "the masked update is not ready");
        return;
      }
      const auto dtype = secure_setup_->modulus_bits() == 64 ? wire::U64 : wire::U32;
      const std::uint64_t words = secure_setup_->vector_length();
      src = std::make_shared<protocol::ChunkSource>(masked_, *masked_, dtype,
                                                     std::vector<TensorInfo>{{"masked", {words}, 0}},
                                                     cfg_.federation, pending_round_, cfg_.chunk_bytes);
    } else {
      src = std::make_shared<protocol::ChunkSource>(pending_, pending_->flat(), pending_->tensors(),
                                                     cfg_.federation, pending_round_, cfg_.chunk_bytes);
    }
    channel_->send_stream([src, max = cfg_.channel.max_frame_bytes] { return src->next_frame(max); });
    auto e = transport::envelope(cfg_.federation, pending_round_);
    auto* end = e.mutable_update_end();
    end->set_weight(secure_ ? 0.0 : pending_out_.weight);  // secure: inside the masked sum
    end->set_num_samples(secure_ ? 0 : pending_out_.num_samples);
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
  protocol::TensorReceiver rx_;
  std::shared_ptr<Model> pending_;
  std::shared_ptr<Model> spare_;  // last round's update buffer, reused
  std::shared_ptr<crypto::secagg::Client> secure_;
  std::optional<wire::SecAggSetup> secure_setup_;
  std::shared_ptr<std::vector<std::uint8_t>> masked_;
  bool shares_in_ = false, masking_ = false, crashing_ = false;
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
