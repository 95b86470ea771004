#include "tests/testlib.h"

#include <boost/asio/post.hpp>
#include <random>

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
