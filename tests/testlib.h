// Helpers shared by the tests: temporary folders, a throwaway PKI, an io_context on a thread.
#pragma once

#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "crypto/certs.h"
#include "transport/pki.h"

namespace xsilo::test {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& s) const { return path_ / s; }

 private:
  std::filesystem::path path_;
};

// A CA in DIR with kits for the named participants.
void make_pki(const std::filesystem::path& dir, const std::string& federation,
              const std::vector<std::pair<wire::Role, std::string>>& participants);

// Certificate keys for in-process protocol tests: one throwaway federation PKI ("fed") per
// test process, made on first use; a participant's kit is issued the first time it is asked
// for. Thread-safe.
crypto::CertSigner signer(wire::Role role, const std::string& name);
crypto::CertVerifier verifier();
// The same names from another CA: valid certificates the federation must not trust.
crypto::CertSigner foreign_signer(wire::Role role, const std::string& name);

// `n` TCP connections to 127.0.0.1:port from source address `from` (any 127.x.y.z) that never
// say a word: a flood of unauthenticated peers. Stops early when one fails; the caller closes
// the descriptors.
std::vector<int> idle_connections(const char* from, std::uint16_t port, int n);

// Runs an io_context on its own thread until destroyed.
class IoThread {
 public:
  IoThread();
  ~IoThread();
  boost::asio::io_context& io() { return io_; }
  boost::asio::any_io_executor executor() { return io_.get_executor(); }
  // Runs a coroutine on the io thread and waits for its result.
  template <class T>
  T run(boost::asio::awaitable<T> a) {
    if constexpr (std::is_void_v<T> || std::is_default_constructible_v<T>) {
      return boost::asio::co_spawn(io_, std::move(a), boost::asio::use_future).get();
    } else {
      // co_spawn wants a T for a coroutine that threw; a Result (common/result.h) has no empty
      // state, so it travels in an optional.
      auto wrapped = [](boost::asio::awaitable<T> inner) -> boost::asio::awaitable<std::optional<T>> {
        co_return co_await std::move(inner);
      };
      return *boost::asio::co_spawn(io_, wrapped(std::move(a)), boost::asio::use_future).get();
    }
  }
  void run_sync(std::function<void()> f);

 private:
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
};

// The xsilo binary under test (set by CTest through XSILO_BIN).
std::string xsilo_bin();

}  // namespace xsilo::test
