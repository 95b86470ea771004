#include "protocol/audit_key.h"

#include "crypto/certs.h"
#include "crypto/hash.h"
#include "crypto/sign.h"

namespace xsilo::protocol {

namespace {
std::string hex16(const std::string& raw) {
  return crypto::to_hex(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(raw.data()), raw.size()))
      .substr(0, 16);
}
}  // namespace

std::string audit_head_statement(std::uint64_t seq, const std::string& sha256) {
  return crypto::statement("audit-head", {std::to_string(seq), sha256});
}

std::string key_rotation_statement(const std::string& old_key, const std::string& next_key) {
  return crypto::statement("audit-key-rotation", {old_key, next_key});
}

bool head_signed_by(const wire::AuditHead& head, const std::string& public_key) {
  std::string sig;
  try {
    sig = crypto::from_hex(head.signature());
  } catch (const std::exception&) {
    return false;
  }
  return public_key.size() == 32 && crypto::verify_signature(public_key, audit_head_statement(head.seq(), head.sha256()), sig);
}

std::string reach_audit_key(const std::string& pinned, const wire::AuditKey& now, std::string& why) {
  const std::string& target = now.public_key();
  if (target.size() != 32) {
    why = "the server named no usable audit key";
    return "";
  }
  if (pinned.empty() || pinned == target) return target;
  std::string at = pinned;
  for (const auto& r : now.rotations()) {
    if (r.old_key() != at) continue;  // rotations before the one this silo witnessed
    if (!crypto::verify_signature(at, key_rotation_statement(r.old_key(), r.next_key()), r.signature())) {
      why = "the rotation from audit key " + hex16(at) + " is not signed by that key";
      return "";
    }
    at = r.next_key();
  }
  if (at != target) {
    why = "the server's audit key is " + hex16(target) + ", but this silo witnessed heads signed by " + hex16(pinned) +
          " and no rotation signed by that key leads to the new one: this is not the history this silo witnessed "
          "(a state folder started again, or another server). If the federation was started again on purpose, move "
          "state_dir/audit_heads.jsonl aside";
    return "";
  }
  return target;
}

}  // namespace xsilo::protocol
