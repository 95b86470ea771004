#include "transport/metrics_endpoint.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>

#include "common/build_info.h"
#include "common/fs.h"
#include "common/process.h"
#include "transport/config.h"

namespace xsilo::transport {

namespace {
constexpr std::size_t kMaxRequestHead = 8192;
constexpr std::size_t kMaxScrapesAtOnce = 8;
// A scraper sends its request at once; a client that has not within this is cut off.
constexpr auto kRequestTimeout = std::chrono::seconds(2);

std::string response(int code, std::string_view reason, std::string_view content_type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + std::string(reason) + "\r\nContent-Type: " +
         std::string(content_type) + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}
}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto a = asio::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

MetricsOptions parse_metrics(const ConfigNode& parent) {
  MetricsOptions o;
  if (!parent.has("metrics")) return o;
  const ConfigNode node = parent.child("metrics");
  if (node.has("listen")) o.listen = parse_endpoint_key(node, "listen");
  o.allow_remote = node.boolean("allow_remote", false);
  o.port_file = node.path("port_file", "");
  if (o.listen && !o.allow_remote && !is_loopback_host(o.listen->host)) {
    node.fail("listen", "is " + o.listen->str() +
                            ", not a loopback address; metrics tell whoever reads them who takes part and when: set "
                            "\"allow_remote\": true to serve them beyond this host");
  }
  if (!o.listen) node.fail("listen", "is required when the metrics section is given (\"127.0.0.1:9464\", say)");
  node.finish();
  return o;
}

nlohmann::json to_json(const MetricsOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  if (o.listen) j["listen"] = o.listen->str();
  if (o.allow_remote) j["allow_remote"] = true;
  if (!o.port_file.empty()) j["port_file"] = std::filesystem::absolute(o.port_file).string();
  return j;
}

MetricsEndpoint::MetricsEndpoint(asio::any_io_executor ex, const Endpoint& at, const MetricRegistry& registry,
                                 std::function<void()> refresh)
    : ex_(ex), acceptor_(ex), registry_(registry), refresh_(std::move(refresh)),
      slots_(kMaxScrapesAtOnce, kRequestTimeout) {
  tcp::resolver resolver(ex);
  const tcp::endpoint ep = resolver.resolve(at.host, std::to_string(at.port)).begin()->endpoint();
  acceptor_.open(ep.protocol());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  acceptor_.bind(ep);
  acceptor_.listen();
  port_ = acceptor_.local_endpoint().port();
}

MetricsEndpoint::~MetricsEndpoint() { stop(); }

void MetricsEndpoint::start() { asio::co_spawn(ex_, accept_loop(), asio::detached); }

void MetricsEndpoint::stop() {
  *alive_ = false;
  boost::system::error_code ec;
  acceptor_.close(ec);
}

awaitable<void> MetricsEndpoint::accept_loop() {
  auto alive = alive_;
  while (*alive && acceptor_.is_open()) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (!*alive || ec == asio::error::operation_aborted) break;
    if (ec) {
      // Out of descriptors, most likely: scrapes can wait, the federation cannot.
      asio::steady_timer pause(ex_, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    // Every slot taken: the connection that has waited longest without sending its request
    // goes, so that a few silent connections cannot keep a scraper out (review N6); a scraper
    // sends at once and is done in milliseconds. Every slot answering: the newcomer goes.
    auto shared = std::make_shared<tcp::socket>(std::move(socket));
    const ScrapeSlots::Id id = next_id_++;
    const auto admission = slots_.admit(id, std::chrono::steady_clock::now());
    if (admission.evict) {
      if (auto oldest = sockets_[*admission.evict].lock()) oldest->close(ec);
      sockets_.erase(*admission.evict);
    }
    if (!admission.admitted) {
      shared->close(ec);
      continue;
    }
    sockets_[id] = shared;
    asio::co_spawn(ex_, serve(std::move(shared), id, admission.deadline), asio::detached);
  }
}

awaitable<void> MetricsEndpoint::serve(std::shared_ptr<tcp::socket> socket, ScrapeSlots::Id id,
                                       std::chrono::steady_clock::time_point deadline) {
  auto alive = alive_;
  // The slot is given back however this ends (evicted, timed out, answered), unless the
  // endpoint is gone.
  struct Done {
    MetricsEndpoint* self;
    std::shared_ptr<bool> alive;
    ScrapeSlots::Id id;
    ~Done() {
      if (!*alive) return;
      self->slots_.done(id);
      self->sockets_.erase(id);
    }
  } done{this, alive, id};
  // A client that sends nothing, or too slowly, is cut off at its deadline. The socket is
  // shared with the timeout's handler, which may run after this coroutine has ended.
  asio::steady_timer timeout(ex_, deadline);
  timeout.async_wait([socket](boost::system::error_code ec) {
    if (!ec) socket->close(ec);
  });
  std::string head;
  boost::system::error_code ec;
  co_await asio::async_read_until(*socket, asio::dynamic_buffer(head, kMaxRequestHead), "\r\n\r\n",
                                  asio::redirect_error(asio::use_awaitable, ec));
  if (!*alive) co_return;
  slots_.request_read(id);
  std::string reply;
  if (ec) {
    if (!socket->is_open()) co_return;  // timed out
    reply = ec == asio::error::not_found
                ? response(431, "Request Header Fields Too Large", "text/plain", "request head too large\n")
                : response(400, "Bad Request", "text/plain", "bad request\n");
  } else {
    const auto line = head.substr(0, head.find("\r\n"));
    const auto sp1 = line.find(' '), sp2 = line.rfind(' ');
    const std::string method = line.substr(0, sp1);
    const std::string target = sp1 == std::string::npos || sp2 <= sp1 ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string path = target.substr(0, target.find('?'));
    if (sp1 == std::string::npos || sp2 <= sp1 || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      reply = response(400, "Bad Request", "text/plain", "bad request\n");
    } else if (method != "GET" && method != "HEAD") {
      reply = response(405, "Method Not Allowed", "text/plain", "only GET\n");
    } else if (path != "/metrics") {
      reply = response(404, "Not Found", "text/plain", "the metrics are at /metrics\n");
    } else {
      if (refresh_) refresh_();
      reply = response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry_.text());
      if (method == "HEAD") reply.resize(reply.find("\r\n\r\n") + 4);
    }
  }
  co_await asio::async_write(*socket, asio::buffer(reply), asio::redirect_error(asio::use_awaitable, ec));
  timeout.cancel();
  socket->shutdown(tcp::socket::shutdown_both, ec);
  socket->close(ec);
}

std::unique_ptr<MetricsEndpoint> start_metrics(asio::any_io_executor ex, const MetricsOptions& o,
                                               const MetricRegistry& registry, std::function<void()> refresh) {
  if (!o.listen) return nullptr;
  auto m = std::make_unique<MetricsEndpoint>(ex, *o.listen, registry, std::move(refresh));
  m->start();
  spdlog::info("metrics at http://{}:{}/metrics", o.listen->host, m->port());
  if (!o.port_file.empty()) atomic_write_file(o.port_file, std::to_string(m->port()) + "\n");
  return m;
}

void declare_daemon_metrics(MetricRegistry& m, const std::string& role, const TlsFiles& tls) {
  using T = MetricRegistry::Type;
  m.declare("xsilo_build_info", T::Gauge, "Always 1; the labels say which xsilo runs in which role", true);
  m.set("xsilo_build_info", 1, {{"version", build_version()}, {"role", role}});
  m.declare("xsilo_certificate_expiry_timestamp_seconds", T::Gauge,
            "When this daemon's own certificate expires (seconds since the epoch)");
  try {
    const auto id = own_identity(tls);
    m.set("xsilo_certificate_expiry_timestamp_seconds",
          static_cast<double>(std::chrono::system_clock::to_time_t(id.not_after)));
  } catch (const std::exception&) {
    // The daemon reports an unreadable certificate itself when it loads its TLS files.
  }
  m.declare("xsilo_received_bytes_total", T::Counter, "Bytes received on established connections (TLS payload)");
  m.declare("xsilo_sent_bytes_total", T::Counter, "Bytes sent on established connections (TLS payload)");
  m.declare("xsilo_connections_refused_total", T::Counter,
            "Connections refused or lost before they were established, by reason", true);
  m.declare("process_resident_memory_bytes", T::Gauge, "Resident memory of this daemon (VmRSS)");
  m.declare("process_open_fds", T::Gauge, "Descriptors this daemon has open (sockets, files)");
}

void set_connection_metrics(MetricRegistry& m, std::uint64_t bytes_in, std::uint64_t bytes_out,
                            const std::map<std::string, std::uint64_t>& refused) {
  m.set("xsilo_received_bytes_total", static_cast<double>(bytes_in));
  m.set("xsilo_sent_bytes_total", static_cast<double>(bytes_out));
  for (const auto& [reason, n] : refused) m.set("xsilo_connections_refused_total", static_cast<double>(n), {{"reason", reason}});
  if (const auto r = process_resources()) {
    m.set("process_resident_memory_bytes", static_cast<double>(r->rss_bytes));
    m.set("process_open_fds", static_cast<double>(r->open_descriptors));
  }
}

}  // namespace xsilo::transport
