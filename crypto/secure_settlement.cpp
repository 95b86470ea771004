// The steps SecAgg, SecAgg+ and LightSecAgg share between the shares and the unmask request
// (crypto/secagg.h, "what SecAgg, SecAgg+ and LightSecAgg do alike").
#include <algorithm>

#include "crypto/lightsecagg.h"
#include "crypto/secagg.h"
#include "crypto/secure_detail.h"

namespace xsilo::crypto::secagg {

using detail::sorted;

Settlement::Settlement(SettlementRules rules, CertVerifier ca, CertSigner signer)
    : rules_(std::move(rules)), ca_(std::move(ca)), signer_(std::move(signer)) {}

Status Settlement::check_survivors(const std::set<std::string>&) const { return {}; }

void Settlement::blame(const std::string& silo, const std::string& why) {
  if (!excluded_.insert(silo).second) return;
  blamed_.push_back({silo, why});
}

Status Settlement::on_receipt(const std::string& from, const Receipt& r) {
  if (step_ != Step::Receipts) return Error("a receipt arrived out of order");
  if (!u2_.count(from)) return Error(from + rules_.receipt_before_sharing);
  if (receipted_.count(from)) return Error(from + " sent two receipts");
  if (auto verdict = ca_.verify(certificate_of(from), from, kSiloRole, receipt_statement(rules_.session, from, r),
                                r.signature);
      !verdict) {
    return Error("the receipt said to be from " + from + " is not signed by it (" + verdict.error().message() + ")");
  }
  receipted_.insert(from);
  for (const auto& a : r.accusations) judge(from, a);
  return {};
}

Result<Settled> Settlement::settle() {
  if (step_ != Step::Receipts) return Error("the group is already settled");
  for (const auto& m : receipted_) {
    if (!excluded_.count(m)) settled_.insert(m);
  }
  step_ = Step::Masked;
  if (settled_.size() < rules_.min_survivors) {
    return Error("only " + std::to_string(settled_.size()) + " members remain after the receipts; a sum needs " +
                 std::to_string(rules_.min_survivors));
  }
  Settled s;
  s.members.assign(settled_.begin(), settled_.end());
  s.signature = signer_.sign(settled_statement(rules_.session, s.members));
  return s;
}

Status Settlement::on_masked_input(const std::string& from) {
  if (step_ != Step::Masked) return Error("masked input arrived out of order");
  if (!settled_.count(from)) return Error(from + " is not a settled member of its group");
  if (!u3_.insert(from).second) return Error(from + " sent two masked inputs");
  return {};
}

Result<std::vector<std::string>> Settlement::close_masked() {
  if (step_ != Step::Masked) return Error("survivors already named");
  step_ = Step::Confirm;
  if (u3_.size() < rules_.min_survivors) {
    return Error("only " + std::to_string(u3_.size()) + " masked inputs arrived; a sum needs " +
                 std::to_string(rules_.min_survivors));
  }
  if (auto why = check_survivors(u3_); !why) return why.error();
  std::vector<std::string> u3(u3_.begin(), u3_.end());
  u3_signature_ = signer_.sign(survivors_statement(rules_.session, u3));
  return u3;
}

Status Settlement::on_confirmation(const std::string& from, const std::string& signature) {
  if (step_ != Step::Confirm) return Error("a confirmation arrived out of order");
  if (!u3_.count(from)) return Error(from + " is not a survivor");
  const std::vector<std::string> u3(u3_.begin(), u3_.end());
  if (auto verdict =
          ca_.verify(certificate_of(from), from, kSiloRole, survivors_statement(rules_.session, u3), signature);
      !verdict) {
    return Error(from + "'s confirmation does not verify (" + verdict.error().message() + ")");
  }
  confirmations_[from] = signature;
  confirmed_.insert(from);
  return {};
}

Result<UnmaskRequest> Settlement::close_confirmations() {
  if (step_ != Step::Confirm) return Error("unmasking already requested");
  step_ = Step::Unmask;
  if (confirmations_.size() < rules_.confirmations) {
    return Error("only " + std::to_string(confirmations_.size()) + " survivors confirmed the survivor set; " +
                 std::to_string(rules_.confirmations) + " must");
  }
  UnmaskRequest r;
  for (const auto& v : settled_) (u3_.count(v) ? r.survivors : r.dropped).push_back(v);
  r.signatures = confirmations_;
  request_ = r;
  return r;
}

Result<std::vector<std::string>> MemberChecks::settled(const Settled& s) const {
  if (auto verdict =
          ca.verify(server_certificate, server_name, "server", settled_statement(session, s.members), s.signature);
      !verdict) {
    return Error("the settled member list is not signed by the server (" + verdict.error().message() + ")");
  }
  auto members = sorted(s.members);
  if (!std::binary_search(members.begin(), members.end(), me)) return Error("this silo was excluded from its group");
  if (members.size() < min_survivors) {
    return Error("only " + std::to_string(members.size()) + " members remain; a sum needs " +
                 std::to_string(min_survivors));
  }
  return members;
}

Status MemberChecks::survivors(const std::vector<std::string>& u3, const std::string& server_signature,
                               bool signature_required) const {
  if (!server_signature.empty() || signature_required) {
    if (auto verdict =
            ca.verify(server_certificate, server_name, "server", survivors_statement(session, u3), server_signature);
        !verdict) {
      return Error("the survivor set is not signed by the server (" + verdict.error().message() + ")");
    }
  }
  if (!std::binary_search(u3.begin(), u3.end(), me)) return Error("this silo is not among the survivors");
  if (u3.size() < min_survivors) {
    return Error("only " + std::to_string(u3.size()) + " survivors; a sum needs " + std::to_string(min_survivors));
  }
  return {};
}

// ---- rounds 0 and 1 at the server ----------------------------------------------------------

template <class KeyList>
Dealing<KeyList>::Dealing(SettlementRules rules, DealingWords words, std::vector<std::string> members,
                          CertVerifier ca, CertSigner signer)
    : Settlement(std::move(rules), std::move(ca), std::move(signer)), words_(std::move(words)),
      members_(std::move(members)) {
  for (std::size_t i = 0; i < members_.size(); ++i) index_[members_[i]] = static_cast<std::uint32_t>(i + 1);
}

template <class KeyList>
bool Dealing<KeyList>::near(const std::string& a, const std::string& b) const {
  return a != b && index_.count(a) && index_.count(b);
}

template <class KeyList>
std::vector<std::string> Dealing<KeyList>::neighbours(const std::string& silo) const {
  std::vector<std::string> out;
  if (!index_.count(silo)) return out;
  for (const auto& m : members_) {
    if (m != silo) out.push_back(m);
  }
  return out;
}

template <class KeyList>
Status Dealing<KeyList>::check_box(const std::string&, const std::string&, const SealedShares&) const {
  return {};
}

template <class KeyList>
Status Dealing<KeyList>::on_keys(const std::string& from, const Advertisement& a) {
  if (step_ != Step::Keys) return Error("keys arrived after the key list was sent");
  if (!index_.count(from)) return Error(from + " is not in this secure group");
  if (keys_.count(from)) return Error(from + " advertised keys twice");
  if (auto verdict = ca_.verify(a.certificate, from, kSiloRole, keys_statement(rules_.session, from, a), a.signature);
      !verdict) {
    return Error("the keys said to be from " + from + " are not signed by it (" + verdict.error().message() + ")");
  }
  // Signed by the silo: whatever is wrong with them now is its own doing.
  std::size_t others = 0;
  bool usable = usable_keys(a);
  for (const auto& m : neighbours(from)) {
    auto it = a.inbox_keys.find(m);
    if (it == a.inbox_keys.end() || !usable_public_key(it->second)) usable = false;
    ++others;
  }
  if (!usable || a.inbox_keys.size() != others) {
    blame(from, "advertised unusable keys (signed by it)");
    return Error(from + " advertised unusable keys");
  }
  keys_[from] = a;
  return {};
}

template <class KeyList>
Result<KeyList> Dealing<KeyList>::close_keys() {
  if (step_ != Step::Keys) return Error("key list already sent");
  if (keys_.size() < rules_.min_survivors) {
    return Error("only " + std::to_string(keys_.size()) + " of " + std::to_string(members_.size()) +
                 " silos advertised keys; a sum needs " + std::to_string(rules_.min_survivors));
  }
  for (const auto& [name, k] : keys_) u1_.insert(name);
  step_ = Step::Shares;
  return keys_;
}

template <class KeyList>
Status Dealing<KeyList>::on_shares(const std::string& from, const Outbox& to) {
  if (step_ != Step::Shares) return Error("shares arrived out of order");
  if (!u1_.count(from)) return Error(from + words_.shares_without_keys);
  if (shares_.count(from)) return Error(from + words_.shared_twice);
  for (const auto& [recipient, c] : to) {
    if (!u1_.count(recipient) || !near(from, recipient)) return Error(from + words_.addressed + recipient);
    if (auto fits = check_box(from, recipient, c); !fits) return fits;
  }
  std::size_t expected = 0;
  for (const auto& v : neighbours(from)) expected += u1_.count(v);
  if (to.size() != expected) return Error(from + words_.not_every);
  shares_[from] = to;
  return {};
}

template <class KeyList>
Result<std::map<std::string, Inbox>> Dealing<KeyList>::close_shares() {
  if (step_ != Step::Shares) return Error("shares already delivered");
  if (shares_.size() < rules_.min_survivors) {
    return Error("only " + std::to_string(shares_.size()) + words_.few_shared + std::to_string(rules_.min_survivors));
  }
  for (const auto& [sender, to] : shares_) u2_.insert(sender);
  std::map<std::string, Inbox> out;
  for (const auto& recipient : u2_) {
    auto& box = out[recipient];
    for (const auto& sender : neighbours(recipient)) {
      if (u2_.count(sender)) box[sender] = shares_.at(sender).at(recipient);
    }
  }
  shares_.clear();  // delivered: the server keeps no copy of the boxes
  step_ = Step::Receipts;
  return out;
}

template class Dealing<KeyList>;
template class Dealing<lightsecagg::KeyList>;

}  // namespace xsilo::crypto::secagg
