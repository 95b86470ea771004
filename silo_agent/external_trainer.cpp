#include "silo_agent/external_trainer.h"

#include "silo_agent/trainer_protocol.h"

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/fs.h"
#include "common/safetensors.h"

namespace xsilo::agent {

using json = nlohmann::json;

namespace {

std::uint16_t free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// One framed control message; false when the trainer's end is closed.
bool send_message(int fd, const json& message) {
  const std::string bytes = trainer_protocol::frame(message);
  return write_all(fd, bytes.data(), bytes.size());
}

// A name made safe for a file name: letters, digits, '.', '_' and '-' kept, the rest '_'.
std::string file_safe(const std::string& name) {
  std::string out;
  for (char c : name) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return out.empty() ? "silo" : out;
}

// Removes a file when it goes out of scope (whatever way the task ends).
struct RemoveOnExit {
  std::filesystem::path path;
  ~RemoveOnExit() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove(path, ec);
  }
};

// Exchange folders of this silo's agents that are gone (their pid no longer runs): a crash
// leaves one in /dev/shm, which is memory.
void remove_stale_exchanges(const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dash = name.find('-', prefix.size());
    const std::string pid = name.substr(prefix.size(), dash == std::string::npos ? std::string::npos : dash - prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid()) {
      std::filesystem::remove_all(e.path(), ec);
    }
  }
}

// Why `program` (trainer.command[0]) cannot be run, as exec would find it: "not found on PATH",
// "/venv/bin/python: No such file or directory", ...; empty when it looks runnable.
std::string why_not_runnable(const std::string& program) {
  auto check = [](const std::string& path) -> std::string {
    if (::access(path.c_str(), X_OK) == 0 && !std::filesystem::is_directory(path)) return "";
    const int err = errno;
    return path + ": " + (std::filesystem::is_directory(path) ? std::string("is a folder") : std::strerror(err));
  };
  if (program.find('/') != std::string::npos) return check(program);
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t at = 0; at <= path.size();) {
    const auto end = std::min(path.find(':', at), path.size());
    const std::string dir = path.substr(at, end - at);
    if (check((dir.empty() ? "." : dir) + "/" + program).empty()) return "";
    at = end + 1;
  }
  return program + ": not found on PATH";
}

}  // namespace

// One running copy of the trainer's command and the agent's end of its socket pair.
struct ExternalTrainer::Copy {
  int rank = 0;
  int fd = -1;
  std::unique_ptr<Process> process;
  trainer_protocol::Reader reader;  // bytes received, not yet a whole message
  std::filesystem::path log;
  ~Copy() {
    if (fd >= 0) ::close(fd);
  }
};

ExternalTrainer::ExternalTrainer(const AgentConfig& cfg) : cfg_(cfg), dir_(cfg.state_dir / "trainer") {
  std::filesystem::create_directories(dir_);
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace);
}

ExternalTrainer::~ExternalTrainer() {
  for (auto& c : copies_) {
    send_message(c->fd, {{"type", "task"}, {"id", ++next_id_}, {"kind", "shutdown"}});
  }
  stop_copies(kShutdownGrace, /*log_kills=*/true);
  std::error_code ec;
  if (!exchange_.empty()) std::filesystem::remove_all(exchange_, ec);
}

std::string ExternalTrainer::logs() const {
  std::string out;
  for (const auto& c : copies_) {
    const std::string tail = log_tail(c->log, 10);
    if (!tail.empty()) out += "\n  rank " + std::to_string(c->rank) + " (" + c->log.string() + ") ends:\n" + tail;
  }
  return out;
}

void ExternalTrainer::fail(wire::FailureReason reason, const std::string& why, bool stop, bool fatal_now) {
  ++consecutive_failures_;
  const bool fatal = fatal_now || consecutive_failures_ >= cfg_.external.max_failures;
  std::string msg = "external trainer: " + why;
  std::string tail;
  if (stop) {
    tail = logs();
    stop_copies(std::chrono::milliseconds(2000));
  }
  clear_exchange();  // whatever the copies left there (a half-written update, say)
  if (fatal_now) {
    // Said in `why`: nothing a restart changes.
  } else if (fatal) {
    msg += " (" + std::to_string(consecutive_failures_) + " failed rounds in a row, the limit trainer.max_failures)";
  } else if (stop && !one_shot_) {
    msg += "; it is started again for the next round";
  } else {
    msg += "; the trainer keeps running (its state is kept) and gets the next round's task";
  }
  throw TrainerError(reason, msg + tail, fatal);
}

void ExternalTrainer::clear_exchange() {
  std::error_code ec;
  if (exchange_.empty()) return;
  for (const auto& e : std::filesystem::directory_iterator(exchange_, ec)) std::filesystem::remove_all(e.path(), ec);
}

template <class F>
auto ExternalTrainer::guarded(F&& f) {
  try {
    return f();
  } catch (const TrainerError&) {
    throw;
  } catch (const json::exception& e) {
    fail(wire::TRAINER_PROTOCOL_ERROR, std::string("the trainer's message has the wrong shape: ") + e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    fail(wire::AGENT_INTERNAL, std::string("exchange folder: ") + e.what());
  }
}

void ExternalTrainer::stop_copies(std::chrono::milliseconds grace, bool log_kills) {
  const auto end = Clock::now() + grace;
  for (auto& c : copies_) {
    if (c->process) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (!c->process->wait(std::max(left, std::chrono::milliseconds(0)))) {
        if (log_kills) {
          spdlog::warn("external trainer: rank {} did not exit within {} s of the shutdown task; stopping it (SIGTERM, "
                       "then SIGKILL): code after its federated loop may not have run",
                       c->rank, std::chrono::duration_cast<std::chrono::seconds>(grace).count());
        }
        c->process->stop(std::chrono::milliseconds(1000));
      }
    }
  }
  copies_.clear();
}

// Waits before trying again after failures (restart_backoff: 1 s, 2 s, 4 s, ... at most a
// minute); throws when the agent stops meanwhile.
void ExternalTrainer::back_off() {
  const auto wait = restart_backoff(consecutive_failures_);
  spdlog::info("external trainer: restarting in {} s", wait.count());
  for (auto end = Clock::now() + wait; Clock::now() < end && !cancelled_;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (cancelled_) throw TrainerError(wire::AGENT_STOPPING, "external trainer: the agent is stopping");
}

// The private folder the copies exchange tensor files in: in memory when /dev/shm has room for
// three copies of the model (global, update, slack), else in the state folder.
void ExternalTrainer::open_exchange(const std::string& silo, std::size_t model_bytes) {
  struct statvfs fs {};
  const std::uint64_t need = 3 * static_cast<std::uint64_t>(model_bytes) + (64u << 20);
  std::string tmpl;
  if (::statvfs("/dev/shm", &fs) == 0 && static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize >= need) {
    const std::string prefix = "xsilo-" + file_safe(silo) + "-";
    remove_stale_exchanges(prefix);
    tmpl = "/dev/shm/" + prefix + std::to_string(::getpid()) + "-XXXXXX";
    exchange_in_shm_ = true;
  } else {
    tmpl = (dir_ / "exchange-XXXXXX").string();
  }
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) {
    fail(wire::AGENT_INTERNAL, "cannot create a private exchange folder " + tmpl + ": " + std::strerror(errno));
  }
  exchange_ = buf.data();  // mkdtemp makes it 0700
}

// Starts copy `rank` of `workers` with the torchrun environment and a socket to talk to it on.
void ExternalTrainer::launch_copy(const std::string& silo, int rank, int workers, const std::string& port) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    fail(wire::AGENT_INTERNAL, std::string("socketpair: ") + std::strerror(errno));
  }
  auto c = std::make_unique<Copy>();
  c->rank = rank;
  c->fd = sv[0];
  c->log = dir_ / ("rank-" + std::to_string(rank) + ".log");
  ProcessOptions opts;
  opts.cwd = cfg_.external.cwd;
  opts.keep_fds = {sv[1]};
  // Started on the agent's worker thread, which ends before the agent sends the shutdown task:
  // a copy killed with that thread would never run the script's code after its loop. A copy
  // still learns of an agent that dies: its channel closes (the SDK raises ConnectionError).
  opts.die_with_parent_thread = false;
  opts.env = {{"XSILO_TRAINER_FD", std::to_string(sv[1])},
              {"XSILO_SILO", silo},
              {"XSILO_EXCHANGE_DIR", exchange_.string()},
              {"RANK", std::to_string(rank)},
              {"LOCAL_RANK", std::to_string(rank)},
              {"WORLD_SIZE", std::to_string(workers)},
              {"LOCAL_WORLD_SIZE", std::to_string(workers)},
              {"MASTER_ADDR", "127.0.0.1"},
              {"MASTER_PORT", port},
              {"PYTHONUNBUFFERED", "1"}};
  if (!cfg_.train_data.empty()) opts.env.emplace_back("XSILO_TRAIN_DATA", std::filesystem::absolute(cfg_.train_data).string());
  if (!cfg_.test_data.empty()) opts.env.emplace_back("XSILO_TEST_DATA", std::filesystem::absolute(cfg_.test_data).string());
  for (const auto& kv : cfg_.external.env) opts.env.push_back(kv);
  try {
    c->process = std::make_unique<Process>(cfg_.external.command, c->log, opts);
  } catch (const std::exception& e) {
    ::close(sv[1]);
    copies_.push_back(std::move(c));
    fail(wire::TRAINER_DID_NOT_START, std::string("cannot start ") + cfg_.external.command[0] + ": " + e.what());
  }
  ::close(sv[1]);
  copies_.push_back(std::move(c));
}

// Every copy says hello within the start-up budget (its own: the first task's time starts
// after it) and is welcomed; a version we do not speak is refused.
void ExternalTrainer::greet_copies(const std::string& silo, Clock::time_point since) {
  const TrainerWait hello_wait = startup_wait(cfg_.external.startup, since);
  for (auto& c : copies_) {
    const json hello = receive(*c, hello_wait);
    std::int64_t protocol = 0;
    if (const auto st = trainer_protocol::check_hello(hello, protocol); !st) {
      const std::string& why = st.error().message();
      if (hello.contains("type") && hello["type"] == "hello") {  // another protocol: tell the trainer too
        send_message(c->fd, {{"type", "error"},
                             {"message", "this agent speaks trainer protocol " + std::to_string(kTrainerProtocol) +
                                             ", the trainer " + std::to_string(protocol)}});
        fail(wire::TRAINER_DID_NOT_START, why);
      }
      fail(wire::TRAINER_PROTOCOL_ERROR, "rank " + std::to_string(c->rank) + " " + why);
    }
    json welcome = {{"type", "welcome"},
                    {"protocol", kTrainerProtocol},
                    {"agent", "0.1.0"},
                    {"silo", silo},
                    {"exchange_dir", exchange_.string()}};
    if (!cfg_.feature_stats.empty()) welcome["feature_stats"] = cfg_.feature_stats.to_json();
    if (!send_message(c->fd, welcome)) {
      fail(wire::TRAINER_EXITED, "rank " + std::to_string(c->rank) + " closed its channel after hello");
    }
  }
}

void ExternalTrainer::start(const TrainTask& task, std::size_t model_bytes) {
  if (!copies_.empty()) return;
  if (consecutive_failures_ > 0) back_off();
  if (exchange_.empty()) open_exchange(task.silo, model_bytes);
  clear_exchange();  // files of copies that are gone
  const int workers = std::max(1, cfg_.local.workers);
  const std::string port = std::to_string(free_port());
  for (int rank = 0; rank < workers; ++rank) launch_copy(task.silo, rank, workers, port);
  const auto since = Clock::now();
  greet_copies(task.silo, since);
  spdlog::info("external trainer: {} cop{} of `{}` started in {} (exchange folder {}{})", workers,
               workers == 1 ? "y" : "ies", cfg_.external.command[0], seconds_text(Clock::now() - since),
               exchange_.string(), exchange_in_shm_ ? ", in memory" : "");
}

// Exit code 127 during start-up: the command itself could not be run (exec failed, or the
// working folder could not be entered), not the script.
void ExternalTrainer::not_started(Copy& c) {
  const std::string& program = cfg_.external.command[0];
  std::string why = why_not_runnable(program);
  const std::string log = log_tail(c.log, 5);
  if (why.empty()) {
    why = log.find("working folder") != std::string::npos
              ? "cannot change to trainer.cwd " + cfg_.external.cwd.string()
              : program + " exited with code 127 (a shell's \"command not found\")";
  }
  fail(wire::TRAINER_DID_NOT_START,
       "the command could not be started (exit code 127): " + why +
           ". Fix trainer.command: its first word must be the interpreter that has torch and the xsilo SDK, "
           "by its full path (a venv's python, e.g. /path/to/venv/bin/python)");
}

json ExternalTrainer::receive(Copy& c, const TrainerWait& wait) {
  const std::string who = "rank " + std::to_string(c.rank);
  const bool starting = wait.starting();
  for (;;) {
    std::string bad;
    if (auto message = c.reader.next(bad)) return std::move(*message);
    if (!bad.empty()) fail(wire::TRAINER_PROTOCOL_ERROR, who + " " + bad);
    if (cancelled_) fail(wire::AGENT_STOPPING, "the agent is stopping");
    const auto now = Clock::now();
    if (wait.expired(now)) fail(wait.on_timeout, wait.timeout_message(who, now));
    pollfd p{c.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(wait.poll_for(now).count()));
    if (r < 0 && errno != EINTR) fail(wire::AGENT_INTERNAL, std::string("poll: ") + std::strerror(errno));
    if (r <= 0) {
      // Nothing to read: only now does an exited copy count (what it sent before exiting is read
      // first).
      if (c.process && !c.process->running()) {
        if (starting && c.process->exit_code() == 127) not_started(c);
        fail(starting ? wire::TRAINER_DID_NOT_START : wire::TRAINER_EXITED,
             who + " exited with code " + std::to_string(c.process->exit_code().value_or(-1)) +
                 " while the agent waited for " + wait.what + (starting ? " (during start-up)" : ""));
      }
      continue;
    }
    char buf[65536];
    const ssize_t got = ::recv(c.fd, buf, sizeof buf, 0);
    if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
      if (c.process) c.process->wait(std::chrono::milliseconds(500));
      const auto code = c.process ? c.process->exit_code() : std::nullopt;
      if (starting && code == 127) not_started(c);
      fail(starting ? wire::TRAINER_DID_NOT_START : wire::TRAINER_EXITED,
           who + " closed its channel while the agent waited for " + wait.what +
               (code ? " (it exited with code " + std::to_string(*code) + ")" : ""));
    }
    if (got > 0) c.reader.feed({buf, static_cast<std::size_t>(got)});
  }
}

json ExternalTrainer::run(const std::string& kind, const Model* model, const TrainTask& task) {
  json config = json::object();
  if (!task.plan.config_json().empty()) {
    try {
      config = json::parse(task.plan.config_json());
    } catch (const json::exception&) {
    }
    if (!config.is_object()) config = json::object();  // the server sends an object; anything else is dropped
  }
  config["round"] = task.round;
  config["seed"] = task.plan.seed();
  if (!config.contains("local_epochs") && task.plan.local_epochs() > 0) config["local_epochs"] = task.plan.local_epochs();
  start(task, model ? model->bytes() : 0);
  // The task's budget starts now, after start-up.
  const auto since = Clock::now();
  const TrainerWait wait =
      task_wait(kind, task.round, task_budget(cfg_.external.task_timeout, task.plan.train_timeout_ms()), since);
  const std::uint64_t id = ++next_id_;
  json msg = {{"type", "task"}, {"id", id}, {"kind", kind}, {"round", task.round}, {"config", config}};
  if (!cfg_.feature_stats.empty()) msg["feature_stats"] = cfg_.feature_stats.to_json();
  std::filesystem::path model_path;
  if (model) {
    model_path = exchange_ / ("global-" + std::to_string(task.round) + "-" + std::to_string(id) + ".safetensors");
    write_safetensors(model_path, *model, {{"xsilo.round", std::to_string(task.round)}});
    msg["model"] = model_path.string();
  } else {
    msg["model"] = nullptr;
  }
  const RemoveOnExit remove_model{model_path};  // whatever way the task ends
  for (auto& c : copies_) {
    if (!send_message(c->fd, msg)) {
      fail(wire::TRAINER_EXITED, "rank " + std::to_string(c->rank) + " closed its channel before the " + kind + " task");
    }
  }
  // Every copy answers; a copy's own error or a malformed answer is decided once all have
  // answered, so that the healthy ones stay in step and keep running.
  json first;
  std::string reported, malformed;
  for (auto& c : copies_) {
    json r = receive(*c, wait);
    const std::string who = "rank " + std::to_string(c->rank);
    // The trainer's own error fails the check too, with its message.
    if (const auto st = trainer_protocol::check_result(r, id); !st) {
      const bool own = r.is_object() && r.contains("type") && r["type"] == "error";
      std::string& first_of_kind = own ? reported : malformed;
      if (first_of_kind.empty()) first_of_kind = who + " " + st.error().message();
    }
    if (c->rank == 0) first = std::move(r);
  }
  last_task_seconds_ = std::chrono::duration<double>(Clock::now() - since).count();
  if (!malformed.empty()) fail(wire::TRAINER_PROTOCOL_ERROR, malformed);
  if (!reported.empty()) fail(wire::TRAINER_REPORTED_ERROR, reported, /*stop=*/false);
  log_notes(first);
  return first;
}

wire::TrainMetrics ExternalTrainer::evaluate(const Model& model, const TrainTask& task) {
  wire::TrainMetrics m;
  if (!cfg_.external.evaluate) return m;
  return guarded([&] { return trainer_protocol::parse_eval_metrics(run("evaluate", &model, task)); });
}

TrainResult ExternalTrainer::train(const Model& global, const TrainTask& task, Model& local) {
  return guarded([&] {
    const json r = run("train", &global, task);
    TrainResult out = read_weights(r, global, local, task);
    check_process_group(r);
    out.metrics.set_train_seconds(last_task_seconds_);
    consecutive_failures_ = 0;
    return out;
  });
}

Model ExternalTrainer::initial_model(const TrainTask& task) {
  return guarded([&] {
    const json r = run("init", nullptr, task);
    trainer_protocol::TrainAnswer answer;
    if (const auto st = trainer_protocol::parse_train_answer(r, exchange_, answer); !st) {
      fail(wire::TRAINER_PROTOCOL_ERROR, st.error().message(), false);
    }
    const RemoveOnExit remove_weights{answer.weights};
    Model m;
    std::string why;
    try {
      const MappedFile file(answer.weights);
      const auto view = parse_safetensors(file.bytes());
      for (const auto& t : view.tensors) {
        if (t.is_float()) m.add(t.name, t.shape);
      }
      for (const auto& t : view.tensors) {
        if (t.is_float()) to_float32(t, m.tensor(t.name));
      }
    } catch (const std::exception& e) {
      why = std::string("cannot read the trainer's initial weights: ") + e.what();
    }
    if (!why.empty()) fail(wire::TRAINER_BAD_WEIGHTS, why, false);
    if (m.tensors().empty()) fail(wire::TRAINER_BAD_WEIGHTS, "the trainer's initial weights hold no floating-point tensor", false);
    for (const auto& t : m.tensors()) {
      const auto v = m.tensor(t.name);
      if (std::any_of(v.begin(), v.end(), [](float x) { return !std::isfinite(x); })) {
        fail(wire::TRAINER_NON_FINITE, "the trainer's initial weights have NaN or infinite values in tensor " + t.name, false);
      }
    }
    consecutive_failures_ = 0;
    return m;
  });
}

// What the SDK says once about the tensors it sends: at WARNING in the agent's log, where the
// silo's operator looks (the script's own log is easy to miss).
void ExternalTrainer::log_notes(const json& r) {
  if (!r.contains("notes") || !r["notes"].is_object()) return;
  auto names = [](const json& list) {
    std::string out;
    if (!list.is_array()) return out;
    for (const auto& n : list) {
      if (n.is_string()) out += (out.empty() ? "" : ", ") + n.get<std::string>();
    }
    return out.substr(0, 2000);
  };
  const json& notes = r["notes"];
  if (const auto kept = names(notes.value("kept_local", json())); !kept.empty()) {
    spdlog::warn("external trainer: not federated, kept in the silo (integer and bool tensors): {}", kept);
  }
  if (const auto narrowed = names(notes.value("narrowed", json())); !narrowed.empty()) {
    spdlog::warn("external trainer: float64 tensors federated as float32: {}", narrowed);
  }
}

void ExternalTrainer::check_process_group(const json& r) {
  const int workers = std::max(1, cfg_.local.workers);
  if (workers == 1 || process_group_checked_) return;
  if (!r.contains("process_group") || !r["process_group"].is_number_integer()) return;  // an SDK that cannot tell
  const auto group = r["process_group"].get<std::int64_t>();
  if (group == workers) {
    process_group_checked_ = true;
    return;
  }
  fail(wire::TRAINER_MISCONFIGURED,
       "local.workers is " + std::to_string(workers) + " but the script's copies " +
           (group == 0 ? std::string("never joined a process group")
                       : "joined a process group of " + std::to_string(group)) +
           ": every copy trains on all rows and only rank 0's work is kept. Fix: call "
           "torch.distributed.init_process_group(\"gloo\" or \"nccl\") in the script, wrap the model in "
           "DistributedDataParallel and shard the data by rank (DistributedSampler), or set local.workers to 1",
       /*stop=*/true, /*fatal=*/true);
}

// Rank 0's weights: a regular file of the exchange folder with exactly the global model's
// tensors (names, shapes, floating-point dtypes) and finite values.
TrainResult ExternalTrainer::read_weights(const json& r, const Model& global, Model& local, const TrainTask& task) {
  trainer_protocol::TrainAnswer answer;
  const auto parsed = trainer_protocol::parse_train_answer(r, exchange_, answer);
  const std::filesystem::path& weights = answer.weights;
  const RemoveOnExit remove_weights{weights.parent_path() == exchange_ ? weights : std::filesystem::path()};
  if (!parsed) fail(wire::TRAINER_PROTOCOL_ERROR, parsed.error().message(), false);
  const auto samples = answer.num_samples;
  std::string why;
  try {
    const MappedFile file(weights);
    if (file.links() != 1) throw std::runtime_error("it has " + std::to_string(file.links()) + " hard links");
    const auto view = parse_safetensors(file.bytes());
    // Every tensor of the global model, with its shape and a floating-point dtype; nothing else
    // but integer buffers (which stay with the silo).
    for (const auto& t : view.tensors) {
      if (!global.find(t.name) && t.is_float()) {
        why = "the trainer returned tensor " + t.name + ", which the global model does not have";
        break;
      }
    }
    for (const auto& g : global.tensors()) {
      if (!why.empty()) break;
      const TensorView* t = view.find(g.name);
      if (!t) {
        why = "the trainer's weights lack tensor " + g.name + " of the global model";
      } else if (!t->is_float()) {
        why = "the trainer returned tensor " + g.name + " as " + t->dtype + "; it must be a floating-point tensor";
      } else if (t->shape != g.shape) {
        why = "the trainer returned tensor " + describe({g.name, t->shape, 0}) + ", the global model has " + describe(g);
      } else {
        to_float32(*t, local.tensor(g.name));
      }
    }
  } catch (const std::exception& e) {
    why = std::string("cannot read the trainer's weights: ") + e.what();
  }
  if (!why.empty()) fail(wire::TRAINER_BAD_WEIGHTS, why, /*stop=*/false);
  for (const auto& g : global.tensors()) {
    const auto v = local.tensor(g.name);
    if (std::any_of(v.begin(), v.end(), [](float x) { return !std::isfinite(x); })) {
      fail(wire::TRAINER_NON_FINITE, "the trainer returned NaN or infinite values in tensor " + g.name, false);
    }
  }
  if (samples == 0) fail(wire::TRAINER_NO_SAMPLES, "rank 0's train result has no positive num_samples", false);
  TrainResult out;
  out.num_samples = samples;
  out.dp = answer.dp;  // charged by the agent's privacy budget, when it has one
  out.metrics.set_train_loss(answer.loss);
  for (auto it = answer.metrics.begin(); it != answer.metrics.end(); ++it) {
    if (it.key() != "loss" && it.key() != "train_loss") spdlog::info("round {}: trainer metric {} = {}", task.round, it.key(), it->dump());
  }
  return out;
}

}  // namespace xsilo::agent
