// The checks of a deviating server's split view (tools/sim_server.h) as real processes, from the
// record the hostile server itself keeps of what it told and asked each silo and what each
// answered (OUT/hostile_server.jsonl), and from its audit records.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xsilo::test {

// In every round the server split each secure group's survivors: the victim and every other
// survivor were told it survived, the rest (the "dropped" side) that it dropped, each set signed
// with the server's key. The dropped side is too small to carry a request alone (fewer silos
// than the signatures a member needs: max(t, min_group) on the complete graph, t of its own
// holders on a graph), so:
//   - every silo of the dropped side confirmed its set (the server's signature on it verified),
//     was asked to unmask the victim as a dropout with every signature that set gathered, and
//     refused, saying that too few signed it (the silo's error: it reaches the server from a
//     silo connected straight to it; an edge does not relay it): none answered (none sent its
//     share of the victim's mask key);
//   - the server never holds t of the victim's holders' shares of its mask key and t of their
//     shares of its self mask at once, whichever side answered what;
//   - a committed round's group summed the survivor set the server holds, the victim's view
//     (it survived): `rounds` are the audit log's round records.
inline void check_split_view(const std::filesystem::path& record, const std::vector<nlohmann::json>& rounds) {
  using json = nlohmann::json;
  std::map<std::pair<std::uint64_t, std::uint32_t>, json> splits;
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::vector<json>> events;
  std::ifstream in(record);
  for (std::string line; std::getline(in, line);) {
    const auto j = json::parse(line);
    const std::pair<std::uint64_t, std::uint32_t> key{j["round"].get<std::uint64_t>(), j["group"].get<std::uint32_t>()};
    if (j["event"] == "split") {
      splits[key] = j;
    } else {
      events[key].push_back(j);
    }
  }
  EXPECT_EQ(splits.size(), rounds.size()) << "a split in every round of one secure group";
  for (const auto& [key, split] : splits) {
    const auto where = "round " + std::to_string(key.first) + ", group " + std::to_string(key.second) + ": ";
    const auto dropped = split["dropped"].get<std::set<std::string>>();
    const auto needed = split["degree"].get<std::uint32_t>() ? split["threshold"] : split["min_survivors"];
    ASSERT_FALSE(dropped.empty()) << where << split.dump();
    ASSERT_LT(dropped.size(), needed.get<std::size_t>()) << where << "the test's premise: " << split.dump();
    std::map<std::string, std::set<std::string>> did;  // silo -> events
    std::map<std::string, std::string> why;
    std::map<std::string, std::size_t> answered;  // view -> the victim's holders that answered it
    const auto holders = split["holders"].get<std::set<std::string>>();
    for (const auto& e : events[key]) {
      const std::string silo = e["silo"], event = e["event"];
      did[silo].insert(event);
      if (event == "refused") why[silo] = e["why"];
      if (event == "answered" && holders.count(silo)) ++answered[e["view"].get<std::string>()];
      EXPECT_FALSE(event == "answered" && e["view"] == "dropped")
          << where << silo << " sent its share of " << split["victim"] << "'s mask key: " << e.dump();
    }
    for (const auto& silo : dropped) {
      EXPECT_TRUE(did[silo].count("confirmed")) << where << silo << " did not confirm the set without the victim";
      EXPECT_TRUE(did[silo].count("refused")) << where << silo << " did not refuse the request: " << split.dump();
      EXPECT_NE(why[silo].find("signed the survivor set"), std::string::npos) << where << silo << ": " << why[silo];
    }
    const auto t = split["threshold"].get<std::size_t>();
    EXPECT_FALSE(answered["dropped"] >= t && answered["survived"] >= t) << where << "both secrets of the victim";
    for (const auto& r : rounds) {
      if (r["round"] != key.first || r["status"] != "committed") continue;
      for (const auto& o : r["secure"]["groups_outcome"]) {
        if (o["group"] != key.second || !o["ok"].get<bool>()) continue;
        auto u3 = split["survived"].get<std::vector<std::string>>();
        u3.insert(u3.end(), dropped.begin(), dropped.end());
        std::sort(u3.begin(), u3.end());
        EXPECT_EQ(o["survivors"].get<std::vector<std::string>>(), u3) << where << r.dump(2);
      }
    }
  }
}

}  // namespace xsilo::test
