// What the sections of tessera-bench share (deploy/bench/data_plane_bench.cc, deploy/bench/row_bench.cc): the table
// every figure goes into, small helpers, and a cluster of real daemons (a tessera-scheduler and its
// tessera-server processes, optionally tessera-worker processes) that the benchmark's own PsClient talks to.
#ifndef TESSERA_DEPLOY_BENCH_BENCH_CLUSTER_H_
#define TESSERA_DEPLOY_BENCH_BENCH_CLUSTER_H_

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/model/job_spec.h"
#include "gflags/gflags.h"
#include "common/rpc/security.h"
#include "nlohmann/json.hpp"
#include "deploy/bench/bench_process.h"
#include "tests/testing/param_spec.h"
#include "worker/client/ps_client.h"

DECLARE_string(transports);

namespace tessera::bench {

using tessera::testing::FloatParam;
using tessera::v1::JobSpec;
using Clock = std::chrono::steady_clock;

constexpr double kMiB = 1 << 20;
constexpr double kGB = 1e9;

// ---------------------------------------------------------------------------------------------------------------
// The table.

struct Row {
  std::string section;
  std::string what;
  std::string value;
  std::string reference;  // what the ratio is to, with its value, measured in this run
  std::string ratio;
  std::string target;
  std::string note;
};

class Table {
 public:
  void Add(Row row) {
    std::cerr << "tessera-bench: | " << row.section << " | " << row.what << " | " << row.value << " | "
              << row.reference << " | " << row.ratio << " |" << std::endl;
    rows_.push_back(std::move(row));
  }
  void Failed(const std::string& section, const std::string& what, const absl::Status& status) {
    std::string message(status.message());
    std::cerr << "tessera-bench: section " << section << ": " << what << " failed: " << message << std::endl;
    const size_t newline = message.find('\n');
    if (newline != std::string::npos) message = message.substr(0, newline) + " (see stderr)";
    Add({section, what, "failed", "", "", "", message});
  }
  // Rows in section order (a before b, ...), in the order each section added them.
  void Print(std::ostream& out) const {
    std::vector<Row> rows = rows_;
    std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.section < y.section; });
    out << "| | measurement | value | reference (same run) | x ref | target | note |\n";
    out << "|---|---|---|---|---|---|---|\n";
    for (const Row& r : rows) {
      out << "| " << absl::StrJoin({r.section, Cell(r.what), Cell(r.value), Cell(r.reference), Cell(r.ratio),
                                    Cell(r.target), Cell(r.note)},
                                   " | ")
          << " |\n";
    }
  }

 private:
  static std::string Cell(const std::string& s) { return absl::StrReplaceAll(s, {{"|", "\\|"}, {"\n", " "}}); }
  std::vector<Row> rows_;
};

inline std::string Ratio(double value, double reference) {
  if (!std::isfinite(value) || !std::isfinite(reference) || reference <= 0) return "n/a";
  return absl::StrFormat("%.2fx", value / reference);
}

inline std::string Gbs(double gbs) { return std::isfinite(gbs) ? absl::StrFormat("%.2f GB/s", gbs) : "n/a"; }

inline void Progress(const std::string& line) { std::cerr << "tessera-bench: " << line << std::endl; }

// ---------------------------------------------------------------------------------------------------------------
// Small helpers.

inline double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

inline double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline absl::StatusOr<std::vector<int>> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected positive integers, got '", text, "'"));
    }
    out.push_back(v);
  }
  return out;
}

inline absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

inline absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::DataLossError(absl::StrCat("not JSON: ", path));
  return j;
}

// The JSON records of a metrics.jsonl file.
inline std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

// A /proc/PID/status field in bytes ("VmRSS", "VmHWM"); -1 when absent.
inline int64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (!absl::StartsWith(line, field + ":")) continue;
    int64_t kb = 0;  // "VmRSS:	  123456 kB"
    const absl::string_view number = absl::StripSuffix(absl::string_view(line).substr(field.size() + 1), "kB");
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(number), &kb)) return kb * 1024;
  }
  return -1;
}

// What every section needs: where the binaries are and where files go.
struct Context {
  std::string bin_dir;
  std::string work_dir;
};

// A fresh directory under the work directory.
inline absl::StatusOr<std::string> MakeDir(const Context& ctx, const std::string& name) {
  const std::string dir = ctx.work_dir + "/" + name;
  std::error_code error;
  std::filesystem::remove_all(dir, error);
  std::filesystem::create_directories(dir, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  return dir;
}

// `a` followed by `b`.
inline std::vector<std::string> Joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Fills defaults, validates and writes `job` to `path`.
inline absl::Status WriteJob(JobSpec job, const std::string& path) {
  ApplyJobDefaults(job);
  if (absl::Status valid = ValidateJobSpec(job); !valid.ok()) return valid;
  return WriteFile(path, JobSpecToText(job));
}

// ---------------------------------------------------------------------------------------------------------------
// A cluster of real daemons: one tessera-scheduler, N tessera-server and optionally M tessera-worker processes.
// The destructor stops workers, then servers, then the scheduler.

struct Cluster {
  std::string dir;       // job.pbtxt, run/ (metrics.jsonl, summary.json), *.log
  std::string address;   // the scheduler's HOST:PORT
  std::unique_ptr<Process> scheduler;
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::unique_ptr<Process>> workers;

  ~Cluster() {
    for (auto& w : workers) w->Stop();
    for (auto& s : servers) s->Stop();
    if (scheduler) scheduler->Stop();
  }

  // OK while every daemon runs or exited 0; else the first failure, with the end of its log.
  absl::Status Healthy() {
    for (auto* list : {&workers, &servers}) {
      for (auto& p : *list) {
        if (p->Exited() && !p->Succeeded()) return p->ExitStatus();
      }
    }
    if (scheduler->Exited() && !scheduler->Succeeded()) return scheduler->ExitStatus();
    return absl::OkStatus();
  }

  // Waits for the job to end (the scheduler exits) and for the other daemons to follow.
  absl::Status WaitForJob(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!scheduler->Exited()) {
      if (absl::Status s = Healthy(); !s.ok()) return s;
      if (absl::Now() > deadline) return absl::DeadlineExceededError("timed out waiting for the job to finish");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (absl::Status s = scheduler->ExitStatus(); !s.ok()) return s;
    for (auto* list : {&workers, &servers}) {
      for (auto& p : *list) {
        if (!p->WaitForExit(absl::Seconds(10))) continue;  // stopped by the destructor
        if (!p->Succeeded()) return p->ExitStatus();
      }
    }
    return absl::OkStatus();
  }
};

// Starts the scheduler with `job`, its servers, and `workers` worker processes with `worker_flags`.
// Every daemon gets `security`'s files as flags; the servers also `server_flags`.
inline absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(const Context& ctx, const std::string& name,
                                                             const JobSpec& job, int workers,
                                                             const std::vector<std::string>& worker_flags,
                                                             const SecurityOptions& security = {},
                                                             const std::vector<std::string>& server_flags = {}) {
  std::vector<std::string> security_flags;
  if (!security.token_file.empty()) security_flags.push_back("--token_file=" + security.token_file);
  if (!security.tls_cert.empty()) security_flags.push_back("--tls_cert=" + security.tls_cert);
  if (!security.tls_key.empty()) security_flags.push_back("--tls_key=" + security.tls_key);
  if (!security.tls_ca.empty()) security_flags.push_back("--tls_ca=" + security.tls_ca);
  auto with_security = [&](std::vector<std::string> argv) {
    argv.insert(argv.end(), security_flags.begin(), security_flags.end());
    return argv;
  };
  auto cluster = std::make_unique<Cluster>();
  absl::StatusOr<std::string> dir = MakeDir(ctx, name);
  if (!dir.ok()) return dir.status();
  cluster->dir = *dir;
  const std::string job_path = cluster->dir + "/job.pbtxt";
  if (absl::Status s = WriteJob(job, job_path); !s.ok()) return s;
  const std::string address_file = cluster->dir + "/scheduler.address";
  absl::StatusOr<std::unique_ptr<Process>> scheduler = Process::Start(
      "scheduler",
      with_security({ctx.bin_dir + "/tessera-scheduler", "--job=" + job_path, "--run_dir=" + cluster->dir + "/run",
                     "--port=0", "--address_file=" + address_file, "--http_port=-1"}),
      cluster->dir + "/scheduler.log");
  if (!scheduler.ok()) return scheduler.status();
  cluster->scheduler = std::move(*scheduler);

  // The scheduler writes its address (through a rename) once it listens.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (cluster->address.empty()) {
    std::ifstream in(address_file);
    if (in && std::getline(in, cluster->address) && !cluster->address.empty()) break;
    cluster->address.clear();
    if (cluster->scheduler->Exited()) return cluster->scheduler->ExitStatus();
    if (absl::Now() > deadline) return absl::DeadlineExceededError("timed out waiting for the scheduler to listen");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int i = 0; i < job.cluster().num_servers(); ++i) {
    absl::StatusOr<std::unique_ptr<Process>> server =
        Process::Start(absl::StrCat("server ", i),
                       with_security(Joined({ctx.bin_dir + "/tessera-server", "--scheduler=" + cluster->address,
                                             "--http_port=-1"}, server_flags)),
                       absl::StrCat(cluster->dir, "/server-", i, ".log"));
    if (!server.ok()) return server.status();
    cluster->servers.push_back(std::move(*server));
  }
  for (int i = 0; i < workers; ++i) {
    std::vector<std::string> argv = {ctx.bin_dir + "/tessera-worker", "--scheduler=" + cluster->address,
                                     "--http_port=-1"};
    argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
    argv = with_security(std::move(argv));
    absl::StatusOr<std::unique_ptr<Process>> worker =
        Process::Start(absl::StrCat("worker ", i), argv, absl::StrCat(cluster->dir, "/worker-", i, ".log"));
    if (!worker.ok()) return worker.status();
    cluster->workers.push_back(std::move(*worker));
  }
  return cluster;
}

// A job for the data-plane measurements: ASYNC (pushes apply on arrival, nothing waits at a clock), one worker
// (this process), SGD with a tiny learning rate so values change but stay small, and no end in sight.
// "grpc" or "ucx" as the JobSpec says it (UCX with trusted_network: loopback here).
inline absl::StatusOr<tessera::v1::Transport> ParseTransport(const std::string& name) {
  if (name == "grpc") return tessera::v1::GRPC;
  if (name == "ucx") return tessera::v1::UCX;
  return absl::InvalidArgumentError(absl::StrCat("--transports: '", name, "' is neither grpc nor ucx"));
}

inline void SetTransport(tessera::v1::Transport transport, JobSpec& job) {
  job.set_transport(transport);
  job.set_trusted_network(transport == tessera::v1::UCX);
}

inline std::string TransportLabel(tessera::v1::Transport transport) { return transport == tessera::v1::UCX ? "UCX" : "gRPC"; }

// --transports (tessera-bench's flag), parsed.
inline absl::StatusOr<std::vector<tessera::v1::Transport>> Transports() {
  std::vector<tessera::v1::Transport> out;
  for (absl::string_view name : absl::StrSplit(FLAGS_transports, ',', absl::SkipEmpty())) {
    absl::StatusOr<tessera::v1::Transport> t = ParseTransport(std::string(name));
    if (!t.ok()) return t.status();
    out.push_back(*t);
  }
  if (out.empty()) return absl::InvalidArgumentError("--transports: name at least one of grpc, ucx");
  return out;
}

inline JobSpec TransferJob(const std::string& name, int servers, int64_t chunk_bytes, float momentum) {
  JobSpec job;
  job.set_name(name);
  job.mutable_model()->mutable_mlp();  // the workers' model; unused (this process pushes its own parameters)
  job.mutable_data()->set_format(tessera::v1::DataSpec::SYNTHETIC);
  job.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::SGD);
  job.mutable_optimizer()->set_learning_rate(1e-6f);
  job.mutable_optimizer()->set_momentum(momentum);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::ASYNC);
  job.mutable_stop()->set_max_steps(int64_t{1} << 40);
  job.set_chunk_bytes(chunk_bytes);
  job.mutable_cluster()->set_num_servers(servers);
  job.mutable_cluster()->set_num_workers(1);
  return job;
}

inline absl::StatusOr<std::unique_ptr<PsClient>> ConnectClient(const Cluster& cluster,
                                                        const SecurityOptions& security = {}) {
  PsClient::Options options;
  options.scheduler_address = cluster.address;
  options.device = "cpu";
  options.security = security;
  return PsClient::Connect(options);
}

}  // namespace tessera::bench

#endif  // TESSERA_DEPLOY_BENCH_BENCH_CLUSTER_H_
