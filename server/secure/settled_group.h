// What the server's side of a group does alike for every protocol built on
// crypto::secagg::Settlement (SecAgg, SecAgg+, LightSecAgg): the Setup stage's steps closed in
// order (keys, shares, receipts), the shares delivered, the settled list sent with who may
// upload, the survivors asked to confirm U3 and then to unmask, the blames reported once. A
// protocol's group derives from it and says how its steps look on the wire, how its keys go
// out and how its sum is unmasked (server/secure/secagg_group.cpp, lightsecagg_group.cpp).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "crypto/secagg.h"
#include "server/secure/group.h"

namespace xsilo::server::secure {

class SettledGroup : public Group {
 public:
  void masked_from(const std::string& silo) override;
  std::vector<std::string> survivors() const override;
  std::vector<crypto::secagg::Blame> excluded() const override;

 protected:
  using Group::Group;

  // The steps of the Setup stage.
  enum class Phase { Keys, Shares, Receipts };

  // The protocol's server, as a Settlement.
  virtual crypto::secagg::Settlement& settlement() = 0;
  virtual const crypto::secagg::Settlement& settlement() const = 0;
  // The protocol's end of the Keys phase: U1 sent (and phase_ moved on), or fail().
  virtual void close_keys() = 0;
  // The end of the Shares phase: the protocol's server closes it (delivered() with the result).
  virtual void close_shares() = 0;
  // The protocol's wire messages for the steps written here.
  virtual void put_delivery(wire::SecureAggregation& m, const crypto::secagg::Inbox& inbox) const = 0;
  virtual void put_settled(wire::SecureAggregation& m, const crypto::secagg::Settled& settled) const = 0;
  virtual void put_survivors(wire::SecureAggregation& m, const std::vector<std::string>& u3,
                             const std::string& server_signature) const = 0;
  virtual void put_unmask_request(wire::SecureAggregation& m, const crypto::secagg::UnmaskRequest& r) const = 0;

  bool close() override;
  void ask_survivors() override;
  bool admitted(const std::string& silo) const override { return settlement().settled_member(silo); }
  std::vector<crypto::secagg::Blame> new_blames() override;

  // Sends `request` to `whom`, waits for their answers, and moves to `next`.
  template <class Names>
  void ask(const Names& whom, const wire::SecureAggregation& request, Stage next) {
    request_ = request;
    waiting_.clear();
    for (const auto& v : whom) {
      waiting_.insert(v);
      send(v, request);
    }
    stage_ = next;
  }
  // The Shares phase closed with `boxes` (per member of U2: what was dealt it), or fail().
  void delivered(const crypto::secagg::Result<std::map<std::string, crypto::secagg::Inbox>>& boxes);
  void close_receipts();
  void close_confirmations();

  Phase phase_ = Phase::Keys;

 private:
  std::size_t blames_reported_ = 0;
};

}  // namespace xsilo::server::secure
