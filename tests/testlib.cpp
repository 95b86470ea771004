#include "tests/testlib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <map>
#include <mutex>
#include <random>

#include "common/fs.h"
#include "transport/tls.h"

namespace xsilo::test {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("xsilo-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!std::getenv("XSILO_KEEP_TEST_DIRS")) std::filesystem::remove_all(path_, ec);
}

void make_pki(const std::filesystem::path& dir, const std::string& federation,
              const std::vector<std::pair<wire::Role, std::string>>& participants) {
  transport::pki_init(dir, federation);
  for (const auto& [role, name] : participants) {
    transport::IssueRequest req;
    req.role = role;
    req.name = name;
    transport::pki_issue(dir, req);
  }
}

namespace {

struct ThrowawayPki {
  TempDir dir;
  std::mutex mu;
  std::map<std::string, crypto::CertSigner> signers;
  explicit ThrowawayPki(const std::string& federation) { transport::pki_init(dir.path(), federation); }
  crypto::CertSigner signer(wire::Role role, const std::string& name) {
    std::lock_guard lock(mu);
    const std::string key = transport::role_name(role) + "/" + name;
    auto it = signers.find(key);
    if (it != signers.end()) return it->second;
    transport::IssueRequest req;
    req.role = role;
    req.name = name;
    const auto kit = dir.path() / "kits" / name;
    std::filesystem::remove_all(kit);  // one name may be issued for two roles
    transport::pki_issue(dir.path(), req);
    return signers.emplace(key, transport::load_signer(transport::TlsFiles::from_kit(kit))).first->second;
  }
};

ThrowawayPki& federation_pki() {
  static ThrowawayPki pki("fed");
  return pki;
}

}  // namespace

crypto::CertSigner signer(wire::Role role, const std::string& name) { return federation_pki().signer(role, name); }

crypto::CertVerifier verifier() {
  static const crypto::CertVerifier v =
      crypto::CertVerifier::from_pem(read_file(federation_pki().dir.path() / "ca" / "ca.pem"));
  return v;
}

crypto::CertSigner foreign_signer(wire::Role role, const std::string& name) {
  static ThrowawayPki pki("fed");
  return pki.signer(role, name);
}

std::vector<int> idle_connections(const char* from, std::uint16_t port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &src.sin_addr);
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
        ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
      ::close(fd);
      break;
    }
    fds.push_back(fd);
  }
  return fds;
}

IoThread::IoThread() : work_(boost::asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}

IoThread::~IoThread() {
  work_.reset();
  io_.stop();
  thread_.join();
}

void IoThread::run_sync(std::function<void()> f) {
  std::promise<void> done;
  boost::asio::post(io_, [&] {
    f();
    done.set_value();
  });
  done.get_future().get();
}

std::string xsilo_bin() {
  const char* b = std::getenv("XSILO_BIN");
  return b ? b : "xsilo";
}

}  // namespace xsilo::test
