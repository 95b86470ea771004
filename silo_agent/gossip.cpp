#include "silo_agent/gossip.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/finite.h"
#include "crypto/sources.h"

namespace xsilo::agent {

namespace {

using Clock = std::chrono::steady_clock;
using collective::GossipKind;
using collective::GossipMessage;

// A worker holding less mass than this keeps it until pushes come in (see push()).
constexpr double kMinPushWeight = 0.5;

// One worker's push-sum run: the steps, then the end protocol of gossip.h.
class GossipRun {
 public:
  GossipRun(collective::GossipLinks& links, int shards, const Network& net, std::span<float> params,
            const Dataset& data, const TrainOptions& opts, const RunHooks& hooks)
      : links_(links), shards_(shards), net_(net), params_(params), data_(data), opts_(opts), hooks_(hooks),
        schedule_(data, opts), budget_(static_cast<std::uint64_t>(data.rows) * opts.epochs),
        max_steps_(schedule_.steps() * static_cast<std::uint64_t>(std::max(1, shards)) * 2),
        rng_(crypto::derive_seed(opts.seed, 0, "gossip-peer", std::to_string(links.rank()))),
        x_(params.begin(), params.end()), z_(params.size()), g_(params.size()) {}

  GossipResult run(const GossipWrite& write) {
    std::uint64_t op = 0;
    for (; op < max_steps_; ++op) {
      absorb(links_.pump());
      if (stopping_ || known_rows() >= budget_) break;
      step(op);
      // Steps past the round's (a fast worker covering for a slow one) walk the epochs again:
      // they are no epoch of the round's to report ("epoch 12 of 10").
      const auto epoch = (op + 1) / schedule_.steps_per_epoch();
      if (hooks_.on_epoch && (op + 1) % schedule_.steps_per_epoch() == 0 && epoch <= opts_.epochs) {
        hooks_.on_epoch(static_cast<std::uint32_t>(epoch));
      }
    }
    result_.own_steps = op;
    result_.own_weight = w_;
    stop();
    result_.own = ratio();
    collect(write);
    for (const auto& e : links_.events()) result_.events.push_back(e);
    return result_;
  }

 private:
  // Adds the mass that arrived or came back; notes who stopped and keeps finals for collecting.
  // A message whose values no worker of this binary sends (malformed()) drops its peer, and
  // nothing more of that peer's is taken: one bad value added would spread to every worker.
  void absorb(std::vector<GossipMessage> arrived) {
    for (auto& m : links_.take_returned()) {
      if (m.kind == GossipKind::push) add(m);  // a final that came back is still ours: we kept x
    }
    for (auto& m : arrived) {
      if (refused_.count(m.from)) continue;
      if (const auto why = malformed(m); !why.empty()) {
        refused_.insert(m.from);
        links_.drop(m.from, "sent a malformed message: " + why);
        continue;
      }
      switch (m.kind) {
        case GossipKind::push:
          add(m);
          rows_of_[m.from] = std::max(rows_of_[m.from], m.rows);
          break;
        case GossipKind::done:
          stopped_.insert(m.from);
          stopping_ = true;
          break;
        case GossipKind::final: finals_[m.from] = std::move(m); break;
        case GossipKind::written: written_.insert(m.from); break;
      }
    }
  }

  // Why a message from a peer cannot be taken, or "" (its size the links checked already): a
  // push or final must carry a finite positive weight and finite floats, a push no more rows
  // than the round's work, a final a finite loss and no more steps than a worker may run.
  std::string malformed(const GossipMessage& m) const {
    if (m.kind != GossipKind::push && m.kind != GossipKind::final) return {};
    if (!std::isfinite(m.weight) || m.weight <= 0) return "weight " + std::to_string(m.weight);
    if (!all_finite(m.x)) return "a model with values that are not finite";
    if (m.kind == GossipKind::push && m.rows > budget_) {
      return std::to_string(m.rows) + " rows trained, past the round's " + std::to_string(budget_);
    }
    if (m.kind == GossipKind::final && (!std::isfinite(m.loss_sum) || m.steps > max_steps_)) {
      return "loss sum " + std::to_string(m.loss_sum) + " over " + std::to_string(m.steps) + " steps";
    }
    return {};
  }

  // The rows trained on by this worker and, as far as their pushes have told, by the others
  // (a dead worker's last count included: its work was done).
  std::uint64_t known_rows() const {
    std::uint64_t n = rows_;
    for (const auto& [peer, rows] : rows_of_) n += rows;
    return n;
  }

  void add(const GossipMessage& m) {  // m.x has the model's size: the links let no other through
    received_ = true;
    for (std::size_t k = 0; k < x_.size(); ++k) x_[k] += m.x[k];
    w_ += m.weight;
  }

  std::vector<float> ratio() const {
    std::vector<float> z(x_.size());
    const auto w = static_cast<float>(w_);
    for (std::size_t k = 0; k < x_.size(); ++k) z[k] = x_[k] / w;
    return z;
  }

  // Live workers (this one included), ascending: whose shards are whose.
  std::vector<int> members() const {
    auto m = links_.live_peers();
    m.push_back(links_.rank());
    std::sort(m.begin(), m.end());
    return m;
  }

  void step(std::uint64_t op) {
    // Past the round's steps (a fast worker covering for a slow one), the epochs start over.
    const auto live = members();
    xb_.clear();
    yb_.clear();
    for (const std::size_t r : schedule_.rows(op)) {
      if (shard_owner(schedule_.shard_of(r, shards_), shards_, live) != links_.rank()) continue;
      xb_.insert(xb_.end(), data_.row(r), data_.row(r) + data_.features);
      yb_.push_back(data_.y[r]);
    }
    const auto began = Clock::now();
    if (!yb_.empty()) {
      const float w = static_cast<float>(w_);
      for (std::size_t k = 0; k < x_.size(); ++k) z_[k] = x_[k] / w;
      loss_sum_ += net_.loss_and_grad(z_, xb_.data(), yb_.data(), yb_.size(), g_);
      ++loss_steps_;
      rows_ += yb_.size();
      // z moves by one SGD step, x = w z by w times it (gossip.h says why not SGP's x -= lr g).
      const float lw = opts_.learning_rate * w;
      for (std::size_t k = 0; k < x_.size(); ++k) x_[k] -= lw * (g_[k] + opts_.weight_decay * z_[k]);
    }
    if (hooks_.slow_down) {
      const auto until = Clock::now() + hooks_.slow_down(op, Clock::now() - began);
      while (Clock::now() < until) {
        std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(1), until - Clock::now()));
      }
    }
    push();
  }

  // Half of (x, w) to one live peer that has not stopped, drawn at random. A worker that runs
  // many steps while its peers run none (a burst on a shared core, a peer slow to start) would
  // halve its mass at each one and its steps would count for nothing: below kMinPushWeight it
  // pushes only when a push has come in since its last (not an absolute floor: after mass was
  // lost to a dead or stalled worker, the survivors' w may all be small, and they must still mix).
  // It waits for nobody either way.
  void push() {
    if (w_ < kMinPushWeight && !received_) return;
    received_ = false;
    // At most one push waits for any peer: a slow peer's queue would otherwise grow by a model
    // a step (pushes its socket has not taken stay here as this worker's mass instead).
    std::vector<int> peers;
    for (int p : links_.live_peers()) {
      if (!stopped_.count(p) && links_.pending(p) == 0) peers.push_back(p);
    }
    if (peers.empty()) return;
    const int to = peers[std::uniform_int_distribution<std::size_t>(0, peers.size() - 1)(rng_)];
    for (auto& v : x_) v *= 0.5f;
    w_ *= 0.5;
    GossipMessage m;
    m.kind = GossipKind::push;
    m.weight = w_;
    m.rows = rows_;
    m.x = x_;
    if (!links_.send(to, std::move(m))) {  // dead already: the half stays here
      for (auto& v : x_) v *= 2.0f;
      w_ *= 2.0;
    }
  }

  // Sends `done` to every live peer, then absorbs until each live peer's `done` is in (its
  // pushes came before it) or the peer is given up after the step timeout.
  void stop() {
    for (int p : links_.live_peers()) {
      GossipMessage m;
      m.kind = GossipKind::done;
      links_.send(p, std::move(m));
    }
    const auto since = Clock::now();
    for (;;) {
      absorb(links_.pump(std::chrono::milliseconds(20)));
      bool all = true;
      for (int p : links_.live_peers()) {
        if (stopped_.count(p)) continue;
        all = false;
        if (Clock::now() - since >= links_.timeout()) {
          links_.drop(p, "did not stop within " + std::to_string(links_.timeout().count()) + " ms of this worker");
        }
      }
      if (all) break;
    }
    absorb(links_.pump());
  }

  // The final combination of gossip.h: the lowest live rank collects; the others send it their
  // final (x, w) and wait for `written`, moving on to the next collector when it dies.
  void collect(const GossipWrite& write) {
    int sent_to = -1;
    auto since = Clock::now();
    for (;;) {
      const auto live = members();
      const int collector = live.front();
      if (collector == links_.rank()) return combine(write);
      if (sent_to != collector) {
        GossipMessage m;
        m.kind = GossipKind::final;
        m.weight = w_;
        m.loss_sum = loss_sum_;
        m.steps = loss_steps_;
        m.x = x_;
        links_.send(collector, std::move(m));
        sent_to = collector;
        since = Clock::now();
      }
      absorb(links_.pump(std::chrono::milliseconds(20)));
      if (written_.count(collector)) return finish_own();
      // The collector first waits for its own stragglers' `done` and finals (a timeout each).
      if (links_.live(collector) && Clock::now() - since >= 3 * links_.timeout()) {
        links_.drop(collector, "collected nothing within " + std::to_string(3 * links_.timeout().count()) + " ms");
      }
      if (!links_.live(collector)) result_.events.push_back("collector rank " + std::to_string(collector) + " is gone; the next live rank collects");
    }
  }

  void finish_own() {
    const auto z = ratio();
    std::copy(z.begin(), z.end(), params_.begin());
    result_.stats.steps = result_.own_steps;
    result_.stats.mean_loss = loss_steps_ ? loss_sum_ / static_cast<double>(loss_steps_) : 0.0;
  }

  void combine(const GossipWrite& write) {
    const auto since = Clock::now();
    for (;;) {
      bool all = true;
      for (int p : links_.live_peers()) {
        if (finals_.count(p)) continue;
        all = false;
        if (Clock::now() - since >= 2 * links_.timeout()) {
          links_.drop(p, "sent no final model within " + std::to_string(2 * links_.timeout().count()) + " ms");
        }
      }
      if (all) break;
      absorb(links_.pump(std::chrono::milliseconds(20)));
    }
    std::vector<double> sum(x_.begin(), x_.end());
    double w = w_, loss = loss_sum_;
    std::uint64_t steps = loss_steps_;
    int combined = 1;
    for (const auto& [from, m] : finals_) {
      for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += m.x[k];
      w += m.weight;
      loss += m.loss_sum;
      steps += m.steps;
      ++combined;
    }
    for (std::size_t k = 0; k < sum.size(); ++k) params_[k] = static_cast<float>(sum[k] / w);
    result_.collected = true;
    result_.weight = w;
    result_.combined = combined;
    result_.stats.steps = schedule_.steps();
    result_.stats.mean_loss = steps ? loss / static_cast<double>(steps) : 0.0;
    for (const auto& e : links_.events()) result_.events.push_back(e);
    if (write) write(params_, result_);
    result_.events.clear();  // run() adds the links' events once more
    for (int p : links_.live_peers()) {
      GossipMessage m;
      m.kind = GossipKind::written;
      links_.send(p, std::move(m));
    }
    // Let `written` reach the peers before this worker's links close.
    for (int k = 0; k < 50; ++k) {
      bool flushed = true;
      for (int p : links_.live_peers()) flushed = flushed && links_.pending(p) == 0;
      if (flushed) break;
      links_.pump(std::chrono::milliseconds(10));
    }
  }

  collective::GossipLinks& links_;
  const int shards_;
  const Network& net_;
  std::span<float> params_;
  const Dataset& data_;
  const TrainOptions& opts_;
  const RunHooks& hooks_;
  const BatchSchedule schedule_;
  // The round's work: epochs x rows, summed over the workers; a bound on one worker's steps.
  const std::uint64_t budget_, max_steps_;
  std::mt19937_64 rng_;
  std::vector<float> x_, z_, g_;
  double w_ = 1.0;
  std::vector<float> xb_;
  std::vector<int> yb_;
  double loss_sum_ = 0;
  std::uint64_t loss_steps_ = 0, rows_ = 0;
  std::map<int, std::uint64_t> rows_of_;
  bool stopping_ = false;
  bool received_ = false;  // mass came in since the last push
  std::set<int> stopped_, written_;
  std::set<int> refused_;  // peers dropped for a malformed message
  std::map<int, GossipMessage> finals_;
  GossipResult result_;
};

}  // namespace

GossipResult train_gossip(collective::GossipLinks& links, int shards, const Network& net, std::span<float> params,
                          const Dataset& data, const TrainOptions& opts, const GossipWrite& write,
                          const RunHooks& hooks) {
  if (data.rows == 0) throw std::invalid_argument("gossip training needs rows");
  return GossipRun(links, shards, net, params, data, opts, hooks).run(write);
}

}  // namespace xsilo::agent
