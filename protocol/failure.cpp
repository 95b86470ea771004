#include "protocol/failure.h"

namespace xsilo::protocol {

namespace {

struct Entry {
  wire::FailureReason reason;
  std::string_view name, text;
};

// One row per code of wire::FailureReason: its name and the sentence the server logs and audits.
constexpr Entry kReasons[] = {
    {wire::FAILURE_UNSPECIFIED, "unspecified", "the silo gave no reason"},
    {wire::TRAINER_DID_NOT_START, "trainer_did_not_start", "the trainer did not start in time"},
    {wire::TRAINER_EXITED, "trainer_exited", "the trainer exited"},
    {wire::TRAINER_HUNG, "trainer_hung", "the trainer hung and was stopped"},
    {wire::TRAINER_REPORTED_ERROR, "trainer_reported_error", "the trainer reported an error"},
    {wire::TRAINER_BAD_WEIGHTS, "trainer_bad_weights", "the trainer's weights do not match the model"},
    {wire::TRAINER_NON_FINITE, "trainer_non_finite", "the trainer returned NaN or infinite values"},
    {wire::TRAINER_PROTOCOL_ERROR, "trainer_protocol_error", "the trainer broke the trainer protocol"},
    {wire::TRAINER_NO_SAMPLES, "trainer_no_samples", "the trainer reported no samples"},
    {wire::TRAINER_MISCONFIGURED, "trainer_misconfigured", "the silo's trainer setup cannot work"},
    {wire::MODEL_MISMATCH, "model_mismatch", "the model received did not match the round's hash"},
    {wire::LOCAL_DATA_MISMATCH, "local_data_mismatch", "the silo's data does not fit the model"},
    {wire::UPDATE_NOT_ENCODABLE, "update_not_encodable", "the update could not be encoded"},
    {wire::AGENT_STOPPING, "agent_stopping", "the agent is stopping"},
    {wire::AGENT_INTERNAL, "agent_internal", "the agent failed inside"},
    {wire::PRIVACY_BUDGET_SPENT, "privacy_budget_spent", "another round would exceed the silo's privacy budget"},
};

const Entry& entry(wire::FailureReason reason) {
  for (const auto& e : kReasons) {
    if (e.reason == reason) return e;
  }
  return kReasons[0];
}

}  // namespace

std::string_view failure_text(wire::FailureReason reason) { return entry(reason).text; }
std::string_view failure_name(wire::FailureReason reason) { return entry(reason).name; }

}  // namespace xsilo::protocol
