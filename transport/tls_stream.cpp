#include "transport/tls_stream.h"

#include <openssl/err.h>
#include <sys/socket.h>

#include <cerrno>

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

// The read side's BIO: OpenSSL's reads of ciphertext go straight to the socket (recv, never
// waiting) into OpenSSL's own record buffer. A memory BIO fed from a buffer of ours cost two
// copies of every byte received (into the BIO, then out of it) before it was decrypted, and a
// zero-fill as the BIO grew (issue 43's profile). No data yet is a retry: the stream waits
// for the socket to be readable. The end of the stream or an error is kept for the stream to
// throw, as the socket's own read would have (also a retry to OpenSSL, which must not take it
// for a TLS error).
int socket_read(BIO* bio, char* out, int len) {
  auto* end = static_cast<TlsStream::ReadEnd*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  if (len <= 0) return 0;
  for (;;) {
    const ssize_t n = ::recv(end->socket->native_handle(), out, static_cast<std::size_t>(len), MSG_DONTWAIT);
    if (n > 0) return static_cast<int>(n);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      end->error = asio::error::eof;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      end->error = boost::system::error_code(errno, boost::system::system_category());
    }
    BIO_set_retry_read(bio);
    return -1;
  }
}

long socket_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

// The write side's BIO: OpenSSL's records are appended to a buffer of ours (the stream's
// pending_), which flush() swaps with the one it writes to the socket. A memory BIO cost one
// more copy of every byte sent (read out of it into the buffer written) and a zero-fill as it
// grew. It takes every byte, never a retry; a failed allocation is an error to OpenSSL (no
// exception may cross it).
int buffer_write(BIO* bio, const char* in, int len) {
  auto* into = static_cast<std::vector<std::uint8_t>*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  if (len <= 0) return 0;
  try {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(in);
    into->insert(into->end(), bytes, bytes + len);
  } catch (...) {
    return -1;
  }
  return len;
}

long buffer_ctrl(BIO* bio, int cmd, long, void*) {
  switch (cmd) {
    case BIO_CTRL_FLUSH: return 1;
    case BIO_CTRL_PENDING:
    case BIO_CTRL_WPENDING:
      return static_cast<long>(static_cast<std::vector<std::uint8_t>*>(BIO_get_data(bio))->size());
    default: return 0;
  }
}

// A BIO of one of our two kinds over `data`. Its method is made once a process (`fill` sets
// its functions); a failure to make it is thrown, and tried again by the next stream.
template <class Fill>
BIO* own_bio(const char* kind, Fill fill, void* data) {
  static BIO_METHOD* const method = [&] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, kind);
    if (!m || !fill(m)) {
      BIO_meth_free(m);  // null or half made
      throw std::runtime_error(std::string("cannot make the TLS ") + kind);
    }
    return m;
  }();
  BIO* bio = BIO_new(method);
  if (!bio) throw std::runtime_error("BIO_new failed");
  BIO_set_data(bio, data);
  BIO_set_init(bio, 1);
  return bio;
}

BIO* buffer_writer(std::vector<std::uint8_t>* into) {
  return own_bio(
      "buffer writer", [](BIO_METHOD* m) { return BIO_meth_set_write(m, buffer_write) && BIO_meth_set_ctrl(m, buffer_ctrl); },
      into);
}

BIO* socket_reader(TlsStream::ReadEnd* end) {
  return own_bio(
      "socket reader", [](BIO_METHOD* m) { return BIO_meth_set_read(m, socket_read) && BIO_meth_set_ctrl(m, socket_ctrl); },
      end);
}

}  // namespace

TlsStream::TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& ctx)
    : socket_(std::move(socket)), ssl_(SSL_new(ctx.native_handle())), read_end_{&socket_, {}} {
  if (!ssl_) throw std::runtime_error("SSL_new failed");
  try {
    std::unique_ptr<BIO, decltype(&BIO_free)> rbio(socket_reader(&read_end_), &BIO_free);
    std::unique_ptr<BIO, decltype(&BIO_free)> wbio(buffer_writer(&pending_), &BIO_free);
    SSL_set_bio(ssl_, rbio.release(), wbio.release());  // ssl_'s now
  } catch (...) {
    SSL_free(ssl_);  // no destructor runs for a constructor that throws
    throw;
  }
  // Read ahead: as many records as the buffer holds in one system call, not a record's header
  // and then its body in two.
  SSL_set_read_ahead(ssl_, 1);
  SSL_set_default_read_buffer_len(ssl_, kReadChunk);
  // OpenSSL's default since 1.1.1, stated because fill() leans on it: a post-handshake message
  // (a session ticket, a key update) is taken inside SSL_read, not returned as WANT_READ.
  SSL_set_mode(ssl_, SSL_MODE_AUTO_RETRY);
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

bool TlsStream::has_pending_output() const { return !pending_.empty(); }

asio::awaitable<void> TlsStream::flush() {
  // Take everything OpenSSL produced so far; the reader may add more while we write, which
  // the next turn sends.
  while (!pending_.empty() && !writing_) {
    out_.clear();
    out_.swap(pending_);  // OpenSSL appends to the emptied buffer meanwhile
    const std::size_t n = out_.size();
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
  if (writing_ || !pending_.empty()) return;
  for (auto* buffer : {&out_, &pending_}) {
    if (buffer->capacity() > kWritePiece) std::vector<std::uint8_t>().swap(*buffer);
  }
}

asio::awaitable<void> TlsStream::fill() {
  if (read_end_.error) throw boost::system::system_error(read_end_.error);
  // The reactor is edge-triggered: a wait for readability while bytes already sit in the socket
  // would last until the peer sent more. A WANT_READ follows a read that found nothing, but
  // this does not rest on it: bytes there (or the end, or an error) are left for the next read.
  char byte;
  const ssize_t n = ::recv(socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) co_return;
  co_await socket_.async_wait(asio::ip::tcp::socket::wait_read, use_awaitable);
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
      if (pending_.size() >= kWritePiece) co_await flush();
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
