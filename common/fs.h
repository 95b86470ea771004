// Files that survive crashes: write to a temporary name, fsync, rename, fsync the folder.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include "common/result.h"

namespace xsilo {

// Replaces `path` atomically with `bytes`; `mode` applies to the new file.
void atomic_write_file(const std::filesystem::path& path, std::string_view bytes,
                       unsigned mode = 0644);
// Same, for a file made of several pieces (no copy into one buffer).
void atomic_write_parts(const std::filesystem::path& path,
                        std::initializer_list<std::string_view> parts, unsigned mode = 0644);
// Appends bytes and fsyncs before returning.
void append_durable(const std::filesystem::path& path, std::string_view bytes);
// A log of lines whose last append was cut short (a crash or a full disk mid-write) ends in a
// partial line: cuts it (truncate after the last newline, fsync) and returns what was cut ("" when
// the file ends in a newline, is empty or does not exist). The next append then starts a line of
// its own instead of merging into the partial one.
std::string cut_torn_tail(const std::filesystem::path& path);
std::string read_file(const std::filesystem::path& path);
// Success when `path` names something that can be reached (with `folder`, a folder), else why
// not: "does not exist", "is not a folder", or what the system said when it could not look the
// path up (a name too long, a folder on the way that cannot be read). Never throws, so a config
// check can say which path is wrong.
Status reachable(const std::filesystem::path& path, bool folder = false);
void fsync_dir(const std::filesystem::path& dir);
// The last `lines` lines of a text file (a child's log), each indented by four spaces.
std::string log_tail(const std::filesystem::path& log, std::size_t lines = 15);
// The last error (or critical) line of a log, text or JSON lines, when it is not among its last
// `tail` lines, where a process's shutdown lines can push the reason it stopped out of sight of
// log_tail(log, tail); "" otherwise.
std::string last_error_above_tail(const std::filesystem::path& log, std::size_t tail);

}  // namespace xsilo
