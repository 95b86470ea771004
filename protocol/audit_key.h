// What a silo checks of the server's audit log without holding it: that each head it keeps as a
// witness is signed by the server's audit key, and that the key is the one it witnessed first or
// reached from it by rotations the old keys signed (docs/audit.md, "Witnesses"). The server signs
// heads and rotations with these statements; the silo and `xsilo audit verify` check them.
#pragma once

#include <cstdint>
#include <string>

#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The bytes the audit key signs for a head: record `seq` of the log hashes to `sha256`.
std::string audit_head_statement(std::uint64_t seq, const std::string& sha256);
// The bytes an old audit key signs to hand over to the next one (raw 32-byte keys).
std::string key_rotation_statement(const std::string& old_key, const std::string& next_key);

// Whether `head` is signed by `public_key` (raw).
bool head_signed_by(const wire::AuditHead& head, const std::string& public_key);

// The key `now` names, when it can be reached from `pinned` (raw; empty: nothing pinned yet,
// any key is the first) by its rotations; otherwise "" and `why` says what is wrong.
std::string reach_audit_key(const std::string& pinned, const wire::AuditKey& now, std::string& why);

}  // namespace xsilo::protocol
