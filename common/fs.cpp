#include "common/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace xsilo {

namespace {
[[noreturn]] void fail(const std::string& what, const std::filesystem::path& p) {
  throw std::runtime_error(what + " " + p.string() + ": " + std::strerror(errno));
}

void write_all(int fd, std::string_view bytes, const std::filesystem::path& p) {
  const char* data = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", p);
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
}
}  // namespace

void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail("cannot open folder", dir);
  ::fsync(fd);
  ::close(fd);
}

void atomic_write_file(const std::filesystem::path& path, std::string_view bytes, unsigned mode) {
  atomic_write_parts(path, {bytes}, mode);
}

void atomic_write_parts(const std::filesystem::path& path,
                        std::initializer_list<std::string_view> parts, unsigned mode) {
  const auto dir = path.parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  std::random_device rd;
  auto tmp = path;
  tmp += ".tmp" + std::to_string(rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) fail("cannot create", tmp);
  try {
    for (auto part : parts) write_all(fd, part, tmp);
    if (::fsync(fd) != 0) fail("cannot fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    fail("cannot rename onto", path);
  }
  fsync_dir(dir);
}

void append_durable(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot open", path);
  try {
    write_all(fd, bytes, path);
    if (::fsync(fd) != 0) fail("cannot fsync", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::string cut_torn_tail(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return "";
    fail("cannot open", path);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0) fail("cannot read", path);
  // Back from the end in blocks until a newline: a torn line is at most one record long.
  std::string tail;
  off_t keep = 0;
  char block[4096];
  for (off_t end = size; end > 0;) {
    const off_t start = end > off_t(sizeof block) ? end - off_t(sizeof block) : 0;
    const auto want = static_cast<std::size_t>(end - start);
    if (::pread(fd, block, want, start) != static_cast<ssize_t>(want)) fail("cannot read", path);
    if (end == size && block[want - 1] == '\n') return "";
    const std::string_view b(block, want);
    const auto nl = b.rfind('\n');
    if (nl != std::string_view::npos) {
      keep = start + static_cast<off_t>(nl) + 1;
      tail.insert(0, b.substr(nl + 1));
      break;
    }
    tail.insert(0, b);
    end = start;
  }
  if (keep == size) return "";
  if (::ftruncate(fd, keep) != 0 || ::fsync(fd) != 0) fail("cannot cut the torn last line of", path);
  return tail;
}

Status reachable(const std::filesystem::path& path, bool folder) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return Error("does not exist");
  if (ec) return Error("cannot be looked up (" + ec.message() + ")");
  if (folder && !std::filesystem::is_directory(st)) return Error("is not a folder");
  return {};
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string() + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string log_tail(const std::filesystem::path& log, std::size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out;
}

std::string last_error_above_tail(const std::filesystem::path& log, std::size_t tail) {
  std::ifstream in(log);
  std::string last;
  std::size_t at = 0, n = 0;
  for (std::string l; std::getline(in, l);) {
    ++n;
    for (const char* mark : {"[error]", "[critical]", "\"level\":\"error\"", "\"level\":\"critical\""}) {
      if (l.find(mark) != std::string::npos) {
        last = l;
        at = n;
        break;
      }
    }
  }
  return at > 0 && at + tail <= n ? last : "";
}

}  // namespace xsilo
