// What a silo tells the server when its trainer could not produce an update: a reason code
// (wire::FailureReason) and that code's fixed text, nothing else. The trainer's own output (its
// traceback, its prints, local paths) stays in the silo's log: a script that prints a patient
// row in an exception must not put it into the server's log or the signed audit log
// (docs/security.md, "What leaves a silo").
#pragma once

#include <string_view>

#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The fixed text of a reason ("the trainer hung and was stopped"); the same on every side, so
// the server never needs the silo's words. Unknown codes (a newer silo) read as unspecified.
std::string_view failure_text(wire::FailureReason reason);
// The code's name as the audit log and metrics write it ("trainer_hung").
std::string_view failure_name(wire::FailureReason reason);

}  // namespace xsilo::protocol
