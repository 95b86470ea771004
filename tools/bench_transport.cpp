// xsilo bench transport: one Channel streaming TensorChunks to another over TLS 1.3 on
// loopback, each side on its own thread, against the TLS loopback bound of DESIGN §11.
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tools/bench.h"
#include "transport/dialer.h"
#include "transport/listener.h"
#include "transport/pki.h"
#include "protocol/tensor_stream.h"

namespace xsilo::tools {

namespace asio = boost::asio;

int bench_transport(std::size_t mib, std::size_t chunk_bytes, bool json) {
  const auto dir = std::filesystem::temp_directory_path() / ("xsilo-bench-tls-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  transport::pki_init(dir, "bench");
  transport::pki_issue(dir, {wire::SERVER, "server"});
  transport::pki_issue(dir, {wire::SILO, "silo"});
  auto server_ctx = transport::make_tls_context(transport::TlsFiles::from_kit(dir / "kits/server"));
  auto client_ctx = transport::make_tls_context(transport::TlsFiles::from_kit(dir / "kits/silo"));
  transport::ChannelOptions opts;
  opts.max_frame_bytes = chunk_bytes + 65536;
  opts.max_queued_bytes = std::size_t{1} << 32;

  auto model = std::make_shared<Model>();
  model->add("weights", {mib * 1024 * 1024 / sizeof(float)});
  for (std::size_t i = 0; i < model->size(); ++i) model->flat()[i] = static_cast<float>(i % 1000);

  asio::io_context server_io, client_io;
  transport::AllowList allow;
  allow.allow(wire::SILO, {"*"});
  std::promise<void> sent;
  transport::Listener listener(server_io.get_executor(), server_ctx, {"127.0.0.1", 0}, opts, allow,
                               {"bench", wire::SERVER, {}},
                               [&](std::shared_ptr<transport::Channel> ch) {
                                 auto src = std::make_shared<protocol::ChunkSource>(
                                     model, model->flat(), model->tensors(), "bench", 1, chunk_bytes);
                                 ch->send_stream([src, max = opts.max_frame_bytes] { return src->next_frame(max); });
                                 auto end = transport::envelope("bench", 1);
                                 end.mutable_update_end();
                                 ch->send(end);
                               });
  listener.start();
  std::thread server_thread([&] { server_io.run(); });

  Model received = model->zeros_like();
  double seconds = 0;
  auto fut = asio::co_spawn(
      client_io,
      [&]() -> asio::awaitable<void> {
        const transport::AllowList roles{wire::SERVER};
        const transport::LocalInfo me{"bench", wire::SILO, {}};
        const Endpoint to{"127.0.0.1", listener.port()};
        auto ch = co_await transport::dial_once(client_io.get_executor(), client_ctx, to, roles, me, opts);
        if (!ch) throw std::runtime_error(ch.error().message());
        protocol::TensorReceiver rx;
        rx.reset(received.flat(), received.tensors(), false);
        const auto t0 = std::chrono::steady_clock::now();
        for (;;) {
          auto env = co_await (*ch)->read();
          if (!env) throw std::runtime_error(env.error().message());
          if (env->has_update_end()) break;
          auto st = rx.add(env->tensor_chunk());
          if (!st) throw std::runtime_error(st.error().message());
        }
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        (*ch)->close();
      },
      asio::use_future);
  client_io.run();
  fut.get();
  server_io.stop();
  server_thread.join();
  std::filesystem::remove_all(dir);
  const double gbps = static_cast<double>(model->bytes()) / seconds / 1e9;
  if (json) {
    std::cout << nlohmann::json{{"bench", "transport"}, {"bytes", model->bytes()}, {"chunk_bytes", chunk_bytes},
                                {"seconds", seconds}, {"GBps", gbps}, {"tls_loopback_limit_GBps", kTlsLoopbackGBps}}
                     .dump()
              << std::endl;
  } else {
    print_table({"payload MiB", "chunk KiB", "seconds", "GB/s", "of TLS limit"},
                {{std::to_string(mib), std::to_string(chunk_bytes / 1024), fmt(seconds, 3), fmt(gbps, 3),
                  fmt(100 * gbps / kTlsLoopbackGBps, 0) + "%"}});
  }
  return 0;
}

}  // namespace xsilo::tools
