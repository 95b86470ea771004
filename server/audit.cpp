#include "server/audit.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

#include "common/fs.h"
#include "crypto/certs.h"
#include "crypto/hash.h"
#include "protocol/audit_key.h"
#include "protocol/privacy.h"
#include "protocol/round_start.h"
#include "server/central_dp.h"
#include "server/distributed_dp.h"

namespace xsilo::server {

using protocol::audit_head_statement;
using protocol::key_rotation_statement;

namespace {

const std::string kGenesis(64, '0');
constexpr std::size_t kSigSuffix = 8 + 128 + 2;  // ,"sig":" + hex + "}

// Splits a line into its signed message and its signature, or returns false.
bool split_signature(const std::string& line, std::string& message, std::string& sig_hex) {
  if (line.size() < kSigSuffix + 2) return false;
  const std::string suffix = line.substr(line.size() - kSigSuffix);
  if (suffix.compare(0, 8, ",\"sig\":\"") != 0 || suffix.compare(kSigSuffix - 2, 2, "\"}") != 0) {
    return false;
  }
  sig_hex = suffix.substr(8, 128);
  message = line.substr(0, line.size() - kSigSuffix) + "}";
  return true;
}

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::vector<std::string> lines;
  if (!std::filesystem::exists(path)) return lines;
  std::ifstream in(path, std::ios::binary);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

namespace {

// Success when `line` is record `n` signed by `pk` and chained to `prev`; otherwise why not.
Status check_line(const std::string& line, const std::string& pk, std::uint64_t n, const std::string& prev) {
  std::string message, sig_hex;
  if (!split_signature(line, message, sig_hex)) return Error("no signature at the end of the line");
  nlohmann::json rec;
  try {
    rec = nlohmann::json::parse(message);
  } catch (const std::exception&) {
    return Error("not valid JSON");
  }
  std::string sig;
  try {
    sig = crypto::from_hex(sig_hex);
  } catch (const std::exception&) {
    return Error("signature is not hex");
  }
  if (!crypto::verify_signature(pk, message, sig)) {
    return Error("signature does not verify (record edited, or signed by another key)");
  }
  if (!rec.contains("seq") || !rec["seq"].is_number_unsigned() || rec["seq"].get<std::uint64_t>() != n) {
    return Error("sequence number " + (rec.contains("seq") ? rec["seq"].dump() : "missing") + ", expected " +
                 std::to_string(n) + " (record deleted, inserted or reordered)");
  }
  if (rec.value("prev", "") != prev) {
    return Error("does not chain to the record before it (record deleted, inserted or reordered)");
  }
  return {};
}

}  // namespace

std::string key_hex(const std::string& public_key) {
  return crypto::to_hex(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(public_key.data()), public_key.size()));
}

bool AuditChain::has_key(const std::string& public_key) const {
  return std::any_of(keys.begin(), keys.end(), [&](const AuditKeySpan& k) { return k.public_key == public_key; });
}

namespace {

// The next key a verified record names ("" when it is no rotation record, `sig` the old key's
// signature of the rotation), or why its rotation is not well formed.
Result<std::string> rotation_next_key(const std::string& line, const std::string& old_key, std::string& sig) {
  std::string message, sig_hex;
  split_signature(line, message, sig_hex);
  const auto rec = nlohmann::json::parse(message);
  if (rec.value("event", "") != "key_rotation") return std::string();
  try {
    const std::string next = crypto::public_key_from_hex(rec.at("next_public_key").get<std::string>(), "next_public_key");
    sig = crypto::from_hex(rec.at("rotation_signature").get<std::string>());
    if (!crypto::verify_signature(old_key, key_rotation_statement(old_key, next), sig)) {
      return Error("its rotation_signature is not the old key's");
    }
    return next;
  } catch (const std::exception& e) {
    return Error(std::string("a key rotation without a usable next key (") + e.what() + ")");
  }
}

}  // namespace

AuditVerifyResult verify_audit_log(const std::filesystem::path& path, const std::string& pk) {
  AuditChain r;
  r.head_sha256 = kGenesis;
  r.keys.push_back({pk, 1, ""});
  if (!std::filesystem::exists(path)) {
    return AuditBreak{.reason = "no audit log at " + path.string(), .first_bad = 0, .verified = std::move(r)};
  }
  // A line at a time: a server verifies its whole log at every start, and must not hold it.
  std::ifstream in(path, std::ios::binary);
  std::uint64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const std::string& key = r.keys.back().public_key;
    const auto checked = check_line(line, key, n, r.head_sha256);
    std::string sig;
    const auto next = checked ? rotation_next_key(line, key, sig) : Result<std::string>(checked.error());
    if (!next) {
      return AuditBreak{
          .reason = "record " + std::to_string(n) + ": " + next.error().message(), .first_bad = n, .verified = std::move(r)};
    }
    if (!next->empty()) r.keys.push_back({*next, n + 1, sig});
    r.head_sha256 = crypto::sha256_hex(line);
    r.line_sha256.push_back(r.head_sha256);
    r.records = n;
  }
  if (in.bad()) return AuditBreak{.reason = "cannot read " + path.string(), .first_bad = 0, .verified = std::move(r)};
  return r;
}

WitnessResult check_witness(const AuditChain& log, const std::filesystem::path& witness) {
  WitnessCheck w;
  const std::string who = witness.filename().string();
  if (!std::filesystem::exists(witness)) return Error(who + ": no such witness file");
  std::uint64_t n = 0;
  for (const auto& line : read_lines(witness)) {
    ++n;
    const std::string at = who + " line " + std::to_string(n) + ": ";
    AuditHead h;
    std::string named_key;  // the key the silo checked the head under ("" in files before it did)
    try {
      const auto j = nlohmann::json::parse(line);
      h.seq = j.at("seq").get<std::uint64_t>();
      h.sha256 = j.at("head").get<std::string>();
      h.signature = j.at("sig").get<std::string>();
      if (j.contains("key")) named_key = crypto::public_key_from_hex(j["key"].get<std::string>(), "key");
    } catch (const std::exception& e) {
      if (!w.ignored++) w.first_ignored = at + "not a witness entry (" + e.what() + ")";
      continue;
    }
    if (!named_key.empty() && !log.has_key(named_key)) {
      return Error(at + "the silo witnessed a log signed by key " + key_hex(named_key).substr(0, 16) +
                   ", which this log never names (its first key is " + key_hex(log.keys.front().public_key).substr(0, 16) +
                   ", with no rotation from that one): another server's log, or one started again");
    }
    std::string sig;
    try {
      sig = crypto::from_hex(h.signature);
    } catch (const std::exception&) {
      sig.clear();
    }
    const bool signed_by_log = !sig.empty() && std::any_of(log.keys.begin(), log.keys.end(), [&](const AuditKeySpan& k) {
      return crypto::verify_signature(k.public_key, audit_head_statement(h.seq, h.sha256), sig);
    });
    if (!signed_by_log) {
      if (!w.ignored++) w.first_ignored = at + "its head is not signed by this log's audit key";
      continue;
    }
    if (h.seq == 0) return Error(at + "the server signed a head for record 0, which no log has");
    if (h.seq > log.records) {
      return Error(at + "the server signed record " + std::to_string(h.seq) + " as head " + h.sha256.substr(0, 16) +
                   ", but the log has only " + std::to_string(log.records) + " records: its tail was cut");
    }
    if (log.line_sha256[h.seq - 1] != h.sha256) {
      return Error(at + "the server signed record " + std::to_string(h.seq) + " as head " + h.sha256.substr(0, 16) +
                   ", the log's record " + std::to_string(h.seq) + " hashes to " +
                   log.line_sha256[h.seq - 1].substr(0, 16) + ": the log was rewritten or forked");
    }
    ++w.checked;
  }
  if (w.checked == 0 && w.ignored > 0) {
    return Error(who + ": none of its " + std::to_string(w.ignored) +
                 " entries is signed by this log's audit key: the silo witnessed another log (" + w.first_ignored + ")");
  }
  return w;
}

std::vector<nlohmann::json> read_audit_log(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::size_t n = 0;
  for (const auto& line : read_lines(path)) {
    ++n;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const std::exception&) {
      throw std::runtime_error(path.string() + ": record " + std::to_string(n) + " is not JSON");
    }
  }
  return out;
}

AuditLog::AuditLog(std::filesystem::path path, crypto::SigningKey key, std::string first_key)
    : path_(std::move(path)), key_(std::move(key)), head_(kGenesis) {
  if (first_key.empty()) first_key = key_.public_key();
  keys_.push_back({first_key, 1, ""});
  if (std::filesystem::exists(path_)) {
    auto v = verify_audit_log(path_, first_key);
    if (!v) {
      throw std::runtime_error("audit log " + path_.string() + " is damaged (" + v.error().reason +
                               "); refusing to append to it");
    }
    seq_ = v->records;
    head_ = v->head_sha256;
    keys_ = std::move(v->keys);
    lines_ = std::move(v->line_sha256);
  } else if (path_.has_parent_path()) {
    std::filesystem::create_directories(path_.parent_path());
  }
  if (keys_.back().public_key != key_.public_key()) {
    throw std::runtime_error("the audit key " + key_hex(key_.public_key()).substr(0, 16) + " is not the key " +
                             path_.string() + " is signed with now (" + key_hex(keys_.back().public_key).substr(0, 16) +
                             "); refusing to sign a record it could not verify");
  }
}

AuditHead AuditLog::rotate(crypto::SigningKey next, nlohmann::json fields) {
  const std::string old_key = key_.public_key(), next_key = next.public_key();
  const std::string sig = key_.sign(key_rotation_statement(old_key, next_key));
  fields["event"] = "key_rotation";
  fields["next_public_key"] = key_hex(next_key);
  fields["rotation_signature"] = key_hex(sig);
  append(std::move(fields));
  keys_.push_back({next_key, seq_ + 1, sig});
  key_ = std::move(next);
  return signed_head();
}

std::string AuditLog::seal(nlohmann::json record) const {
  record.erase("sig");
  record["seq"] = seq_ + 1;
  record["prev"] = head_;
  // A record holds peers' words (reasons): never let a byte that is not UTF-8 stop the log.
  const std::string message = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string raw_sig = key_.sign(message);
  const std::string sig = crypto::to_hex(std::span<const std::uint8_t>(
      reinterpret_cast<const std::uint8_t*>(raw_sig.data()), raw_sig.size()));
  return message.substr(0, message.size() - 1) + ",\"sig\":\"" + sig + "\"}";
}

AuditHead AuditLog::append_line(const std::string& line) {
  if (line.find('\n') != std::string::npos) throw std::runtime_error("an audit record must be one line");
  if (const auto checked = check_line(line, key_.public_key(), seq_ + 1, head_); !checked) {
    throw std::runtime_error("refusing to append record " + std::to_string(seq_ + 1) + " to " + path_.string() +
                             ": " + checked.error().message());
  }
  cut_torn_tail(path_);  // a line cut short by a full disk earlier in this run: never append to it
  append_durable(path_, line + "\n");
  ++seq_;
  head_ = crypto::sha256_hex(line);
  lines_.push_back(head_);
  return signed_head();
}

AuditHead AuditLog::signed_head() const {
  const std::string raw = key_.sign(audit_head_statement(seq_, head_));
  return {.seq = seq_,
          .sha256 = head_,
          .signature = crypto::to_hex(
              std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(raw.data()), raw.size())),
          .line = {}};
}

crypto::SigningKey load_signing_key(const std::filesystem::path& path) {
  return crypto::SigningKey::from_hex(read_file(path), path.string());
}

void save_signing_key(const crypto::SigningKey& key, const std::filesystem::path& secret_path,
                      const std::filesystem::path& public_path) {
  std::string hex = key.secret_hex();
  atomic_write_file(secret_path, hex + "\n", 0600);
  sodium_memzero(hex.data(), hex.size());
  atomic_write_file(public_path, key.public_hex() + "\n", 0644);
}

std::string load_public_key(const std::filesystem::path& path) {
  return crypto::public_key_from_hex(read_file(path), path.string());
}

}  // namespace xsilo::server

namespace xsilo::server {

namespace {

// "central DP" or "distributed DP": the silo-level mode a record's privacy part states.
std::string silo_level_words(const nlohmann::json& r) {
  const auto p = r.find("privacy");
  const bool distributed = p != r.end() && p->is_object() && p->value("mechanism", "") == "skellam";
  return distributed ? "distributed DP" : "central DP";
}

// A silo-level DP record's claim against the rounds charged so far (`spent`, which includes its
// own round where that spent): success when it holds.
Status check_silo_level_claim(const nlohmann::json& r, const privacy::Ledger& spent) {
  const auto& p = r["privacy"];
  const double delta = p.at("delta").get<double>();  // at(): a missing key throws, into the caller's catch
  const double claimed = p.at("epsilon").get<double>();
  const double eps = epsilon_of(spent, delta);
  const std::uint64_t rounds = spent.count();
  if (claimed < eps * (1 - 1e-9) - 1e-12) {
    return Error(fmt::format("{} claims epsilon {:.6g}, but the parameters of the {} noised rounds charged so far "
                             "(committed, or aborted after their unmasking began) give {:.6g}",
                             silo_level_words(r), claimed, rounds, eps));
  }
  if (p.contains("max_epsilon") && p["max_epsilon"].is_number() && eps > p["max_epsilon"].get<double>() * (1 + 1e-9)) {
    return Error(fmt::format("{}: the recorded rounds give epsilon {:.6g}, past the budget {:.6g}", silo_level_words(r),
                             eps, p["max_epsilon"].get<double>()));
  }
  return {};
}

// A record that names a setup the silos were sent is charged at it only as a Skellam mechanism
// whose parameters are that setup: a bare {"setup_sha256"} (charged nothing, claiming nothing) or
// "central" parameters beside it would pass `--sent` while the accounting charged other, cheaper
// parameters than the setup the silos' noise was drawn under. Throws SetupMismatch when its
// parameters are not that setup (and what recorded_skellam_mechanism throws).
Status check_named_setup(const nlohmann::json& r, const std::string& event, const std::string& where) {
  if (const auto p = r.find("privacy");
      (event == "round" || event == kUnmaskBegun) && p != r.end() && p->is_object() && p->contains("setup_sha256")) {
    const std::string mechanism = p->value("mechanism", "");
    if (mechanism != "skellam") {
      return Error(where + "its privacy part names setup_sha256 " + p->at("setup_sha256").dump() + " but " +
                   (mechanism.empty() ? std::string("no mechanism") : "mechanism \"" + mechanism + "\"") +
                   ": a record naming a distributed-DP setup must state it as a skellam mechanism whose "
                   "parameters are that setup");
    }
    recorded_skellam_mechanism(r);  // throws SetupMismatch when its parameters are not that setup
  }
  return {};
}

// The packed width a record states (secure.wire_bits), by the rule silos and edges take a signed
// setup's by (protocol::check_wire_bits): a width the record's ring, protocol and distributed DP
// allow, and no other. The width is not in the signed Skellam part the record names, so this
// checks that the claim is consistent, not that the round's words were packed.
Status check_recorded_wire(const nlohmann::json& r, const std::string& where) {
  const auto s = r.find("secure");
  if (s == r.end() || !s->is_object() || !s->contains("wire_bits")) return {};
  const auto& bits = s->at("wire_bits");
  if (!bits.is_number_integer() || bits.get<std::int64_t>() < 0 || bits.get<std::int64_t>() > 64) {
    return Error(where + "its secure.wire_bits " + bits.dump() + " is not a width of bits");
  }
  const auto ring = s->find("modulus_bits");
  if (ring == s->end() || !ring->is_number_integer() || ring->get<std::int64_t>() < 0 || ring->get<std::int64_t>() > 64) {
    return Error(where + "its secure.wire_bits comes without a secure.modulus_bits of at most 64");
  }
  wire::SecAggSetup setup;
  setup.set_wire_bits(bits.get<std::uint32_t>());
  setup.set_modulus_bits(ring->get<std::uint32_t>());
  setup.set_protocol(s->value("protocol", "") == "lightsecagg" ? wire::LIGHTSECAGG : wire::SECAGG);
  if (const auto p = r.find("privacy"); p != r.end() && p->is_object() && p->value("mechanism", "") == "skellam") {
    // Their types are checked with the mechanism (recorded_skellam_mechanism), before this.
    setup.mutable_skellam()->set_bits(p->value("bits", 0u));
    setup.mutable_skellam()->set_count_scale(p->value("count_scale", std::uint64_t{0}));
  }
  if (const auto st = protocol::check_wire_bits(setup); !st) {
    return Error(where + "its secure.wire_bits: " + st.error().message());
  }
  return {};
}

// The example-level spends of round record r (record i, from 0): each participant's spend is added
// to its silo's account in `rounds` and to a, and its claimed epsilon checked against the account.
Status check_participant_spends(const nlohmann::json& r, std::size_t i,
                                std::map<std::string, protocol::DpSgdAccount>& rounds, PrivacyAudit& a) {
  for (const auto& p : r["participants"]) {
    if (!p.contains("privacy")) continue;
    const std::string silo = p.value("silo", "?");
    const std::string at = "record " + std::to_string(i + 1) + " (round " + std::to_string(r.value("round", 0)) +
                           "), silo " + silo + ": ";
    wire::PrivacySpend s;
    try {
      s = protocol::privacy_from_json(p["privacy"]);
    } catch (const std::exception& e) {
      return Error(at + "its privacy spend cannot be read (" + e.what() + ")");
    }
    auto& mine = rounds[silo];
    mine.add(s);
    ++a.spends;
    const double eps = mine.epsilon(s.delta());
    a.epsilon[silo] = eps;
    // The same accountant on the same parameters: only rounding separates an honest claim.
    if (s.epsilon() < eps * (1 - 1e-9) - 1e-12) {
      return Error(at + fmt::format("claims epsilon {:.6g}, but the parameters of its {} recorded rounds give {:.6g}",
                                    s.epsilon(), mine.rounds(), eps));
    }
    if (s.max_epsilon() > 0 && eps > s.max_epsilon() * (1 + 1e-9)) {
      return Error(at + fmt::format("its recorded rounds give epsilon {:.6g}, past its own budget {:.6g}", eps,
                                    s.max_epsilon()));
    }
  }
  return {};
}

}  // namespace

Result<PrivacyAudit> check_privacy_claims(const std::vector<nlohmann::json>& records) {
  PrivacyAudit a;
  std::map<std::string, protocol::DpSgdAccount> rounds;
  privacy::Ledger central;
  UnmaskingWatch unmasking;  // distributed DP: a round whose unmasking began spent
  double delta = 0;          // the last silo-level record's
  // Rounds with a record since the last federation_start or operator_resume: an honest server
  // runs a round number again only after a restart, which writes federation_start first.
  std::set<std::uint64_t> recorded;
  auto charge = [&](const privacy::Mechanism& m, std::uint64_t& kind) {
    central.add(m, 1);
    ++kind;
    a.silo_epsilon = epsilon_of(central, delta);
  };
  auto mode_seen = [&](const std::string& mode) {
    if (a.silo_mode.empty() || a.silo_mode == mode) {
      a.silo_mode = mode;
    } else {
      a.silo_mode = "central and distributed";
    }
  };
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    const std::string where = "record " + std::to_string(i + 1) + " (round " + std::to_string(r.value("round", 0)) + "): ";
    if (const std::string event = r.value("event", ""); event == "federation_start" || event == "operator_resume") {
      recorded.clear();
    } else if (event == "round" && !recorded.insert(r.value("round", std::uint64_t{0})).second) {
      return Error(where + "a second record of this round with no federation_start or operator_resume between: "
                           "which of them decides the round's charge is not determined");
    }
    try {
      const std::string event = r.value("event", "");
      const bool stated = (event == "round" || event == kUnmaskBegun) && r.contains("privacy") &&
                          r["privacy"].is_object() &&
                          (r["privacy"].value("mechanism", "") == "central" ||
                           r["privacy"].value("mechanism", "") == "skellam");
      if (stated) {
        delta = r["privacy"].at("delta").get<double>();
        mode_seen(r["privacy"].value("mechanism", "") == "skellam" ? "distributed" : "central");
      }
      // A record that names a setup the silos were sent: charged at it only as that Skellam mechanism.
      if (const auto st = check_named_setup(r, event, where); !st) return Error(st.error().message());
      if (const auto st = check_recorded_wire(r, where); !st) return Error(st.error().message());
      // An interrupted unmasking, or this aborted round's own (its unmasking began: it spent).
      if (const auto c = unmasking.take(r)) charge(c->mechanism, c->interrupted ? a.silo_interrupted : a.silo_aborted);
      if (const auto m = silo_level_mechanism_of(r)) {
        charge(*m, r.value("status", "") == "committed" ? a.silo_committed : a.silo_aborted);
      }
      // Every round's record states the spend so far, an aborted round's too (it spends nothing);
      // an unmask_begun record states the spend were its round charged.
      if (stated && event == kUnmaskBegun) {
        auto if_charged = central;
        if_charged.add(*unmasking.open(), 1);
        if (const auto st = check_silo_level_claim(r, if_charged); !st) return Error(where + st.error().message());
      } else if (stated) {
        if (const auto st = check_silo_level_claim(r, central); !st) return Error(where + st.error().message());
      }
    } catch (const SetupMismatch& e) {
      return Error(where + "its distributed DP parameters do not match the signed setup the silos were sent: " +
                   e.what());
    } catch (const std::exception& e) {
      return Error(where + "its " + silo_level_words(r) + " spend cannot be read (" + e.what() + ")");
    }
    if (r.value("event", "") != "round" || !r.contains("participants")) continue;
    if (const auto st = check_participant_spends(r, i, rounds, a); !st) return Error(st.error().message());
  }
  if (const auto m = unmasking.open()) charge(*m, a.silo_interrupted);  // the log ends while a round unmasks: it spent
  return a;
}

}  // namespace xsilo::server
