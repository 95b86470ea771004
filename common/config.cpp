#include "common/config.h"

#include <algorithm>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "common/fs.h"

namespace xsilo {

namespace {
std::string type_name(const nlohmann::json& v) { return v.type_name(); }
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Of `candidates`, the one nearest to `key` within two typos (the first of equals), else null.
template <class Keys>
const std::string* nearest_key(const std::string& key, const Keys& candidates) {
  const std::string* nearest = nullptr;
  std::size_t best = 3;
  for (const std::string& k : candidates) {
    if (const auto d = edit_distance(key, k); d < best) {
      best = d;
      nearest = &k;
    }
  }
  return nearest;
}
}  // namespace

ConfigNode::ConfigNode(const nlohmann::json& j, std::string file, std::string path)
    : j_(&j), file_(std::move(file)), path_(std::move(path)),
      used_(std::make_shared<std::set<std::string>>()) {
  if (!j.is_object()) {
    throw ConfigError("config " + file_ + ": " + (path_.empty() ? "." : path_) +
                      ": must be an object, got " + type_name(j));
  }
}

nlohmann::json ConfigNode::load_file(const std::filesystem::path& file) {
  if (std::filesystem::is_directory(file)) throw ConfigError("config " + file.string() + ": is a folder, not a file");
  std::ifstream in(file);
  if (!in) throw ConfigError("config " + file.string() + ": cannot open the file");
  // A key given twice in one object is refused: JSON parsers disagree on which one wins (ours
  // keeps the last), so the config a reader sees might not be the one that runs.
  struct Frame {
    bool array;
    std::string name;  // ".key", or "[]" for an element of a list
    std::set<std::string> keys;
  };
  std::vector<Frame> open;
  std::string pending;  // the key whose value comes next
  const nlohmann::json::parser_callback_t no_duplicates = [&](int, nlohmann::json::parse_event_t event,
                                                               nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      const bool in_array = !open.empty() && open.back().array;
      open.push_back({event == E::array_start, open.empty() ? "" : in_array ? "[]" : "." + pending, {}});
    } else if (event == E::object_end || event == E::array_end) {
      open.pop_back();
    } else if (event == E::key) {
      pending = parsed.get<std::string>();
      if (!open.empty() && !open.back().keys.insert(pending).second) {
        std::string where;
        for (const auto& f : open) where += f.name;
        throw ConfigError("config " + file.string() + ": " + where + "." + pending +
                          ": given twice in one object (only one may stay)");
      }
    }
    return true;
  };
  try {
    return nlohmann::json::parse(in, no_duplicates);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    throw ConfigError("config " + file.string() + ": not valid JSON (byte " +
                      std::to_string(e.byte) + "): " + what.substr(what.find(':') + 2));
  } catch (const nlohmann::json::exception& e) {  // a number too large for any type (found by fuzzing)
    std::string what = e.what();
    throw ConfigError("config " + file.string() + ": " + what.substr(what.find(']') + 2));
  }
}

std::string ConfigNode::key_path(const std::string& key) const { return path_ + "." + key; }

void ConfigNode::fail(const std::string& key, const std::string& reason) const {
  std::string why = reason;
  // A required key that is missing while a key within two typos of it is there ("comand"):
  // that key is named, as an unknown key is told "did you mean".
  if (reason.rfind("is required", 0) == 0 && !key.empty() && !j_->contains(key)) {
    std::vector<std::string> unread;
    for (auto it = j_->begin(); it != j_->end(); ++it) {
      if (!used_->count(it.key())) unread.push_back(it.key());
    }
    if (const auto* typo = nearest_key(key, unread)) {
      why += " (the config has \"" + *typo + "\": a misspelling of " + key + "?)";
    }
  }
  throw ConfigError("config " + file_ + ": " + (key.empty() ? path_ : key_path(key)) + ": " + why);
}

bool ConfigNode::has(const std::string& key) const { return j_->contains(key); }

const nlohmann::json& ConfigNode::raw(const std::string& key) const {
  used_->insert(key);
  static const nlohmann::json kNull;
  auto it = j_->find(key);
  return it == j_->end() ? kNull : *it;
}

ConfigNode ConfigNode::child(const std::string& key) const {
  used_->insert(key);
  auto it = j_->find(key);
  if (it == j_->end()) {
    static const nlohmann::json kEmpty = nlohmann::json::object();
    return ConfigNode(kEmpty, file_, key_path(key));
  }
  if (!it->is_object()) fail(key, "must be an object, got " + type_name(*it));
  return ConfigNode(*it, file_, key_path(key));
}

std::vector<ConfigNode> ConfigNode::child_list(const std::string& key) const {
  used_->insert(key);
  std::vector<ConfigNode> out;
  auto it = j_->find(key);
  if (it == j_->end()) return out;
  if (!it->is_array()) fail(key, "must be a list of objects, got " + type_name(*it));
  for (std::size_t i = 0; i < it->size(); ++i) {
    out.emplace_back((*it)[i], file_, key_path(key) + "[" + std::to_string(i) + "]");
  }
  return out;
}

std::string ConfigNode::str(const std::string& key, const std::string& def) const {
  used_->insert(key);
  auto it = j_->find(key);
  if (it == j_->end()) return def;
  if (!it->is_string()) fail(key, "must be a string, got " + type_name(*it));
  return it->get<std::string>();
}

std::string ConfigNode::str_required(const std::string& key) const {
  if (!has(key)) fail(key, "is required");
  auto s = str(key, "");
  if (s.empty()) fail(key, "must not be empty");
  return s;
}

std::string ConfigNode::one_of(const std::string& key, const std::string& def,
                               const std::vector<std::string>& allowed) const {
  auto s = str(key, def);
  for (const auto& a : allowed) {
    if (a == s) return s;
  }
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  fail(key, "must be one of " + list + ", got \"" + s + "\"");
}

bool ConfigNode::boolean(const std::string& key, bool def) const {
  used_->insert(key);
  auto it = j_->find(key);
  if (it == j_->end()) return def;
  if (!it->is_boolean()) fail(key, "must be true or false, got " + type_name(*it));
  return it->get<bool>();
}

double ConfigNode::number(const std::string& key, double def, double min, double max) const {
  used_->insert(key);
  auto it = j_->find(key);
  if (it == j_->end()) return def;
  if (!it->is_number()) fail(key, "must be a number, got " + type_name(*it));
  const double v = it->get<double>();
  if (!std::isfinite(v)) fail(key, "must be finite");
  if (v < min) fail(key, "must be >= " + nlohmann::json(min).dump() + ", got " + it->dump());
  if (v > max) fail(key, "must be <= " + nlohmann::json(max).dump() + ", got " + it->dump());
  return v;
}

std::int64_t ConfigNode::integer(const std::string& key, std::int64_t def, std::int64_t min,
                                 std::int64_t max) const {
  used_->insert(key);
  auto it = j_->find(key);
  if (it == j_->end()) return def;
  if (!it->is_number_integer()) fail(key, "must be an integer, got " + it->dump());
  const auto v = it->get<std::int64_t>();
  if (v < min) fail(key, "must be >= " + std::to_string(min) + ", got " + std::to_string(v));
  if (v > max) fail(key, "must be <= " + std::to_string(max) + ", got " + std::to_string(v));
  return v;
}

std::vector<std::string> ConfigNode::str_list(const std::string& key) const {
  used_->insert(key);
  std::vector<std::string> out;
  auto it = j_->find(key);
  if (it == j_->end()) return out;
  if (!it->is_array()) fail(key, "must be a list of strings, got " + type_name(*it));
  for (const auto& v : *it) {
    if (!v.is_string()) fail(key, "must be a list of strings, found " + v.dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::pair<std::int64_t, std::int64_t> ConfigNode::int_range(const std::string& key, std::int64_t min,
                                                             std::int64_t max, const std::string& unit) const {
  const auto v = int_list(key, min, max);
  if (v.size() != 2 || v[0] > v[1]) fail(key, "must be [min, max] " + unit + " with min <= max");
  return {v[0], v[1]};
}

std::vector<std::int64_t> ConfigNode::int_list(const std::string& key, std::int64_t min,
                                               std::int64_t max) const {
  used_->insert(key);
  std::vector<std::int64_t> out;
  auto it = j_->find(key);
  if (it == j_->end()) return out;
  if (!it->is_array()) fail(key, "must be a list of integers, got " + type_name(*it));
  for (const auto& v : *it) {
    if (!v.is_number_integer()) fail(key, "must be a list of integers, found " + v.dump());
    const auto x = v.get<std::int64_t>();
    if (x < min || x > max) {
      fail(key, "values must lie in [" + std::to_string(min) + ", " + std::to_string(max) +
                    "], found " + std::to_string(x));
    }
    out.push_back(x);
  }
  return out;
}

std::vector<double> ConfigNode::number_list(const std::string& key) const {
  used_->insert(key);
  std::vector<double> out;
  auto it = j_->find(key);
  if (it == j_->end()) return out;
  if (!it->is_array()) fail(key, "must be a list of numbers, got " + type_name(*it));
  for (const auto& v : *it) {
    if (!v.is_number()) fail(key, "must be a list of numbers, found " + v.dump());
    out.push_back(v.get<double>());
  }
  return out;
}

std::filesystem::path ConfigNode::path(const std::string& key, const std::string& def) const {
  const std::string s = str(key, def);
  if (s.empty()) return {};
  std::filesystem::path p(s);
  if (p.is_relative() && !file_.empty()) {
    p = std::filesystem::path(file_).parent_path() / p;
  }
  return p.lexically_normal();
}

void ConfigNode::require_exists(const std::string& key, const std::filesystem::path& p, bool folder,
                                const std::string& hint) const {
  if (p.empty()) return;
  if (const auto found = reachable(p, folder); !found) {
    fail(key, (folder ? "folder " : "file ") + p.string() + " " + found.error().message() + hint);
  }
}


std::vector<std::pair<std::string, std::string>> ConfigNode::string_map(const std::string& key) const {
  std::vector<std::pair<std::string, std::string>> out;
  const auto& v = raw(key);
  if (v.is_null()) return out;
  if (!v.is_object()) fail(key, "must be an object of NAME: \"value\"");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_string()) fail(key, "value of " + it.key() + " must be a string");
    out.emplace_back(it.key(), it->get<std::string>());
  }
  return out;
}

std::vector<std::string> ConfigNode::finish_open(const std::vector<std::string>& known) const {
  std::vector<std::string> extra;
  for (auto it = j_->begin(); it != j_->end(); ++it) {
    if (used_->count(it.key())) continue;
    for (const auto& k : known) {
      if (edit_distance(it.key(), k) <= 2) fail(it.key(), "unknown key; did you mean " + k + "?");
    }
    extra.push_back(it.key());
  }
  return extra;
}

// An unknown key within two typos of a key the section was asked for ("rouds": rounds) is told
// "did you mean" that key, the nearest.
void ConfigNode::finish() const {
  for (auto it = j_->begin(); it != j_->end(); ++it) {
    if (used_->count(it.key())) continue;
    const auto* nearest = nearest_key(it.key(), *used_);
    fail(it.key(), nearest ? "unknown key; did you mean " + *nearest + "?" : "unknown key");
  }
}

}  // namespace xsilo
