// A framed, mutually authenticated TLS connection. One coroutine reads (read()), one writer
// coroutine drains the send queue, a heartbeat keeps NAT mappings alive and an idle watchdog
// closes a peer that went silent, or that stopped taking what we write (a write stalled past
// the idle timeout). send() never blocks: a slow peer only fills its own queue,
// and a queue over its limit closes that peer rather than growing without bound.
//
// A channel lives on its executor's thread (one network thread of several, transport/runtime.h).
// send(), send_stream(), send_frame(), close_with_error(), close() and start() may be called from
// another thread (the core's): they are then posted to the channel's, in the order called;
// is_open() and the byte counters may be read from any thread. read(), accept() and connect()
// run on the channel's thread (run_on() takes them there).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it
#include <variant>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "proto/frame.h"
#include "proto/message.h"
#include "transport/policy.h"
#include "transport/tls.h"
#include "transport/tls_stream.h"

namespace xsilo::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
template <class T>
using awaitable = asio::awaitable<T>;

struct ChannelOptions {
  std::size_t max_frame_bytes = proto::kDefaultMaxFrameBytes;
  std::chrono::milliseconds heartbeat_interval{5000};
  std::chrono::milliseconds idle_timeout{30000};   // 0 disables the watchdog
  std::chrono::milliseconds handshake_timeout{10000};
  std::size_t max_queued_bytes = std::size_t{512} << 20;
  // A listener's connections that have not finished TLS + Hello/Welcome: at most this many in
  // all and from one source address; more are closed at accept, before any TLS work.
  std::size_t max_handshakes = 64;
  std::size_t max_handshakes_per_address = 8;
  // Warn (in this process's log) about a peer whose certificate expires within this many days.
  int certificate_warn_days = 30;
};

// What this side says about itself in Hello / Welcome.
struct LocalInfo {
  std::string federation;
  wire::Role role = wire::ROLE_UNSPECIFIED;
  std::vector<std::string> capabilities;
};

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  // Yields frames until nullopt; a frame's tail must stay valid while the source lives.
  using Source = std::function<std::optional<proto::SplitFrame>()>;

  // The socket's executor must be an io_context's (every network thread runs one: Runtime):
  // whether a caller is on the channel's thread is asked of it. Another kind throws
  // std::invalid_argument.
  Channel(tcp::socket socket, ssl::context& ctx, ChannelOptions opts);
  ~Channel();

  // Server side: TLS handshake, certificate identity checked against `allow`, then the
  // peer's Hello read and answered with Welcome. On failure the peer receives an Error
  // when possible and the connection is closed.
  awaitable<proto::Status> accept(const AllowList& allow, const LocalInfo& me,
                                  std::uint64_t current_round);
  // Client side: TLS handshake, the peer's certificate role must be in `roles`, then Hello
  // sent and Welcome read.
  awaitable<proto::Status> connect(const AllowList& upstreams, const LocalInfo& me);

  // Starts the writer, heartbeat and idle watchdog. Call once after accept/connect.
  void start();

  // The next message that is not a heartbeat, or why there is none (bad frame, closed, idle).
  awaitable<proto::Result<wire::Envelope>> read();
  // The same, a TensorChunk's data left in the frame it came in (proto::decode_message): the
  // message holds the frame, and the next read reuses the connection's buffer only once the
  // messages read from it are gone.
  awaitable<proto::Result<proto::Message>> read_message();

  // Queue a message, or a lazily produced run of messages (model chunks: memory stays at one
  // chunk per connection). False when closed or when the queue limit was exceeded (called from
  // another thread: false when closed; the limit is then checked on the channel's thread, and
  // the message counts in queued_bytes() from the call on, while its post waits).
  bool send(wire::Envelope env);
  bool send_stream(Source next);
  // A frame already encoded (proto::encode_frame), shared with other connections: an edge
  // sends each model chunk to its region's silos from one copy.
  bool send_frame(std::shared_ptr<const std::string> frame);
  // Sends an Error message, then closes.
  void close_with_error(wire::ErrorCode code, const std::string& message);
  void close();

  bool is_open() const { return open_; }
  const PeerIdentity& peer() const { return peer_; }
  const wire::Hello& peer_hello() const { return peer_hello_; }
  const wire::Welcome& welcome() const { return welcome_; }
  std::string remote() const { return remote_; }
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  std::uint64_t bytes_received() const { return bytes_received_; }
  // Bytes waiting to be written: queued on the channel's thread, and sent from another thread
  // whose post has not run yet (a message's encoded size is then counted as its protobuf size
  // plus the frame header, and replaced by the encoded frame's when it is queued).
  std::size_t queued_bytes() const { return queued_bytes_ + posted_bytes_; }
  asio::any_io_executor executor() { return stream_.socket().get_executor(); }
  const std::string& federation() const { return federation_; }

 private:
  // What is queued to send: an encoded frame, a frame shared with other channels, or a stream
  // of frames made as they are sent.
  using Item = std::variant<std::string, std::shared_ptr<const std::string>, Source>;
  bool enqueue(Item item, std::size_t bytes);
  // Whether the caller runs on another thread than this channel's (the core's, say).
  bool elsewhere();
  // Runs `call` on this channel's thread, holding the channel. `bytes` (a message's size) count
  // in queued_bytes() until the call runs.
  void post(std::function<void(Channel&)> call, std::size_t bytes = 0);
  // The next frame to write, taken from the front of the queue (nullopt: a stream ended);
  // `keep` holds a shared frame until it is written.
  std::optional<proto::SplitFrame> take_front(std::shared_ptr<const std::string>& keep);
  // The next frame's payload, in read_buffer_ (valid until the next read).
  awaitable<proto::Result<std::span<const std::uint8_t>>> read_frame();
  awaitable<proto::Result<wire::Envelope>> read_envelope();
  void trim_read_buffer(std::size_t last_frame);
  // The next message `read_one` reads that is not a heartbeat, checked to be of this federation.
  template <class T, class Read>
  awaitable<proto::Result<T>> read_next(Read read_one);
  awaitable<void> write_frame_now(const wire::Envelope& env);
  awaitable<void> writer();
  awaitable<void> heartbeat();
  awaitable<void> watchdog();
  void arm_deadline(std::chrono::milliseconds d);
  void disarm_deadline();

  TlsStream stream_;
  ChannelOptions opts_;
  asio::steady_timer wake_, heartbeat_timer_, watchdog_timer_, deadline_;
  std::deque<Item> queue_;
  // Shared with the messages read as views of it (read_message); one still held makes the next
  // read take a new buffer.
  std::shared_ptr<std::vector<std::uint8_t>> read_buffer_;
  std::atomic<std::size_t> queued_bytes_ = 0;
  std::atomic<std::size_t> posted_bytes_ = 0;  // sent from another thread, post not run yet
  std::atomic<bool> open_ = true;
  bool closing_ = false;   // flush then close
  bool started_ = false;
  PeerIdentity peer_;
  void warn_if_expiring() const;
  // "TLS handshake with ADDRESS failed: certificate verify failed (peer certificate CN=...: why)".
  std::string handshake_failure(const boost::system::system_error& e);
  wire::Hello peer_hello_;
  wire::Welcome welcome_;
  std::string remote_;
  std::string federation_;
  std::atomic<std::uint64_t> bytes_sent_ = 0, bytes_received_ = 0;
  IdleWatch idle_;  // when the last frame was read: the watchdog's decision
};

template <class T>
awaitable<std::optional<T>> as_optional(awaitable<T> op) {
  co_return co_await std::move(op);
}

// Runs `op` on `where` (a channel's executor) and resumes the caller on its own executor with
// the result: the core waits for a connection's read while another thread decrypts it.
template <class T>
awaitable<T> run_on(asio::any_io_executor where, awaitable<T> op) {
  if (where == co_await asio::this_coro::executor) co_return co_await std::move(op);
  // co_spawn's result type must be default-constructible; a Result is not.
  auto r = co_await asio::co_spawn(where, as_optional(std::move(op)), asio::use_awaitable);
  co_return std::move(*r);
}

// Fills federation and round of an envelope.
wire::Envelope envelope(const std::string& federation, std::uint64_t round);

}  // namespace xsilo::transport
