#include "transport/channel.h"

#include <array>
#include <stdexcept>
#include <typeinfo>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include "transport/pki.h"

namespace xsilo::transport {

void Channel::warn_if_expiring() const {
  if (auto w = expiry_warning(peer_, opts_.certificate_warn_days); !w.empty()) spdlog::warn("{} (at {})", w, remote_);
}

std::string Channel::handshake_failure(const boost::system::system_error& e) {
  // OpenSSL's first queued error is not always the verdict (a certificate of another CA with the
  // same name gives "EVP lib"): when the peer's certificate was refused, that is what is said.
  if (auto why = verify_failure(stream_.native_handle()); !why.empty()) {
    return "TLS handshake with " + remote_ + " failed: certificate verify failed (" + why + ")";
  }
  // The peer refused this end's certificate with an alert, before it sent its own (TLS 1.3: a
  // client checks the server first), so its name is not known here: what the alert means is.
  if (e.code().category() == asio::error::get_ssl_category()) {
    switch (ERR_GET_REASON(static_cast<unsigned long>(e.code().value()))) {
      case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
      case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
      case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
        return "TLS handshake with " + remote_ + " failed: " + e.code().message() +
               ": the peer does not trust this end's certificate (its ca.pem is another CA's: a kit of another "
               "federation, or of a CA made again since)";
      default:
        break;
    }
  }
  return "TLS handshake with " + remote_ + " failed: " + e.code().message();
}

using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

wire::Envelope envelope(const std::string& federation, std::uint64_t round) {
  wire::Envelope env;
  env.set_federation(federation);
  env.set_round(round);
  return env;
}

namespace {

// A peer's first message: a Hello of this federation, in this protocol version, from the role
// its certificate names.
proto::Status check_hello(const wire::Envelope& hello, const LocalInfo& me, wire::Role certified) {
  if (!hello.has_hello()) return proto::error(wire::UNEXPECTED, "expected Hello, got " + proto::body_name(hello));
  if (hello.federation() != me.federation) {
    return proto::error(wire::WRONG_FEDERATION, "peer belongs to federation \"" + hello.federation() +
                                                    "\", this is \"" + me.federation + "\"");
  }
  if (hello.hello().protocol_version() != proto::kProtocolVersion) {
    return proto::error(wire::VERSION_MISMATCH, "peer speaks protocol version " +
                                                    std::to_string(hello.hello().protocol_version()) + ", this " +
                                                    role_name(me.role) + " speaks version " +
                                                    std::to_string(proto::kProtocolVersion));
  }
  if (hello.hello().role() != certified) {
    return proto::error(wire::NOT_ALLOWED, "peer claims role " + role_name(hello.hello().role()) +
                                               " but its certificate says " + role_name(certified));
  }
  return proto::Status();
}

}  // namespace

Channel::Channel(tcp::socket socket, ssl::context& ctx, ChannelOptions opts)
    : stream_(std::move(socket), ctx), opts_(opts), wake_(stream_.socket().get_executor()),
      heartbeat_timer_(stream_.socket().get_executor()),
      watchdog_timer_(stream_.socket().get_executor()),
      deadline_(stream_.socket().get_executor()), idle_(opts.idle_timeout, Clock::now()) {
  // elsewhere() asks an io_context's executor whether it runs in this thread; of an executor of
  // another kind it could not tell, and calls from another thread would run here unposted.
  // (Asked by type: Boost 1.74's any_executor::target<T>() casts without checking that the
  // target is a T, so it is no test.)
  if (stream_.socket().get_executor().target_type() != typeid(asio::io_context::executor_type)) {
    throw std::invalid_argument("a channel's socket must live on an io_context (a network thread)");
  }
  boost::system::error_code ec;
  auto ep = stream_.socket().remote_endpoint(ec);
  remote_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
}

Channel::~Channel() = default;

void Channel::arm_deadline(std::chrono::milliseconds d) {
  deadline_.expires_after(d);
  std::weak_ptr<Channel> weak = weak_from_this();
  deadline_.async_wait([weak](boost::system::error_code ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->close();
  });
}

void Channel::disarm_deadline() { deadline_.cancel(); }

awaitable<void> Channel::write_frame_now(const wire::Envelope& env) {
  auto frame = proto::encode_frame(env, opts_.max_frame_bytes);
  if (!frame) throw std::runtime_error(frame.error().message());
  co_await stream_.write({reinterpret_cast<const std::uint8_t*>(frame->data()), frame->size()});
  bytes_sent_ += frame->size();
}

awaitable<proto::Status> Channel::accept(const AllowList& allow, const LocalInfo& me,
                                         std::uint64_t current_round) {
  auto self = shared_from_this();
  federation_ = me.federation;
  arm_deadline(opts_.handshake_timeout);
  proto::Status st;
  try {
    co_await stream_.handshake(/*server=*/true);
  } catch (const boost::system::system_error& e) {
    disarm_deadline();
    close();
    co_return proto::error(wire::NOT_ALLOWED, handshake_failure(e));
  }
  auto id = peer_identity(stream_.native_handle());
  if (!id) {
    st = id.error();
  } else {
    peer_ = *id;
    st = allow.check(peer_);
    if (st) warn_if_expiring();
  }
  auto refuse = [&](const proto::Status& why) -> awaitable<void> {
    auto env = envelope(me.federation, current_round);
    env.mutable_error()->set_code(why.error().code());
    env.mutable_error()->set_message(why.error().message());
    try {
      co_await write_frame_now(env);
    } catch (...) {
    }
    disarm_deadline();
    close();
  };
  if (!st) {
    co_await refuse(st);
    co_return st;
  }
  auto hello = co_await read_envelope();
  if (!hello) {
    disarm_deadline();
    close();
    co_return hello.error();
  }
  st = check_hello(*hello, me, peer_.role);
  if (!st) {
    co_await refuse(st);
    co_return st;
  }
  peer_hello_ = hello->hello();
  auto env = envelope(me.federation, current_round);
  auto* w = env.mutable_welcome();
  w->set_protocol_version(proto::kProtocolVersion);
  w->set_role(me.role);
  for (const auto& c : me.capabilities) w->add_capabilities(c);
  w->set_peer_identity(peer_.name);
  w->set_current_round(current_round);
  try {
    co_await write_frame_now(env);
  } catch (const std::exception& e) {
    disarm_deadline();
    close();
    co_return proto::error(wire::INTERNAL, std::string("cannot send Welcome: ") + e.what());
  }
  disarm_deadline();
  co_return proto::Status();
}

awaitable<proto::Status> Channel::connect(const AllowList& upstreams, const LocalInfo& me) {
  auto self = shared_from_this();
  federation_ = me.federation;
  arm_deadline(opts_.handshake_timeout);
  try {
    co_await stream_.handshake(/*server=*/false);
  } catch (const boost::system::system_error& e) {
    disarm_deadline();
    close();
    co_return proto::error(wire::NOT_ALLOWED, handshake_failure(e));
  }
  auto id = peer_identity(stream_.native_handle());
  if (!id) {
    disarm_deadline();
    close();
    co_return id.error();
  }
  peer_ = *id;
  warn_if_expiring();
  if (!upstreams.allows_role(peer_.role)) {
    disarm_deadline();
    close();
    // Said as what to do: the likely slip is the address of another participant (an edge's port
    // given to `xsilo status --server`).
    const auto a_role = [](wire::Role role) {
      const std::string name = role_name(role);
      return (name.starts_with('e') || name.starts_with('a') ? "an " : "a ") + name;
    };
    std::string wanted;
    for (const auto& [role, names] : upstreams.names()) wanted += (wanted.empty() ? "" : " or ") + a_role(role);
    const bool server_only = upstreams.names().size() == 1 && upstreams.allows_role(wire::SERVER);
    co_return proto::error(wire::NOT_ALLOWED, remote_ + " is " + peer_.str() + ": this is " + a_role(peer_.role) +
                                                  "; give " +
                                                  (server_only ? "the server's address" : "the address of " + wanted));
  }
  if (auto st = upstreams.check(peer_); !st) {
    disarm_deadline();
    close();
    co_return proto::error(wire::NOT_ALLOWED, remote_ + ": " + st.error().message() + " (this side's trust list)");
  }
  auto env = envelope(me.federation, 0);
  auto* h = env.mutable_hello();
  h->set_protocol_version(proto::kProtocolVersion);
  h->set_role(me.role);
  for (const auto& c : me.capabilities) h->add_capabilities(c);
  h->set_software("xsilo");
  try {
    co_await write_frame_now(env);
  } catch (const std::exception& e) {
    disarm_deadline();
    close();
    co_return proto::error(wire::INTERNAL, std::string("cannot send Hello: ") + e.what());
  }
  auto reply = co_await read_envelope();
  disarm_deadline();
  if (!reply) {
    close();
    co_return reply.error();
  }
  if (reply->has_error()) {
    close();
    co_return proto::error(reply->error().code(),
                           peer_.str() + " refused the connection: " + reply->error().message());
  }
  if (!reply->has_welcome()) {
    close();
    co_return proto::error(wire::UNEXPECTED, "expected Welcome, got " + proto::body_name(*reply));
  }
  welcome_ = reply->welcome();
  co_return proto::Status();
}

bool Channel::elsewhere() {
  // target() points into the executor it is called on: hold that one while the pointer is used.
  // The constructor made sure it is an io_context's.
  const auto ex = executor();
  const auto* io = ex.target<asio::io_context::executor_type>();
  return !io->running_in_this_thread();
}

void Channel::post(std::function<void(Channel&)> call, std::size_t bytes) {
  posted_bytes_ += bytes;
  asio::post(executor(), [self = shared_from_this(), call = std::move(call), bytes] {
    self->posted_bytes_ -= bytes;
    call(*self);
  });
}

void Channel::start() {
  if (elsewhere()) return post([](Channel& c) { c.start(); });
  if (started_) return;
  started_ = true;
  idle_.heard(Clock::now());
  auto self = shared_from_this();
  asio::co_spawn(executor(), [self] { return self->writer(); }, asio::detached);
  if (opts_.heartbeat_interval.count() > 0) {
    asio::co_spawn(executor(), [self] { return self->heartbeat(); }, asio::detached);
  }
  if (opts_.idle_timeout.count() > 0) {
    asio::co_spawn(executor(), [self] { return self->watchdog(); }, asio::detached);
  }
}

awaitable<proto::Result<std::span<const std::uint8_t>>> Channel::read_frame() {
  std::array<std::uint8_t, proto::kFrameHeaderBytes> header{};
  std::size_t size = 0;
  try {
    co_await stream_.read_exact(header);
    auto len = proto::decode_frame_length(header, opts_.max_frame_bytes);
    if (!len) co_return len.error();
    size = *len;
    // One buffer per connection, grown to the largest frame seen and reused: no allocation,
    // zero-filling or page faults per frame. A message still holding it (a view of its last
    // frame) keeps it; this read takes a new one.
    if (!read_buffer_ || read_buffer_.use_count() > 1) read_buffer_ = std::make_shared<std::vector<std::uint8_t>>();
    if (read_buffer_->size() < size) read_buffer_->resize(size);
    co_await stream_.read_exact({read_buffer_->data(), size});
  } catch (const boost::system::system_error& e) {
    // The peer is gone: close, which wakes the writer and the timers so that they end and
    // the socket is released. Only marking the channel closed left the writer asleep for good,
    // holding the channel and its descriptor (the kill storm found the server's and the edges'
    // sockets of dead peers piling up in CLOSE-WAIT, about one per kill).
    close();
    co_return proto::error(wire::ERROR_UNSPECIFIED,
                           "connection to " + remote_ + " closed: " + e.code().message());
  }
  bytes_received_ += proto::kFrameHeaderBytes + size;
  idle_.heard(Clock::now());
  if (stream_.has_pending_output()) wake_.cancel();  // TLS wants to answer (key update)
  co_return std::span<const std::uint8_t>(read_buffer_->data(), size);
}

// A large buffer is kept while large frames keep coming (an upload's chunks: giving it back
// after each made every chunk allocate, zero-fill and fault in its pages again) and given
// back at the first small frame after them (a heartbeat comes to an idle connection within
// its interval), so an idle connection does not hold megabytes. (A message still viewing it
// holds it until it goes.)
void Channel::trim_read_buffer(std::size_t last_frame) {
  if (read_buffer_ && read_buffer_->size() > (256u << 10) && last_frame < read_buffer_->size() / 4) read_buffer_.reset();
}

awaitable<proto::Result<wire::Envelope>> Channel::read_envelope() {
  auto frame = co_await read_frame();
  if (!frame) co_return frame.error();
  auto env = proto::decode_envelope(*frame);
  trim_read_buffer(frame->size());
  co_return env;
}

namespace {
const wire::Envelope& envelope_of(const wire::Envelope& e) { return e; }
const wire::Envelope& envelope_of(const proto::Message& m) { return m.env; }
}  // namespace

template <class T, class Read>
awaitable<proto::Result<T>> Channel::read_next(Read read_one) {
  auto self = shared_from_this();
  for (;;) {
    if (!open_) co_return proto::error(wire::ERROR_UNSPECIFIED, "connection closed");
    proto::Result<T> msg = co_await read_one();
    if (!msg) co_return msg;
    const wire::Envelope& env = envelope_of(*msg);
    if (env.has_heartbeat()) continue;
    if (env.federation() != federation_) {
      co_return proto::error(wire::WRONG_FEDERATION, "message for federation \"" + env.federation() + "\"");
    }
    co_return msg;
  }
}

awaitable<proto::Result<wire::Envelope>> Channel::read() {
  return read_next<wire::Envelope>([this] { return read_envelope(); });
}

awaitable<proto::Result<proto::Message>> Channel::read_message() {
  return read_next<proto::Message>([this]() -> awaitable<proto::Result<proto::Message>> {
    auto frame = co_await read_frame();
    if (!frame) co_return frame.error();
    auto msg = proto::decode_message(*frame, read_buffer_);
    trim_read_buffer(frame->size());
    co_return msg;
  });
}

bool Channel::send(wire::Envelope env) {
  if (!open_) return false;
  if (elsewhere()) {
    // Encoded on the channel's thread. (Held in a shared_ptr: a std::function must be copyable.)
    const std::size_t bytes = env.ByteSizeLong() + proto::kFrameHeaderBytes;
    post([e = std::make_shared<wire::Envelope>(std::move(env))](Channel& c) { c.send(std::move(*e)); }, bytes);
    return open_;
  }
  if (closing_) return false;
  auto frame = proto::encode_frame(env, opts_.max_frame_bytes);
  if (!frame) {
    spdlog::error("not sending {} to {}: {}", proto::body_name(env), peer_.str(),
                  frame.error().message());
    return false;
  }
  const std::size_t bytes = frame->size();
  return enqueue(Item(std::move(*frame)), bytes);
}

bool Channel::send_frame(std::shared_ptr<const std::string> frame) {
  if (!open_ || !frame) return false;
  if (elsewhere()) {
    post([frame](Channel& c) { c.send_frame(frame); }, frame->size());
    return open_;
  }
  if (closing_) return false;
  const std::size_t bytes = frame->size();
  return enqueue(Item(std::move(frame)), bytes);
}

bool Channel::enqueue(Item item, std::size_t bytes) {
  queued_bytes_ += bytes;
  // What other threads sent and is still on its way here counts too.
  if (queued_bytes() > opts_.max_queued_bytes) {
    spdlog::warn("{} is not reading: {} bytes queued; closing the connection", peer_.str(),
                 queued_bytes());
    close();
    return false;
  }
  queue_.push_back(std::move(item));
  wake_.cancel();
  return true;
}

std::optional<proto::SplitFrame> Channel::take_front(std::shared_ptr<const std::string>& keep) {
  Item& front = queue_.front();
  proto::SplitFrame frame;
  if (auto* source = std::get_if<Source>(&front)) {
    auto next = (*source)();
    if (!next) queue_.pop_front();
    return next;
  }
  if (auto* shared = std::get_if<std::shared_ptr<const std::string>>(&front)) {
    keep = std::move(*shared);
    frame.tail = {reinterpret_cast<const std::uint8_t*>(keep->data()), keep->size()};
  } else {
    frame.head = std::move(std::get<std::string>(front));
  }
  queue_.pop_front();
  queued_bytes_ -= std::min(queued_bytes_.load(), frame.size());
  return frame;
}

bool Channel::send_stream(Source next) {
  if (!open_) return false;
  if (elsewhere()) {
    post([next](Channel& c) { c.send_stream(next); });
    return open_;
  }
  if (closing_) return false;
  queue_.push_back(Item(std::move(next)));
  wake_.cancel();
  return true;
}

void Channel::close_with_error(wire::ErrorCode code, const std::string& message) {
  if (!open_) return;
  if (elsewhere()) return post([code, message](Channel& c) { c.close_with_error(code, message); });
  if (closing_) return;
  auto env = envelope(federation_, 0);
  env.mutable_error()->set_code(code);
  env.mutable_error()->set_message(message);
  queue_.clear();
  queued_bytes_ = 0;
  send(std::move(env));
  closing_ = true;
  if (!started_) close();
}

void Channel::close() {
  if (elsewhere()) return post([](Channel& c) { c.close(); });
  if (!open_ && !stream_.socket().is_open()) return;
  open_ = false;
  queue_.clear();
  queued_bytes_ = 0;
  wake_.cancel();
  heartbeat_timer_.cancel();
  watchdog_timer_.cancel();
  deadline_.cancel();
  stream_.close();
}

awaitable<void> Channel::writer() {
  auto self = shared_from_this();
  constexpr auto kTrimAfter = std::chrono::milliseconds(50);
  bool trimmed = true;  // nothing to give back yet
  try {
    while (open_) {
      if (queue_.empty()) {
        if (stream_.has_pending_output()) {
          co_await stream_.flush();
          continue;
        }
        if (closing_) break;
        // Idle: after 50 ms with nothing to send, give back what large frames grew (a gap
        // between the chunks of a model is not idle), then sleep until woken.
        wake_.expires_at(trimmed ? Clock::time_point::max() : Clock::now() + kTrimAfter);
        boost::system::error_code ec;
        co_await wake_.async_wait(asio::redirect_error(use_awaitable, ec));
        if (!ec && !trimmed && queue_.empty()) {
          stream_.trim();
          trimmed = true;
        }
        continue;
      }
      trimmed = false;
      std::shared_ptr<const std::string> shared;  // kept alive until written
      auto next = take_front(shared);
      if (!next) continue;
      proto::SplitFrame frame = std::move(*next);
      co_await stream_.write({reinterpret_cast<const std::uint8_t*>(frame.head.data()), frame.head.size()},
                             frame.tail);
      bytes_sent_ += frame.size();
    }
  } catch (const std::exception& e) {
    if (open_) spdlog::debug("writer to {} stopped: {}", peer_.str(), e.what());
  }
  close();
}

awaitable<void> Channel::heartbeat() {
  auto self = shared_from_this();
  while (open_) {
    heartbeat_timer_.expires_after(opts_.heartbeat_interval);
    boost::system::error_code ec;
    co_await heartbeat_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (ec || !open_) break;
    if (queue_.empty()) {
      auto env = envelope(federation_, 0);
      env.mutable_heartbeat()->set_sent_unix_ms(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count()));
      send(std::move(env));
    }
  }
}

awaitable<void> Channel::watchdog() {
  auto self = shared_from_this();
  while (open_) {
    watchdog_timer_.expires_after(idle_.tick());
    boost::system::error_code ec;
    co_await watchdog_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (ec || !open_) break;
    if (idle_.silent_too_long(Clock::now())) {
      spdlog::warn("{} ({}) sent nothing for {} ms; closing the connection", peer_.str(), remote_,
                   opts_.idle_timeout.count());
      close();
    }
    if (open_ && idle_.write_stalled(stream_.writing_since(), Clock::now())) {
      spdlog::warn("{} ({}) took none of what we sent for {} ms (it stopped reading); closing the connection",
                   peer_.str(), remote_, opts_.idle_timeout.count());
      close();
    }
  }
}

}  // namespace xsilo::transport
