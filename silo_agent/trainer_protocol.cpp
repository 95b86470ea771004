#include "silo_agent/trainer_protocol.h"

#include <arpa/inet.h>

#include <cmath>
#include <cstring>
#include <initializer_list>

namespace xsilo::agent::trainer_protocol {

using json = nlohmann::json;

namespace {

double number_or(const json& m, std::initializer_list<const char*> keys, double def) {
  if (!m.is_object()) return def;
  for (const char* k : keys) {
    if (m.contains(k) && m[k].is_number() && std::isfinite(m[k].get<double>())) return m[k].get<double>();
  }
  return def;
}

std::string string_or(const json& m, const char* key, const std::string& def) {
  return m.is_object() && m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : def;
}

}  // namespace

std::string frame(const json& message) {
  const std::string body = message.dump();
  const std::uint32_t n = htonl(static_cast<std::uint32_t>(body.size()));
  std::string out(reinterpret_cast<const char*>(&n), 4);
  return out + body;
}

std::optional<json> Reader::next(std::string& error) {
  if (!failed_.empty()) {
    error = failed_;
    return std::nullopt;
  }
  if (in_.size() < 4) return std::nullopt;
  std::uint32_t n = 0;
  std::memcpy(&n, in_.data(), 4);
  n = ntohl(n);
  if (n > kMaxMessage) {
    failed_ = error = "sent a message of " + std::to_string(n) + " bytes; the limit is 1 MiB";
    return std::nullopt;
  }
  if (in_.size() < 4 + std::size_t{n}) return std::nullopt;
  const std::string body = in_.substr(4, n);
  in_.erase(0, 4 + std::size_t{n});
  // Parsing does not recurse, but printing and destroying a value do: a message nested a
  // million deep would overflow the stack the first time it is printed in an error.
  bool too_deep = false;
  json j;
  try {
    j = json::parse(body, [&](int depth, json::parse_event_t, json&) {
      too_deep = too_deep || depth > kMaxDepth;
      return !too_deep;
    });
  } catch (const json::exception& e) {
    failed_ = error = std::string("sent a message that is not JSON: ") + e.what();
    return std::nullopt;
  }
  if (too_deep) failed_ = error = "sent a message nested deeper than " + std::to_string(kMaxDepth) + " levels";
  else if (!j.is_object()) failed_ = error = "sent a message that is not a JSON object";
  if (!failed_.empty()) return std::nullopt;
  return j;
}

Status check_hello(const json& hello, std::int64_t& protocol) {
  protocol = hello.contains("protocol") && hello["protocol"].is_number_integer() ? hello["protocol"].get<std::int64_t>() : 0;
  if (string_or(hello, "type", "") != "hello") return Error("sent " + hello.dump().substr(0, 200) + " before hello");
  if (protocol != kVersion) {
    return Error("the trainer speaks protocol " + std::to_string(protocol) + " (SDK " + string_or(hello, "sdk", "?") +
                 "), this agent speaks protocol " + std::to_string(kVersion) + "; use the SDK of this xsilo release");
  }
  return {};
}

Status check_result(const json& answer, std::uint64_t id) {
  const std::string type = string_or(answer, "type", "");
  if (type == "error") return Error("reports: " + string_or(answer, "message", "(no message)"));
  if (type != "result" || !answer.contains("id") || !answer["id"].is_number_unsigned() ||
      answer["id"].get<std::uint64_t>() != id) {
    return Error("answered task " + std::to_string(id) + " with " + answer.dump().substr(0, 200));
  }
  return {};
}

Status parse_train_answer(const json& result, const std::filesystem::path& exchange, TrainAnswer& out) {
  if (!result.contains("weights") || !result["weights"].is_string()) {
    return Error("rank 0's train result names no weights file");
  }
  out.weights = result["weights"].get<std::string>();
  if (out.weights.parent_path() != exchange || out.weights.filename().string().rfind(".", 0) == 0) {
    return Error("the weights file " + out.weights.string() + " is not a file of the exchange folder " +
                 exchange.string());
  }
  const bool counted = result.contains("num_samples") && result["num_samples"].is_number_integer() &&
                       (result["num_samples"].is_number_unsigned() || result["num_samples"].get<std::int64_t>() >= 0);
  out.num_samples = counted ? result["num_samples"].get<std::uint64_t>() : 0;
  out.metrics = result.contains("metrics") && result["metrics"].is_object() ? result["metrics"] : json::object();
  out.loss = number_or(out.metrics, {"loss", "train_loss"}, 0);
  if (result.contains("privacy") && !result["privacy"].is_null()) {
    const json& p = result["privacy"];
    auto number = [&](const char* key) {
      return p.is_object() && p.contains(key) && p[key].is_number() ? p[key].get<double>() : std::nan("");
    };
    DpSgdReport dp{.sample_rate = number("sample_rate"),
                   .noise_multiplier = number("noise_multiplier"),
                   .steps = 0,
                   .clip_norm = p.is_object() ? number("clip_norm") : 0};
    if (std::isnan(dp.clip_norm)) dp.clip_norm = 0;  // optional: the accountant does not need it
    const bool steps_ok = p.is_object() && p.contains("steps") && p["steps"].is_number_integer() &&
                          (p["steps"].is_number_unsigned() || p["steps"].get<std::int64_t>() >= 1);
    if (!p.is_object() || !(dp.sample_rate > 0 && dp.sample_rate <= 1) || !(dp.noise_multiplier > 0) ||
        !std::isfinite(dp.noise_multiplier) || !steps_ok || p["steps"].get<std::uint64_t>() == 0) {
      return Error("the train result's privacy must be {\"sample_rate\": in (0, 1], \"noise_multiplier\": > 0, "
                   "\"steps\": >= 1, \"clip_norm\": optional}");
    }
    dp.steps = p["steps"].get<std::uint64_t>();
    out.dp = dp;
  }
  return {};
}

wire::TrainMetrics parse_eval_metrics(const json& result) {
  wire::TrainMetrics m;
  const json metrics = result.contains("metrics") ? result["metrics"] : json::object();
  m.set_eval_loss(number_or(metrics, {"eval_loss", "loss"}, 0));
  m.set_eval_accuracy(number_or(metrics, {"eval_accuracy", "accuracy"}, 0));
  const double samples = number_or(metrics, {"eval_samples", "num_samples"}, 0);
  m.set_eval_samples(samples > 0 && samples < 1e15 ? static_cast<std::uint64_t>(samples) : 0);
  return m;
}

}  // namespace xsilo::agent::trainer_protocol
