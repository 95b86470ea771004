// TLS over a TCP socket: a whole frame is encrypted into a buffer of ours (a write BIO that
// appends to it) and written with one system call, and OpenSSL reads ciphertext from the socket itself, up to 128 KiB of records a
// system call (read ahead), straight into its record buffer.
// (Boost.Asio's ssl::stream moves one 16 KiB record per system call, which on loopback costs
// a wake-up per record and caps a connection at about half the TLS bound.)
//
// One reader and one writer coroutine may use a stream at the same time, on one thread.
#pragma once

#include <openssl/ssl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>  // Boost 1.74 awaitable.hpp needs std::exchange
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

namespace xsilo::transport {

class TlsStream {
 public:
  TlsStream(boost::asio::ip::tcp::socket socket, boost::asio::ssl::context& ctx);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // Throws boost::system::system_error on failure (including certificate verification).
  boost::asio::awaitable<void> handshake(bool server);
  // Encrypts every buffer and writes the ciphertext in one go.
  boost::asio::awaitable<void> write(std::span<const std::uint8_t> a,
                                     std::span<const std::uint8_t> b = {});
  // Reads exactly `out.size()` plaintext bytes.
  boost::asio::awaitable<void> read_exact(std::span<std::uint8_t> out);
  // Ciphertext the reader produced (TLS 1.3 key updates) waiting for the writer.
  bool has_pending_output() const;
  boost::asio::awaitable<void> flush();
  // Gives back what a large frame grew (the two ciphertext buffers) when
  // nothing waits to be written: an idle connection then keeps little, which a server with
  // hundreds of silos needs. The next large frame grows them again.
  void trim();
  // Since when the write in progress has waited on the socket without it taking a byte (the
  // last partial write); nullopt when no write is in progress. A peer that stops reading (its
  // window full) keeps it set: the channel's watchdog closes such a peer (a write stalled past
  // the idle timeout); a slow reader keeps it moving.
  std::optional<std::chrono::steady_clock::time_point> writing_since() const;

  SSL* native_handle() { return ssl_; }
  // What the read side's BIO reads from, and why it stopped (the end of the stream, an error).
  struct ReadEnd {
    boost::asio::ip::tcp::socket* socket = nullptr;
    boost::system::error_code error;
  };
  boost::asio::ip::tcp::socket& socket() { return socket_; }
  void close();

 private:
  boost::asio::awaitable<void> fill();  // waits until the socket has ciphertext to read
  [[noreturn]] void fail(int ret, const char* what);

  boost::asio::ip::tcp::socket socket_;
  SSL* ssl_ = nullptr;
  ReadEnd read_end_;  // what ssl_'s read BIO reads from
  // Ciphertext: ssl_'s write BIO appends to pending_; flush() swaps it into out_ and writes that.
  std::vector<std::uint8_t> pending_;
  std::vector<std::uint8_t> out_;
  bool writing_ = false;
  std::chrono::steady_clock::time_point write_started_{};  // while writing_: the last progress
};

}  // namespace xsilo::transport
