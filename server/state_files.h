// Shared by state.cpp and state_recovery.cpp only: how the state folder names its checkpoints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace xsilo::server::detail {

// round_NNNNNN.safetensors (at least six digits).
std::string round_file(std::uint64_t round);
// The checkpoints in `dir`, by round, oldest first (nothing when `dir` is not a folder).
std::vector<std::pair<std::uint64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& dir);
// A hash's first 12 hex digits, for messages ("none" for no hash).
std::string short_sha(const std::string& s);

}  // namespace xsilo::server::detail
