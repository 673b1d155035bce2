// tessera-soak: a scheduler and two servers (real processes, with a job token) under 64 concurrent clients for
// a long while. Each client is a registered worker that mixes valid traffic (pull, push, clock) with malformed
// and hostile requests (bad bytes, wrong tokens, forged ranks, huge shapes, unknown kinds, NaN values, control
// calls), at a bounded rate. Every --report_s it prints each daemon's resident memory and open file
// descriptors and the slowest /healthz answer of each server; at the end, whether memory and descriptors stayed
// within 10% of their level after warm-up and every /healthz answered within 100 ms. Exit code 1 when not.
//
//   deploy/experiments/soak.sh            # 10 minutes (builds first)
//   build/bin/tessera-soak --duration_s=60 --report_s=10
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <thread>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/daemon/daemon_init.h"
#include "common/rpc/security.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "gflags/gflags.h"
#include "proto/ps.grpc.pb.h"
#include "deploy/bench/bench_process.h"
#include "tests/testing/ports.h"
#include "tests/testing/raw_rpc.h"
#include "worker/client/ps_client.h"

DEFINE_int32(clients, 64, "concurrent clients (each a registered worker of the job)");
DEFINE_int32(duration_s, 600, "how long the clients run");
DEFINE_int32(report_s, 30, "print the daemons' memory and descriptors this often");
DEFINE_int32(warmup_s, 60, "the level memory and descriptors are compared with is the first report after this");
DEFINE_int32(requests_per_second, 20, "per client, valid and malformed together");
DEFINE_int32(malformed_percent, 30, "share of each client's requests that are malformed or hostile");
DEFINE_string(work_dir, "", "logs and the job file go here; default: a fresh folder in the temporary directory");

namespace tessera::soak {
namespace {

using bench::Process;
using testing::Metadata;
using testing::RawUnary;

constexpr int kParamElements = 16384;  // 64 KiB of floats, in chunks of 16 KiB on two servers

struct Daemon {
  std::string name;
  pid_t pid = 0;
  int http_port = 0;
};

int64_t ResidentKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

int OpenDescriptors(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n - 2;  // . and ..
}

// The slowest /healthz answer of each server since the last Take(); runs its own thread.
class HealthProbe {
 public:
  explicit HealthProbe(std::vector<Daemon> daemons) : daemons_(std::move(daemons)), worst_(daemons_.size()) {
    thread_ = std::thread([this] { Run(); });
  }
  ~HealthProbe() {
    stop_ = true;
    thread_.join();
  }
  // Worst latency per daemon (a failed probe counts as infinite) since the last call.
  std::vector<absl::Duration> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<absl::Duration> out = worst_;
    std::fill(worst_.begin(), worst_.end(), absl::ZeroDuration());
    return out;
  }

 private:
  void Run() {
    while (!stop_) {
      for (size_t i = 0; i < daemons_.size(); ++i) {
        httplib::Client client("127.0.0.1", daemons_[i].http_port);
        client.set_connection_timeout(2);
        client.set_read_timeout(2);
        const absl::Time start = absl::Now();
        httplib::Result result = client.Get("/healthz");
        const absl::Duration took = result && result->status == 200 ? absl::Now() - start : absl::InfiniteDuration();
        absl::MutexLock lock(&mu_);
        worst_[i] = std::max(worst_[i], took);
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
  }

  const std::vector<Daemon> daemons_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<absl::Duration> worst_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

struct Counts {
  std::atomic<int64_t> valid{0};
  std::atomic<int64_t> valid_failed{0};
  std::atomic<int64_t> malformed{0};
  std::atomic<int64_t> malformed_accepted{0};  // a hostile request that was answered OK: a finding
};

// One client: a registered worker sending a bounded stream of valid and hostile requests until `deadline`.
class Client {
 public:
  Client(int index, std::unique_ptr<PsClient> ps, const std::string& scheduler, const std::string& token,
         Counts* counts)
      : index_(index), ps_(std::move(ps)), counts_(counts), token_(token), rng_(index * 7919 + 1) {
    scheduler_ = MakeChannel(scheduler, *Security::Plaintext());
    const tessera::v1::ShardMap& map = *ps_->shard_map();
    for (const auto& s : map.servers()) servers_.push_back(MakeChannel(s.address(), *Security::Plaintext()));
  }

  void Run(absl::Time deadline) {
    std::vector<float> values(kParamElements), grad(kParamElements, 1e-6f);
    const absl::Duration gap = absl::Seconds(1) / std::max(1, FLAGS_requests_per_second);
    absl::Time next = absl::Now();
    while (absl::Now() < deadline) {
      if (static_cast<int>(rng_() % 100) < FLAGS_malformed_percent) {
        Malformed();
      } else {
        absl::Status s = Valid(values, grad);
        ++counts_->valid;
        if (!s.ok()) {
          ++counts_->valid_failed;
          if (counts_->valid_failed < 5) std::cerr << "client " << index_ << ": " << s << std::endl;
        }
      }
      next += gap;
      absl::SleepFor(next - absl::Now());
    }
    (void)ps_->Done();
  }

 private:
  absl::Status Valid(std::vector<float>& values, const std::vector<float>& grad) {
    switch (rng_() % 3) {
      case 0:
        return ps_->Pull({"w"}, {absl::MakeSpan(values)});
      case 1:
        return ps_->Push({"w"}, {absl::MakeConstSpan(grad)}, 1);
      default: {
        absl::StatusOr<ClockResult> clock = ps_->Clock();
        return clock.status();
      }
    }
  }

  Metadata Own() const {
    return {{kAuthorizationHeader, "Bearer " + token_}, {kMemberKeyHeader, ps_->member_key()}};
  }

  tessera::v1::PushRequest OwnPush(int index) {
    const tessera::v1::ShardMap& map = *ps_->shard_map();
    tessera::v1::PushRequest r;
    r.set_epoch(map.epoch());
    r.set_worker_id(ps_->worker_id());
    r.set_incarnation(ps_->incarnation());
    r.set_seq(std::numeric_limits<uint64_t>::max() - rng_() % 1000);
    r.set_clock(ps_->clock());
    r.set_read_clock_version(ps_->clock());
    r.set_batch_size(1);
    r.mutable_key()->set_param("w");
    r.mutable_key()->set_index(index);
    const int64_t length = map.chunks(index % map.chunks_size()).length();
    EncodeFloats(std::vector<float>(length, 1.0f), r.mutable_data());
    return r;
  }

  // One hostile request; every one must be refused.
  void Malformed() {
    ++counts_->malformed;
    // Not Register or Done: random bytes that happen to parse as one would be this member's own valid request
    // (taking a rank back, finishing), not an attack.
    static const char* kSchedulerMethods[] = {"Heartbeat", "Declare", "GetShardMap", "AdvanceClock", "Report"};
    static const char* kServerMethods[] = {"Pull", "Push", "PushPull", "AssignShards",
                                           "Checkpoint", "GetStats", "DecideRounds", "Shutdown"};
    const auto& server = servers_[rng_() % servers_.size()];
    absl::Status status;
    switch (rng_() % 9) {
      case 0: {  // random bytes to a random method
        std::string garbage(1 + rng_() % 512, '\0');
        for (char& c : garbage) c = static_cast<char>(rng_());
        if (rng_() % 2 == 0) {
          status = RawUnary(scheduler_, absl::StrCat("/tessera.v1.Scheduler/", kSchedulerMethods[rng_() % 5]),
                            garbage, Own());
        } else {
          status = RawUnary(server, absl::StrCat("/tessera.v1.ParameterServer/", kServerMethods[rng_() % 8]),
                            garbage, Own());
        }
        // Random bytes may happen to be a valid, harmless request (a GetStats, say): not counted as accepted.
        if (status.ok()) return;
        break;
      }
      case 1: {  // a wrong token
        status = RawUnary(server, "/tessera.v1.ParameterServer/Push", OwnPush(0),
                          {{kAuthorizationHeader, "Bearer forged-token-0000000000"}});
        break;
      }
      case 2: {  // a push in another rank's name, with the maximal sequence number
        tessera::v1::PushRequest r = OwnPush(0);
        r.set_worker_id((ps_->worker_id() + 1) % FLAGS_clients);
        status = RawUnary(server, "/tessera.v1.ParameterServer/Push", r, Own());
        break;
      }
      case 3: {  // an unknown kind with NaN values
        tessera::v1::PushRequest r = OwnPush(0);
        r.set_kind(static_cast<tessera::v1::PushRequest::Kind>(2 + rng_() % 100));
        r.clear_data();
        EncodeFloats(std::vector<float>(16, std::nanf("")), r.mutable_data());
        status = RawUnary(server, "/tessera.v1.ParameterServer/Push", r, Own());
        break;
      }
      case 4: {  // a declaration far beyond any limit
        tessera::v1::DeclareRequest r;
        r.set_worker_id(ps_->worker_id());
        auto* p = r.add_params();
        p->set_name(absl::StrCat("huge", rng_() % 1000));
        p->set_dtype(tessera::v1::DT_FLOAT32);
        p->add_shape(int64_t{1} << 40);
        p->add_shape(int64_t{1} << 40);
        status = RawUnary(scheduler_, "/tessera.v1.Scheduler/Declare", r, Own());
        break;
      }
      case 5: {  // a clock that jumps to the end of time, with an endless wait
        tessera::v1::AdvanceClockRequest r;
        r.set_worker_id(ps_->worker_id());
        r.set_clock(std::numeric_limits<int64_t>::max());
        r.set_wait_timeout_ms(std::numeric_limits<uint64_t>::max());
        status = RawUnary(scheduler_, "/tessera.v1.Scheduler/AdvanceClock", r, Own());
        break;
      }
      case 6: {  // a report with a megabyte of device name and an impossible accuracy
        tessera::v1::ReportRequest r;
        r.set_worker_id(ps_->worker_id());
        r.set_device(std::string(1 << 20, 'x'));
        r.set_has_eval(true);
        r.set_test_accuracy(7);
        status = RawUnary(scheduler_, "/tessera.v1.Scheduler/Report", r, Own());
        break;
      }
      case 7: {  // a control call from a worker: shut a server down
        status = RawUnary(server, "/tessera.v1.ParameterServer/Shutdown", tessera::v1::ShutdownRequest(), Own());
        break;
      }
      default: {  // a heartbeat for another rank
        tessera::v1::HeartbeatRequest r;
        r.set_role(tessera::v1::WORKER);
        r.set_id((ps_->worker_id() + 1) % FLAGS_clients);
        status = RawUnary(scheduler_, "/tessera.v1.Scheduler/Heartbeat", r, Own());
        break;
      }
    }
    if (status.ok()) {
      ++counts_->malformed_accepted;
      std::cerr << "client " << index_ << ": a hostile request was accepted" << std::endl;
    }
  }

  const int index_;
  std::unique_ptr<PsClient> ps_;
  Counts* counts_;
  const std::string token_;
  std::mt19937_64 rng_;
  std::shared_ptr<grpc::Channel> scheduler_;
  std::vector<std::shared_ptr<grpc::Channel>> servers_;
};

struct Sample {
  int64_t rss_kib = 0;
  int fds = 0;
};

absl::Status Run(const std::string& bin) {
  const std::string dir =
      FLAGS_work_dir.empty()
          ? (std::filesystem::temp_directory_path() / absl::StrCat("tessera-soak-", getpid())).string()
          : FLAGS_work_dir;
  std::filesystem::create_directories(dir);
  const std::string token = NewSecret() + NewSecret();
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << token << "\n";
  std::filesystem::permissions(token_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::string job_file = dir + "/soak.pbtxt";
  std::ofstream(job_file) << "name: \"soak\"\n"
                          << "model { mlp { hidden_sizes: 16 } }\n"
                          << "data { format: SYNTHETIC }\n"
                          << "consistency { mode: ASYNC }\n"
                          << "chunk_bytes: 16384\n"
                          << "stop { max_seconds: " << FLAGS_duration_s + 600 << " }\n"
                          << "cluster { num_servers: 2 num_workers: " << FLAGS_clients << " }\n";

  std::vector<std::unique_ptr<Process>> processes;
  std::vector<Daemon> daemons;
  const std::string address_file = dir + "/scheduler.address";
  const int scheduler_http = testing::UnusedLoopbackPort();
  TESSERA_ASSIGN_OR_RETURN(
      auto scheduler, Process::Start("scheduler",
                                     {bin + "/tessera-scheduler", "--job=" + job_file, "--address_file=" + address_file,
                                      "--token_file=" + token_file, absl::StrCat("--http_port=", scheduler_http)},
                                     dir + "/scheduler.log"));
  std::string address;
  for (int i = 0; i < 200 && address.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    std::ifstream in(address_file);
    std::getline(in, address);
  }
  if (address.empty()) return absl::DeadlineExceededError("the scheduler did not start; see " + dir);
  daemons.push_back({"scheduler", scheduler->pid(), scheduler_http});
  processes.push_back(std::move(scheduler));
  for (int i = 0; i < 2; ++i) {
    const int http = testing::UnusedLoopbackPort();
    TESSERA_ASSIGN_OR_RETURN(auto server, Process::Start(absl::StrCat("server ", i),
                                                         {bin + "/tessera-server", "--scheduler=" + address,
                                                          "--token_file=" + token_file,
                                                          absl::StrCat("--http_port=", http)},
                                                         absl::StrCat(dir, "/server-", i, ".log")));
    daemons.push_back({absl::StrCat("server ", i), server->pid(), http});
    processes.push_back(std::move(server));
  }

  std::cout << "soak: " << FLAGS_clients << " clients, " << FLAGS_requests_per_second << " requests/s each ("
            << FLAGS_malformed_percent << "% malformed or hostile), " << FLAGS_duration_s << " s; logs in " << dir
            << std::endl;
  // Every client registers before the parameter is placed, so that the view settles before traffic starts.
  std::vector<std::unique_ptr<PsClient>> registered(FLAGS_clients);
  {
    std::vector<std::thread> connecting;
    std::atomic<int> failed{0};
    for (int i = 0; i < FLAGS_clients; ++i) {
      connecting.emplace_back([&, i] {
        PsClient::Options options;
        options.scheduler_address = address;
        options.security.token_file = token_file;
        options.rank = i;
        absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(options);
        if (!client.ok()) {
          std::cerr << "client " << i << ": " << client.status() << std::endl;
          ++failed;
          return;
        }
        registered[i] = std::move(*client);
      });
    }
    for (auto& t : connecting) t.join();
    if (failed > 0) return absl::UnavailableError(absl::StrCat(failed.load(), " clients could not register"));
  }
  tessera::v1::ParameterSpec w;
  w.set_name("w");
  w.set_dtype(tessera::v1::DT_FLOAT32);
  w.add_shape(kParamElements);
  for (auto& c : registered) TESSERA_RETURN_IF_ERROR(c->Declare({w}));

  Counts counts;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < FLAGS_clients; ++i) {
    clients.push_back(std::make_unique<Client>(i, std::move(registered[i]), address, token, &counts));
  }
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Seconds(FLAGS_duration_s);
  std::vector<std::thread> threads;
  for (auto& c : clients) threads.emplace_back([&c, deadline] { c->Run(deadline); });

  HealthProbe probe(daemons);
  std::vector<Sample> baseline;
  std::vector<Sample> worst_growth(daemons.size());
  absl::Duration worst_health = absl::ZeroDuration();
  bool flat = true;
  std::cout << absl::StrFormat("%6s", "s");
  for (const Daemon& d : daemons) std::cout << absl::StrFormat(" | %-9s RSS MiB  fds healthz", d.name);
  std::cout << " | requests (malformed)" << std::endl;
  for (absl::Time next = start + absl::Seconds(FLAGS_report_s); next <= deadline;
       next += absl::Seconds(FLAGS_report_s)) {
    absl::SleepFor(next - absl::Now());
    const std::vector<absl::Duration> health = probe.Take();
    std::vector<Sample> now;
    std::cout << absl::StrFormat("%6.0f", absl::ToDoubleSeconds(absl::Now() - start));
    for (size_t i = 0; i < daemons.size(); ++i) {
      now.push_back({ResidentKiB(daemons[i].pid), OpenDescriptors(daemons[i].pid)});
      const bool is_server = daemons[i].name != "scheduler";
      if (is_server) worst_health = std::max(worst_health, health[i]);
      std::cout << absl::StrFormat(" | %9s %7.1f %4d %5.0fms", "", now[i].rss_kib / 1024.0, now[i].fds,
                                   absl::ToDoubleMilliseconds(std::min(health[i], absl::Seconds(99))));
    }
    std::cout << " | " << counts.valid + counts.malformed << " (" << counts.malformed << ")" << std::endl;
    if (absl::Now() - start >= absl::Seconds(FLAGS_warmup_s)) {
      if (baseline.empty()) {
        baseline = now;
      } else {
        for (size_t i = 0; i < daemons.size(); ++i) {
          const bool rss_flat = now[i].rss_kib <= baseline[i].rss_kib * 1.10;
          const bool fds_flat = now[i].fds <= baseline[i].fds * 1.10 + 1;
          if (!rss_flat || !fds_flat) flat = false;
        }
      }
    }
  }
  for (auto& t : threads) t.join();
  bool alive = true;
  for (auto& p : processes) alive &= !p->Exited();
  std::cout << "soak: " << counts.valid << " valid requests (" << counts.valid_failed << " failed), "
            << counts.malformed << " malformed or hostile (" << counts.malformed_accepted << " accepted); "
            << "memory and descriptors " << (baseline.empty() ? "not measured (run past the warm-up)"
                                             : flat ? "flat (within 10% after warm-up)"
                                                    : "GREW by more than 10% after warm-up")
            << "; slowest server /healthz " << absl::FormatDuration(worst_health)
            << "; daemons " << (alive ? "all up" : "NOT all up") << std::endl;
  const bool passed = flat && alive && counts.malformed_accepted == 0 && worst_health <= absl::Milliseconds(100);
  return passed ? absl::OkStatus() : absl::InternalError("the soak failed; see above");
}

}  // namespace
}  // namespace tessera::soak

int main(int argc, char** argv) {
  tessera::InitDaemon("tessera-soak [--duration_s=600 --clients=64]", &argc, &argv);
  const std::string bin = std::filesystem::path(argv[0]).parent_path().string();
  absl::Status status = tessera::soak::Run(bin.empty() ? "." : bin);
  if (!status.ok()) {
    std::cerr << "tessera-soak: " << status << std::endl;
    return 1;
  }
  return 0;
}
