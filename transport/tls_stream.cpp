#include "transport/tls_stream.h"

#include <openssl/buffer.h>
#include <openssl/err.h>

#include <boost/asio/read.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

namespace xsilo::transport {

namespace asio = boost::asio;
using asio::use_awaitable;

namespace {
// Ciphertext moves in pieces of at most this size: large enough for few system calls, small
// enough that a server with hundreds of connections keeps little per connection.
constexpr std::size_t kReadChunk = 128 * 1024;
constexpr std::size_t kWritePiece = 256 * 1024;
}

TlsStream::TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& ctx)
    : socket_(std::move(socket)), ssl_(SSL_new(ctx.native_handle())) {
  if (!ssl_) throw std::runtime_error("SSL_new failed");
  rbio_ = BIO_new(BIO_s_mem());
  wbio_ = BIO_new(BIO_s_mem());
  BIO_set_mem_eof_return(rbio_, -1);  // "no data yet", not end of stream
  SSL_set_bio(ssl_, rbio_, wbio_);
  in_.resize(kReadChunk);
}

TlsStream::~TlsStream() { SSL_free(ssl_); }

void TlsStream::fail(int ret, const char* what) {
  const int err = SSL_get_error(ssl_, ret);
  if (err == SSL_ERROR_ZERO_RETURN) throw boost::system::system_error(asio::error::eof);
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code) {
    throw boost::system::system_error(
        boost::system::error_code(static_cast<int>(code), asio::error::get_ssl_category()), what);
  }
  throw boost::system::system_error(asio::error::connection_aborted, what);
}

bool TlsStream::has_pending_output() const { return BIO_ctrl_pending(wbio_) > 0; }

asio::awaitable<void> TlsStream::flush() {
  // Take everything OpenSSL produced so far; the reader may add more while we write, which
  // the next flush sends.
  while (BIO_ctrl_pending(wbio_) > 0 && !writing_) {
    const std::size_t n = BIO_ctrl_pending(wbio_);
    out_.resize(n);
    BIO_read(wbio_, out_.data(), static_cast<int>(n));
    writing_ = true;
    try {
      // Piece by piece as the socket takes them: each piece taken is progress (writing_since()
      // measures the wait since the last one, not since the whole write began).
      for (std::size_t done = 0; done < n;) {
        write_started_ = std::chrono::steady_clock::now();
        done += co_await socket_.async_write_some(asio::buffer(out_.data() + done, n - done), use_awaitable);
      }
    } catch (...) {
      writing_ = false;
      throw;
    }
    writing_ = false;
  }
}

std::optional<std::chrono::steady_clock::time_point> TlsStream::writing_since() const {
  if (!writing_) return std::nullopt;
  return write_started_;
}

void TlsStream::trim() {
  if (writing_ || BIO_ctrl_pending(wbio_) > 0) return;
  if (out_.capacity() > kWritePiece) std::vector<std::uint8_t>().swap(out_);
  BUF_MEM* mem = nullptr;
  BIO_get_mem_ptr(wbio_, &mem);
  if (!mem || mem->max <= kWritePiece) return;
  // A memory BIO never shrinks: an empty one takes its place (SSL_set0_wbio frees the old).
  if (BIO* fresh = BIO_new(BIO_s_mem())) {
    SSL_set0_wbio(ssl_, fresh);
    wbio_ = fresh;
  }
}

asio::awaitable<void> TlsStream::fill() {
  const std::size_t n = co_await socket_.async_read_some(asio::buffer(in_), use_awaitable);
  BIO_write(rbio_, in_.data(), static_cast<int>(n));
}

asio::awaitable<void> TlsStream::handshake(bool server) {
  if (server) SSL_set_accept_state(ssl_);
  else SSL_set_connect_state(ssl_);
  for (;;) {
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_);
    co_await flush();
    if (r == 1) co_return;
    const int err = SSL_get_error(ssl_, r);
    if (err == SSL_ERROR_WANT_READ) {
      co_await fill();
    } else if (err != SSL_ERROR_WANT_WRITE) {
      fail(r, "TLS handshake");
    }
  }
}

asio::awaitable<void> TlsStream::write(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  for (auto part : {a, b}) {
    std::size_t done = 0;
    while (done < part.size()) {
      ERR_clear_error();
      const int chunk = static_cast<int>(std::min(part.size() - done, kWritePiece));
      const int r = SSL_write(ssl_, part.data() + done, chunk);
      if (r <= 0) fail(r, "TLS write");
      done += static_cast<std::size_t>(r);
      if (BIO_ctrl_pending(wbio_) >= kWritePiece) co_await flush();
    }
  }
  co_await flush();
}

asio::awaitable<void> TlsStream::read_exact(std::span<std::uint8_t> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    ERR_clear_error();
    const int want = static_cast<int>(std::min<std::size_t>(out.size() - done, 1 << 30));
    const int r = SSL_read(ssl_, out.data() + done, want);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
      continue;
    }
    const int err = SSL_get_error(ssl_, r);
    if (err == SSL_ERROR_WANT_READ) {
      co_await fill();
    } else {
      fail(r, "TLS read");
    }
  }
}

void TlsStream::close() {
  boost::system::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
}

}  // namespace xsilo::transport
