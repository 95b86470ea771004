// Reading JSON configs with errors a user can act on: every failure names the file, the key
// path and the reason, and keys nobody asked for are refused (a typo is never silently ignored).
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace xsilo {

// A configuration or usage error: caught at main, printed as one line, exit code 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A view of one JSON object of a config file. Each getter marks its key as known; finish()
// refuses the keys that were never asked for.
class ConfigNode {
 public:
  ConfigNode(const nlohmann::json& j, std::string file, std::string path = "");

  // Loads and parses a file; a syntax error is reported with the file name.
  static nlohmann::json load_file(const std::filesystem::path& file);

  bool has(const std::string& key) const;
  ConfigNode child(const std::string& key) const;  // {} when absent
  std::vector<ConfigNode> child_list(const std::string& key) const;

  std::string str(const std::string& key, const std::string& def) const;
  std::string str_required(const std::string& key) const;
  std::string one_of(const std::string& key, const std::string& def,
                     const std::vector<std::string>& allowed) const;
  bool boolean(const std::string& key, bool def) const;
  // An object of string values ({"NAME": "value", ...}), in file order; absent: empty.
  std::vector<std::pair<std::string, std::string>> string_map(const std::string& key) const;
  double number(const std::string& key, double def,
                double min = -std::numeric_limits<double>::infinity(),
                double max = std::numeric_limits<double>::infinity()) const;
  std::int64_t integer(const std::string& key, std::int64_t def,
                       std::int64_t min = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  std::vector<std::string> str_list(const std::string& key) const;
  std::vector<std::int64_t> int_list(const std::string& key, std::int64_t min,
                                     std::int64_t max) const;
  std::vector<double> number_list(const std::string& key) const;
  // [lo, hi]: two integers in [min, max] with lo <= hi (`unit` names them in the error).
  std::pair<std::int64_t, std::int64_t> int_range(const std::string& key, std::int64_t min, std::int64_t max,
                                                  const std::string& unit) const;
  // A path, resolved against the folder of the config file when relative.
  std::filesystem::path path(const std::string& key, const std::string& def) const;
  // Refuses `p` (read from `key`) unless it names an existing file, or folder when `folder`,
  // saying why ("file P does not exist", "... cannot be looked up (File name too long)"), with
  // `hint` after it. An empty path is not checked.
  void require_exists(const std::string& key, const std::filesystem::path& p, bool folder = false,
                      const std::string& hint = "") const;
  // The value as JSON (null when absent), for keys whose type varies.
  const nlohmann::json& raw(const std::string& key) const;

  // Throws for every key that no getter touched.
  void finish() const;
  // Like finish(), for a section that passes keys it does not know on (the training block to
  // external trainers): those keys are returned, but one within two typos of a known key is
  // refused with "did you mean".
  std::vector<std::string> finish_open(const std::vector<std::string>& known) const;
  // The section as given.
  const nlohmann::json& json() const { return *j_; }

  [[noreturn]] void fail(const std::string& key, const std::string& reason) const;
  const std::string& file() const { return file_; }
  std::string key_path(const std::string& key) const;

 private:
  const nlohmann::json* j_;
  std::string file_;
  std::string path_;
  std::shared_ptr<std::set<std::string>> used_;
};

}  // namespace xsilo
