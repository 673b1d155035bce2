// tessera-bench: the data-plane benchmark. It prints ONE Markdown table (stdout) in which every speed
// is a ratio to a reference measured by this same process in this same run; progress goes to stderr.
//
//   deploy/bench/data_plane.sh                      # installs iperf3 if missing, builds, runs, keeps the table
//   build/bin/tessera-bench --sections=a,b,c --repeats=3   # a part of it, from the repository root
//
// Sections (rows of the table):
// Sections a, b, d and e have rows for each of --transports (gRPC, and UCX with trusted_network); d and e also
// for each of --wires (the precision of gradients and values on the wire).
//   a. push, pull and push-then-pull (one PsClient::PushPull) of a float32 tensor of --sizes_mib between this
//      process (a PsClient) and 1 and 2 real tessera-server processes (with a real tessera-scheduler) over
//      loopback, as GB/s of payload and as a ratio to iperf3's single-stream loopback TCP. Each timed pull moves
//      bytes: an untimed push changes the values first, and pulls alternate between two destination buffers;
//      bytes_pulled() is checked and a row whose pulls moved fewer bytes says "cache hit". One extra row pulls an
//      unchanged 16 MiB tensor into the same buffer (the unchanged-chunk cache, labelled as such). Over gRPC the
//      1 MiB push rows' note has a bare gRPC push of 1 MiB in one call (see b), what one chunk's call costs.
//   b. round trips per second of a 16-byte tensor (push; pull), 1 server: over gRPC against a bare gRPC echo of
//      16 bytes between two processes (the limit gRPC sets on this machine, called as Tessera's transport calls;
//      the note has the same echo with a blocking client), over UCX against the target of 10,000/s.
//   c. the servers' update rule (UpdateRule::Apply) over --update_mib of float32, SGD, SGD with momentum and
//      Adam and AdamW, in GB/s of parameters updated, against a plain y += a*x loop over the same arrays; and what the
//      servers do when the script's optimizer steps (optimizer { kind: SCRIPT }): a SYNC round's weighted sum of
//      two workers' gradients (SyncRound::Add) and its mean (ROUND_MEAN), and an ASYNC worker's change added
//      (SCRIPT), in GB/s of gradient taken, against a plain y += x loop.
//   d. the Quick start MLP for --steps fixed steps (local baseline; 1 server + 1 worker sync; 2 servers +
//      2 workers sync; the cluster rows once per --transports) as ratios of steady-state milliseconds per step
//      to the local baseline of the same global batch (every run evaluates only after its last step, outside
//      the timed span), and seconds to --target_accuracy.
//   e. a GPU stand-in: workers with --simulate_compute_ms=T (forward and backward replaced by waiting T ms),
//      a 16 MiB MLP on synthetic data, 2 servers, sync, 1 and 2 workers: steps/s against 1000/T.
//   f. a server's resident memory (VmRSS) holding a --memory_mib model with SGD momentum, against the bytes it
//      holds (values + optimizer state).
//   r. what replication costs (ReplicationSpec.backups): a hand-over's credential over 16 MiB against memcpy;
//      the Quick start MLP on 3 servers + 2 workers over gRPC, sync and async, --steps fixed steps with backups 0
//      and 1: milliseconds per step with backups against without, and the bytes the servers handed to backups
//      per step against the bytes pushed to them.
//   s. embedding tables' rows: pulled and pushed per second per server at dim 16 and 64 against an in-process
//      hash map, bytes on the wire per row, and a server's memory per row (deploy/bench/row_bench.cc).
//   g. what TLS costs: push and pull of 16 MiB and round trips of 16 B, 1 server, with the job token over mutual
//      TLS (a CA and certificate made for the run, as tessera-launch --tls does) against the job token over
//      plaintext, both measured in this run.
//
// Every daemon runs as its own process in its own process group and is killed when the benchmark ends, however
// it ends. Ports: every daemon picks a free one (port 0); iperf3 gets a port the OS just handed out.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
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
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/child_process.h"
#include "common/base/cpu_clones.h"
#include "common/daemon/command_line.h"
#include "common/daemon/daemon_init.h"
#include "common/model/job_spec.h"
#include "common/model/wire_format.h"
#include "common/rpc/security.h"
#include "common/daemon/signals.h"
#include "common/base/status_macros.h"
#include "deploy/launcher/credentials.h"
#include "server/replica_auth.h"
#include "server/tables/sync_round.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "common/model/update_rule.h"
#include "deploy/bench/bench_cluster.h"
#include "deploy/bench/bench_process.h"
#include "deploy/bench/row_bench.h"
#include "tests/testing/param_spec.h"
#include "tests/testing/ports.h"
#include "worker/client/ps_client.h"

DEFINE_int32(serve_echo_port, 0, "internal: serve a bare gRPC echo on this loopback port until stopped (section "
             "b's reference, run by tessera-bench itself as a process of its own)");
DEFINE_string(sections, "a,b,c,d,e,f,g,r,s", "comma-separated sections to run (see the file comment): a,b,c,d,e,f,g,r,s");
DEFINE_string(sizes_mib, "1,4,16,64", "a: tensor sizes in MiB of float32");
DEFINE_string(server_counts, "1,2", "a: numbers of server processes to measure against");
DEFINE_int32(repeats, 7, "a: timed calls per measurement (the median is reported)");
DEFINE_int32(repeats_large, 3, "a: timed calls per measurement for tensors of 64 MiB or more");
DEFINE_int64(chunk_bytes, 1 << 20, "a, b, e: the job's chunk_bytes (bytes per chunk)");
DEFINE_string(transports, "grpc,ucx", "a, b, d, e, s: the data-plane transports to measure, each with rows of its own");
DEFINE_string(wires, "fp32,bf16",
              "d, e: wire precisions of gradients and values (fp32, bf16, fp16), each with rows of its own for every "
              "transport");
DEFINE_int32(iperf_seconds, 3, "a: length of the iperf3 loopback TCP measurement, in seconds");
DEFINE_double(roundtrip_seconds, 2.0, "b: how long each round-trip rate is measured, in seconds");
DEFINE_int32(update_mib, 16, "c: size of the updated array, in MiB of float32");
DEFINE_int32(update_repeats, 20, "c: timed updates per rule (the median is reported)");
DEFINE_string(sync_job, "deploy/jobs/fashion_mnist_mlp_sync.pbtxt", "d: the Quick start job file");
DEFINE_string(local_job, "deploy/jobs/fashion_mnist_mlp_local.pbtxt", "d: the local-baseline job file");
DEFINE_int64(steps, 1000, "d: fixed number of steps of the end-to-end runs");
DEFINE_double(target_accuracy, 0.85, "d: test accuracy for the seconds-to-target runs; 0 skips them");
DEFINE_string(device, "auto", "d, e: worker device (auto, cpu, cuda:N)");
DEFINE_int32(simulate_compute_ms, 40, "e: T, milliseconds of simulated forward+backward per step");
DEFINE_int64(gpu_steps, 100, "e: steps of each GPU stand-in run");
DEFINE_int32(memory_mib, 256, "f: model size in MiB of float32 (split into --memory_params parameters)");
DEFINE_int32(memory_params, 4, "f: number of parameters the model is split into");
DEFINE_int64(memory_chunk_bytes, 4 << 20, "f: the job's chunk_bytes (bytes per chunk)");
DEFINE_int32(run_timeout_s, 300, "longest any one run or daemon start may take, in seconds");
DEFINE_string(work_dir, "", "where job files, run directories and daemon logs go; default: a fresh temporary "
              "directory, removed at the end unless --keep_work_dir");
DEFINE_bool(keep_work_dir, false, "keep the work directory (logs of every daemon) after the run");

namespace tessera::bench {
namespace {


// ---------------------------------------------------------------------------------------------------------------
// Reference: iperf3, one TCP stream over loopback.

// GB/s, or NaN with the reason in `why`.
double MeasureIperf(const Context& ctx, std::string* why) {
  const std::string iperf = FindInPath("iperf3");
  if (iperf.empty()) {
    *why = "not installed (deploy/bench/data_plane.sh installs it)";
    return NAN;
  }
  const int port = tessera::testing::UnusedLoopbackPort();
  Progress(absl::StrCat("iperf3: one TCP stream over loopback for ", FLAGS_iperf_seconds, " s (port ", port, ")"));
  absl::StatusOr<std::unique_ptr<Process>> server =
      Process::Start("iperf3 server", {iperf, "-s", "-1", "-p", absl::StrCat(port)}, ctx.work_dir + "/iperf3-s.log");
  if (!server.ok()) {
    *why = std::string(server.status().message());
    return NAN;
  }
  const std::string json_path = ctx.work_dir + "/iperf3.json";
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 * (attempt + 1)));  // the server starts listening
    std::filesystem::remove(json_path);
    absl::StatusOr<std::unique_ptr<Process>> client =
        Process::Start("iperf3 client",
                       {iperf, "-c", "127.0.0.1", "-p", absl::StrCat(port), "-t", absl::StrCat(FLAGS_iperf_seconds),
                        "-J"},
                       json_path);
    if (!client.ok()) break;
    if (!(*client)->WaitForExit(absl::Seconds(FLAGS_iperf_seconds + 30))) break;
    absl::StatusOr<nlohmann::json> j = ReadJson(json_path);
    if ((*client)->Succeeded() && j.ok()) {
      const nlohmann::json& bps = (*j)["end"]["sum_received"]["bits_per_second"];
      if (bps.is_number()) return bps.get<double>() / 8 / kGB;
    }
    if ((*server)->Exited()) break;  // a real failure, not "not listening yet"
  }
  *why = absl::StrCat("iperf3 failed; see ", json_path);
  return NAN;
}

// ---------------------------------------------------------------------------------------------------------------
// a. Push, pull and push-then-pull of large tensors.

struct Timing {
  double seconds = NAN;  // median of the timed calls
  bool moved_bytes = true;  // every timed pull received the whole tensor
  int64_t bytes_pulled = 0;  // over all timed calls
};

// Times `calls` calls of `call` (median). `before` runs untimed before each call. `expect_pulled`: bytes each
// call must pull (0: no check).
absl::StatusOr<Timing> TimeCalls(PsClient& client, int calls, int64_t expect_pulled,
                                 const std::function<absl::Status(int)>& before,
                                 const std::function<absl::Status(int)>& call) {
  Timing t;
  std::vector<double> seconds;
  for (int i = 0; i < calls; ++i) {
    if (before) {
      if (absl::Status s = before(i); !s.ok()) return s;
    }
    const int64_t pulled = client.bytes_pulled();
    const Clock::time_point start = Clock::now();
    if (absl::Status s = call(i); !s.ok()) return s;
    seconds.push_back(SecondsSince(start));
    const int64_t delta = client.bytes_pulled() - pulled;
    t.bytes_pulled += delta;
    if (expect_pulled > 0 && delta < expect_pulled) t.moved_bytes = false;
  }
  t.seconds = Median(seconds);
  return t;
}

// Round trips: `call` (given the call's number) 20 times untimed, then as many times as fit in
// --roundtrip_seconds; `before_timed`, when given, runs between the two.
struct CallRate {
  int64_t calls = 0;
  double seconds = 0;
  double per_second() const { return calls / seconds; }
};
absl::StatusOr<CallRate> RunCallsFor(const std::function<absl::Status(int64_t)>& call,
                                     const std::function<void()>& before_timed = nullptr) {
  for (int i = 0; i < 20; ++i) {  // warm-up
    if (absl::Status s = call(i); !s.ok()) return s;
  }
  if (before_timed) before_timed();
  const Clock::time_point start = Clock::now();
  CallRate rate;
  while ((rate.seconds = SecondsSince(start)) < FLAGS_roundtrip_seconds) {
    if (absl::Status s = call(rate.calls); !s.ok()) return s;
    ++rate.calls;
  }
  return rate;
}

// The limit gRPC itself sets on this machine: a bare service (a generic callback service, another process,
// loopback, no token, no handler) that echoes 16 bytes, or takes 1 MiB and answers with nothing (kSinkMethod),
// called the way Tessera's transport calls (GenericStub's callback, the caller waiting) and, for the echo, with
// a blocking call.
constexpr char kEchoMethod[] = "/tessera.bench.Bare/Echo";
constexpr char kSinkMethod[] = "/tessera.bench.Bare/Sink";

class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(bool sink) : sink_(sink) { StartRead(&buffer_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        if (sink_) {  // an empty answer (a cleared ByteBuffer is no message at all)
          grpc::Slice nothing;
          buffer_ = grpc::ByteBuffer(&nothing, 1);
        }
        StartWriteAndFinish(&buffer_, {}, grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      const bool sink_;
      grpc::ByteBuffer buffer_;
    };
    return new Reactor(context->method() == kSinkMethod);
  }
};

int ServeEcho(int port) {
  EchoService echo;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&echo);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return 1;
  server->Wait();
  return 0;
}

struct EchoRates {
  double callback = NAN;  // round trips per second
  double blocking = NAN;
  double push_1mib_gbs = NAN;  // one unary call carrying 1 MiB, answered with nothing
};

// Round trips per second against a bare echo process, for FLAGS_roundtrip_seconds each way, and 1 MiB pushes
// (the median of at least 30 calls after a warm-up: one call is short, and this VM is noisy).
absl::StatusOr<EchoRates> MeasureBareGrpc(const Context& ctx) {
  const int port = tessera::testing::UnusedLoopbackPort();
  absl::StatusOr<std::unique_ptr<Process>> server =
      Process::Start("bare gRPC echo", {ctx.bin_dir + "/tessera-bench", absl::StrCat("--serve_echo_port=", port)},
                     ctx.work_dir + "/echo.log");
  if (!server.ok()) return server.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return absl::UnavailableError("the bare gRPC echo did not start within 10 s");
  }
  grpc::GenericStub stub(channel);
  const grpc::internal::RpcMethod method(kEchoMethod, grpc::internal::RpcMethod::NORMAL_RPC);
  char bytes[16] = {};
  grpc::Slice slice(bytes, sizeof(bytes));
  const grpc::ByteBuffer request(&slice, 1);
  // Every call has a deadline: a bare service that hangs fails the measurement instead of the benchmark.
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(10); };
  auto as_status = [](const grpc::Status& s) {
    return s.ok() ? absl::OkStatus() : absl::UnavailableError(absl::StrCat("bare gRPC: ", s.error_message()));
  };
  auto call_with_callback = [&](const char* name, const grpc::ByteBuffer& body) {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    grpc::ByteBuffer response;
    absl::Mutex mu;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&context, name, grpc::StubOptions(), &body, &response, [&](grpc::Status s) {
      absl::MutexLock lock(&mu);
      status = std::move(s);
      done = true;
    });
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    return as_status(status);
  };
  auto callback_call = [&](int64_t) { return call_with_callback(kEchoMethod, request); };
  auto blocking_call = [&](int64_t) {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    grpc::ByteBuffer response;
    return as_status(grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel.get(), method, &context, request, &response));
  };
  Progress(absl::StrCat("a/b: a bare gRPC service: echoes of 16 bytes for ", 2 * FLAGS_roundtrip_seconds,
                        " s, pushes of 1 MiB"));
  EchoRates rates;
  absl::StatusOr<CallRate> callback = RunCallsFor(callback_call);
  if (!callback.ok()) return callback.status();
  absl::StatusOr<CallRate> blocking = RunCallsFor(blocking_call);
  if (!blocking.ok()) return blocking.status();
  rates.callback = callback->per_second();
  rates.blocking = blocking->per_second();
  // The payload is one slice made once, as a push sends the caller's memory as a slice of its own.
  grpc::Slice mib(std::string(static_cast<size_t>(kMiB), '\x01'));
  const grpc::ByteBuffer push(&mib, 1);
  std::vector<double> seconds;
  for (int i = 0; i < 3 + std::max(30, FLAGS_repeats); ++i) {
    const Clock::time_point start = Clock::now();
    if (absl::Status s = call_with_callback(kSinkMethod, push); !s.ok()) return s;
    if (i >= 3) seconds.push_back(SecondsSince(start));
  }
  rates.push_1mib_gbs = kMiB / Median(seconds) / kGB;
  return rates;
}

// `bare` (over gRPC, when measured): the 1 MiB push rows' notes compare with a bare gRPC push of 1 MiB.
absl::Status TransferSection(PsClient& client, int servers, const std::vector<int>& sizes_mib, double iperf_gbs,
                             const std::string& iperf_ref, const std::string& transport,
                             const std::optional<EchoRates>& bare, Table& table) {
  const std::string target = servers >= 2 ? ">= 0.8x" : "";
  for (int mib : sizes_mib) {
    const std::string name = absl::StrCat("a", mib);
    const int64_t n = static_cast<int64_t>(mib * kMiB / sizeof(float));
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    const int calls = std::max(1, mib >= 64 ? FLAGS_repeats_large : FLAGS_repeats);
    Progress(absl::StrCat("a: ", mib, " MiB, ", servers, " server(s), ", transport, ", ", calls, " calls each"));
    std::vector<float> grad(n, 1.0f);
    std::vector<float> out[2] = {std::vector<float>(n), std::vector<float>(n)};
    const std::vector<std::string> names = {name};
    const std::vector<absl::Span<const float>> grads = {absl::MakeConstSpan(grad)};
    auto push = [&](int) { return client.Push(names, grads, 1); };
    auto pull_alternating = [&](int i) { return client.Pull(names, {absl::MakeSpan(out[i % 2])}); };
    // Warm-up: connections, first-touch of every buffer on both sides.
    if (absl::Status s = push(0); !s.ok()) return s;
    if (absl::Status s = pull_alternating(0); !s.ok()) return s;
    if (absl::Status s = pull_alternating(1); !s.ok()) return s;

    const std::string what =
        absl::StrCat(mib, " MiB, ", servers, servers == 1 ? " server" : " servers", ", ", transport);
    auto add = [&](const std::string& op, const Timing& t, double payload, bool pulls) {
      const double gbs = payload / t.seconds / kGB;
      std::string label = absl::StrCat(op, " ", what);
      std::string note;
      if (pulls && !t.moved_bytes) {
        label += " (cache hit)";
        note = absl::StrFormat("pulls moved %.1f of %.1f MiB", t.bytes_pulled / kMiB, bytes * calls / kMiB);
      }
      if (op == "push" && mib == 1 && bare.has_value()) {
        note = absl::StrFormat("one call; a bare gRPC push of 1 MiB in one call: %.2f GB/s (%.2fx of it)",
                               bare->push_1mib_gbs, gbs / bare->push_1mib_gbs);
      }
      table.Add({"a", label, Gbs(gbs), iperf_ref, Ratio(gbs, iperf_gbs), op == "push-then-pull" ? "" : target,
                 note});
    };
    absl::StatusOr<Timing> t = TimeCalls(client, calls, 0, nullptr, push);
    if (!t.ok()) return t.status();
    add("push", *t, bytes, false);
    // The values change before every timed pull (an untimed push), and the destination alternates.
    t = TimeCalls(client, calls, bytes, push, pull_alternating);
    if (!t.ok()) return t.status();
    add("pull", *t, bytes, true);
    t = TimeCalls(client, calls, bytes, nullptr, [&](int i) {
      return client.PushPull(names, grads, 1, {absl::MakeSpan(out[i % 2])});
    });
    if (!t.ok()) return t.status();
    add("push-then-pull", *t, 2.0 * bytes, true);
    if (mib == 16) {
      // The unchanged-chunk cache: same values, same destination.
      if (absl::Status s = client.Pull(names, {absl::MakeSpan(out[0])}); !s.ok()) return s;
      t = TimeCalls(client, calls, 0, nullptr, [&](int) { return client.Pull(names, {absl::MakeSpan(out[0])}); });
      if (!t.ok()) return t.status();
      const double gbs = bytes / t->seconds / kGB;
      table.Add({"a", absl::StrCat("pull ", what, ", unchanged (cache hit)"), Gbs(gbs), iperf_ref,
                 Ratio(gbs, iperf_gbs), "",
                 absl::StrFormat("same values, same buffer; %.1f MiB moved per pull", t->bytes_pulled / kMiB / calls)});
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------------------------
// b. Round trips of a 16-byte tensor.

// `bare`: gRPC's own limit on this machine (over gRPC; empty otherwise), the reference of those rows.
absl::Status RoundTripSection(PsClient& client, const std::string& transport, const std::optional<EchoRates>& bare,
                              Table& table) {
  const std::vector<std::string> names = {"b16"};
  std::vector<float> grad(4, 1.0f);
  std::vector<float> out[2] = {std::vector<float>(4), std::vector<float>(4)};
  const std::vector<absl::Span<const float>> grads = {absl::MakeConstSpan(grad)};
  const double kTarget = 10000;
  const double reference_rate = bare.has_value() ? bare->callback : kTarget;
  const std::string reference =
      bare.has_value() ? absl::StrFormat("bare gRPC echo, callback client: %.0f/s", bare->callback) : "target 10k/s";
  const std::string target = bare.has_value() ? ">= 10k/s" : ">= 1.00x";
  const std::string bare_note =
      bare.has_value() ? absl::StrFormat("; the same echo with a blocking client: %.0f/s", bare->blocking) : "";
  auto rate = [&](const std::string& op, const std::function<absl::Status(int64_t)>& call,
                  bool pulls) -> absl::Status {
    Progress(absl::StrCat("b: ", op, " of a 16-byte tensor for ", FLAGS_roundtrip_seconds, " s"));
    int64_t pulled = 0;
    absl::StatusOr<CallRate> rate = RunCallsFor(call, [&] { pulled = client.bytes_pulled(); });
    if (!rate.ok()) return rate.status();
    const int64_t calls = rate->calls;
    const double seconds = rate->seconds, per_second = rate->per_second();
    const bool hit = pulls && client.bytes_pulled() - pulled < calls * 16;
    table.Add({"b", absl::StrCat(op, " 16 B, 1 server, ", transport, ", round trips/s", hit ? " (cache hit)" : ""),
               absl::StrFormat("%.0f/s", per_second), reference, Ratio(per_second, reference_rate), target,
               absl::StrFormat("%d calls, %.2f ms each%s", calls, 1e3 * seconds / calls, bare_note)});
    return absl::OkStatus();
  };
  if (absl::Status s = rate("push", [&](int64_t) { return client.Push(names, grads, 1); }, false); !s.ok()) return s;
  // Alternating destinations: by the client's contract a pull into another buffer receives the bytes.
  return rate("pull", [&](int64_t i) { return client.Pull(names, {absl::MakeSpan(out[i % 2])}); }, true);
}

// What carries a run's gradients and values: a transport and a wire precision.
struct DataPlane {
  tessera::v1::Transport transport;
  WirePrecision wire;
};

// --transports x --wires, parsed.
absl::StatusOr<std::vector<DataPlane>> DataPlanes() {
  absl::StatusOr<std::vector<tessera::v1::Transport>> transports = Transports();
  if (!transports.ok()) return transports.status();
  std::vector<WirePrecision> wires;
  for (absl::string_view name : absl::StrSplit(FLAGS_wires, ',', absl::SkipEmpty())) {
    WirePrecision p;
    if (!tessera::v1::WireSpec::Precision_Parse(absl::AsciiStrToUpper(name), &p)) {
      return absl::InvalidArgumentError(absl::StrCat("--wires: '", name, "' is none of fp32, bf16, fp16"));
    }
    wires.push_back(p);
  }
  if (wires.empty()) return absl::InvalidArgumentError("--wires: name at least one of fp32, bf16, fp16");
  std::vector<DataPlane> out;
  for (tessera::v1::Transport t : *transports) {
    for (WirePrecision w : wires) out.push_back({t, w});
  }
  return out;
}

void SetDataPlane(const DataPlane& plane, JobSpec& job) {
  SetTransport(plane.transport, job);
  job.mutable_wire()->set_gradients(plane.wire);
  job.mutable_wire()->set_values(plane.wire);
}

std::string DataPlaneLabel(const DataPlane& plane) {
  return absl::StrCat(TransportLabel(plane.transport), ", ", PrecisionName(plane.wire));
}

// a and b: one cluster per transport and server count.
void TransferSections(const Context& ctx, bool run_a, bool run_b, Table& table) {
  absl::StatusOr<std::vector<int>> sizes = ParseInts("sizes_mib", FLAGS_sizes_mib);
  absl::StatusOr<std::vector<int>> counts = ParseInts("server_counts", FLAGS_server_counts);
  if (!sizes.ok() || !counts.ok()) {
    table.Failed("a", "flags", sizes.ok() ? counts.status() : sizes.status());
    return;
  }
  double iperf_gbs = NAN;
  std::string iperf_ref;
  if (run_a) {
    std::string why;
    iperf_gbs = MeasureIperf(ctx, &why);
    iperf_ref = std::isfinite(iperf_gbs) ? absl::StrFormat("iperf3 TCP 1 stream: %.2f GB/s", iperf_gbs)
                                         : absl::StrCat("iperf3: n/a, ", why);
    Progress(iperf_ref);
  }
  std::vector<int> server_counts = run_a ? *counts : std::vector<int>{};
  if (run_b && std::find(server_counts.begin(), server_counts.end(), 1) == server_counts.end()) {
    server_counts.insert(server_counts.begin(), 1);
  }
  absl::StatusOr<std::vector<tessera::v1::Transport>> transports = Transports();
  if (!transports.ok()) {
    table.Failed(run_a ? "a" : "b", "flags", transports.status());
    return;
  }
  // What gRPC itself does on this machine, measured once: the gRPC rows of b compare with it, a's 1 MiB pushes
  // say it.
  std::optional<EchoRates> bare;
  if (std::find(transports->begin(), transports->end(), tessera::v1::GRPC) != transports->end()) {
    absl::StatusOr<EchoRates> measured = MeasureBareGrpc(ctx);
    if (measured.ok()) {
      bare = *measured;
    } else {
      Progress(absl::StrCat("a/b: the bare gRPC service failed (", measured.status().ToString(),
                            "); b's gRPC rows compare with 10k/s"));
    }
  }
  for (tessera::v1::Transport transport : *transports) {
  for (int servers : server_counts) {
    const std::optional<EchoRates> bare_here =
        transport == tessera::v1::GRPC ? bare : std::optional<EchoRates>();
    const std::string section = run_a ? "a" : "b";
    const std::string label = TransportLabel(transport);
    Progress(absl::StrCat("a/b: starting a scheduler and ", servers, " server(s), ", label));
    JobSpec job = TransferJob("bench-transfer", servers, FLAGS_chunk_bytes, 0);
    SetTransport(transport, job);
    absl::StatusOr<std::unique_ptr<Cluster>> cluster =
        StartCluster(ctx, absl::StrCat("transfer-", servers, "-", label), job, 0, {});
    if (!cluster.ok()) {
      table.Failed(section, absl::StrCat(servers, " server(s): start"), cluster.status());
      continue;
    }
    absl::StatusOr<std::unique_ptr<PsClient>> client = ConnectClient(**cluster);
    std::vector<tessera::v1::ParameterSpec> params;
    if (run_a) {
      for (int mib : *sizes) params.push_back(FloatParam(absl::StrCat("a", mib), mib * (1 << 20) / 4));
    }
    params.push_back(FloatParam("b16", 4));
    absl::Status status = client.ok() ? (*client)->Declare(params) : client.status();
    if (!status.ok()) {
      table.Failed(section, absl::StrCat(servers, " server(s): connect and declare"), status);
      continue;
    }
    if (run_a) {
      status = TransferSection(**client, servers, *sizes, iperf_gbs, iperf_ref, label, bare_here, table);
      if (!status.ok()) table.Failed("a", absl::StrCat(servers, " server(s)"), status);
    }
    if (run_b && servers == 1) {
      status = RoundTripSection(**client, label, bare_here, table);
      if (!status.ok()) table.Failed("b", "round trips", status);
    }
    (*client)->Done().IgnoreError();  // the job ends; the daemons exit (or are stopped)
    client->reset();
    (*cluster)->WaitForJob(absl::Seconds(10)).IgnoreError();
  }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// g. The cost of TLS.

void TlsSection(const Context& ctx, Table& table) {
  absl::StatusOr<std::string> dir = MakeDir(ctx, "tls-credentials");
  absl::StatusOr<SecurityOptions> tls = dir.ok() ? MakeRunCredentials(*dir, /*tls=*/true)
                                                 : absl::StatusOr<SecurityOptions>(dir.status());
  if (!tls.ok()) {
    table.Failed("g", "credentials", tls.status());
    return;
  }
  SecurityOptions token_only;
  token_only.token_file = tls->token_file;
  constexpr int kMiBs = 16;
  const int64_t n = kMiBs * kMiB / sizeof(float);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  const int calls = std::max(1, FLAGS_repeats);
  struct Figures {
    double push_gbs = NAN, pull_gbs = NAN, round_trips = NAN;
  };
  auto measure = [&](const std::string& name, const SecurityOptions& security) -> absl::StatusOr<Figures> {
    Progress(absl::StrCat("g: 16 MiB push and pull, 16 B round trips, ", name));
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster,
                             StartCluster(ctx, "tls-" + name, TransferJob("bench-tls", 1, FLAGS_chunk_bytes, 0), 0,
                                          {}, security));
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, ConnectClient(*cluster, security));
    TESSERA_RETURN_IF_ERROR(client->Declare({FloatParam("g16", n), FloatParam("b16", 4)}));
    std::vector<float> grad(n, 1.0f);
    std::vector<float> out[2] = {std::vector<float>(n), std::vector<float>(n)};
    const std::vector<std::string> names = {"g16"};
    const std::vector<absl::Span<const float>> grads = {absl::MakeConstSpan(grad)};
    auto push = [&](int) { return client->Push(names, grads, 1); };
    auto pull = [&](int i) { return client->Pull(names, {absl::MakeSpan(out[i % 2])}); };
    TESSERA_RETURN_IF_ERROR(push(0));  // warm-up: connections, handshakes, first touch
    TESSERA_RETURN_IF_ERROR(pull(0));
    TESSERA_RETURN_IF_ERROR(pull(1));
    Figures f;
    TESSERA_ASSIGN_OR_RETURN(Timing t, TimeCalls(*client, calls, 0, nullptr, push));
    f.push_gbs = bytes / t.seconds / kGB;
    TESSERA_ASSIGN_OR_RETURN(t, TimeCalls(*client, calls, bytes, push, pull));  // values change before each pull
    if (!t.moved_bytes) return absl::InternalError("a timed pull hit the unchanged-chunk cache");
    f.pull_gbs = bytes / t.seconds / kGB;
    const std::vector<std::string> small = {"b16"};
    std::vector<float> tiny(4, 1.0f);
    for (int i = 0; i < 20; ++i) TESSERA_RETURN_IF_ERROR(client->Push(small, {absl::MakeConstSpan(tiny)}, 1));
    const Clock::time_point start = Clock::now();
    int64_t done = 0;
    double seconds = 0;
    while ((seconds = SecondsSince(start)) < FLAGS_roundtrip_seconds) {
      TESSERA_RETURN_IF_ERROR(client->Push(small, {absl::MakeConstSpan(tiny)}, 1));
      ++done;
    }
    f.round_trips = done / seconds;
    client->Done().IgnoreError();
    client.reset();
    cluster->WaitForJob(absl::Seconds(10)).IgnoreError();
    return f;
  };
  absl::StatusOr<Figures> plain = measure("plaintext", token_only);
  absl::StatusOr<Figures> mtls = plain.ok() ? measure("mutual-tls", *tls) : plain.status();
  if (!mtls.ok()) {
    table.Failed("g", "TLS against plaintext", mtls.status());
    return;
  }
  table.Add({"g", "push 16 MiB, 1 server, mutual TLS", Gbs(mtls->push_gbs),
             absl::StrCat("plaintext: ", Gbs(plain->push_gbs)), Ratio(mtls->push_gbs, plain->push_gbs), "",
             "both with the job token"});
  table.Add({"g", "pull 16 MiB, 1 server, mutual TLS", Gbs(mtls->pull_gbs),
             absl::StrCat("plaintext: ", Gbs(plain->pull_gbs)), Ratio(mtls->pull_gbs, plain->pull_gbs), "",
             "values changed before every pull"});
  table.Add({"g", "push 16 B, 1 server, mutual TLS, round trips/s", absl::StrFormat("%.0f/s", mtls->round_trips),
             absl::StrFormat("plaintext: %.0f/s", plain->round_trips), Ratio(mtls->round_trips, plain->round_trips),
             "", ""});
}

// ---------------------------------------------------------------------------------------------------------------
// c. Update throughput.

// The reference loops: y += a*x, compiled as the update rules are (vectorised, AVX2 where the CPU has it), so
// that it runs at the speed memory allows.
TESSERA_CPU_CLONES __attribute__((noinline)) void Axpy(float* __restrict y, const float* __restrict x, int64_t n,
                                                       float a) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// The bytes an update rule must read and write per parameter: the gradient read, the value written and (unless
// the rule replaces it, as ROUND_MEAN does) read, and each slot of state read and written.
int TouchedBytes(const UpdateRule& rule, bool reads_values) { return (reads_values ? 12 : 8) + 8 * rule.state_slots(); }

// The limit memory sets for a loop that touches `bytes` per element, from a reference loop over the same arrays
// that touches `reference_bytes` and ran at `reference_gbs` (GB/s of elements' float32), and the fraction of it
// reached.
std::string Roofline(double gbs, double reference_gbs, int reference_bytes, int bytes) {
  const double limit = reference_gbs * reference_bytes / bytes;
  return absl::StrFormat("memory's limit for the %d bytes it touches per parameter: %.2f GB/s, %.0f%% reached", bytes,
                         limit, 100.0 * gbs / limit);
}

void UpdateSection(Table& table) {
  const int64_t n = static_cast<int64_t>(FLAGS_update_mib * kMiB / sizeof(float));
  const double bytes = n * sizeof(float);
  const int repeats = std::max(1, FLAGS_update_repeats);
  std::vector<float> params(n, 0.5f), grad(n), state(2 * n, 0.0f);
  for (int64_t i = 0; i < n; ++i) grad[i] = 1e-3f * static_cast<float>(i % 97);
  auto time_median = [&](const std::function<void(int)>& body) {
    body(0);  // warm-up (first touch)
    std::vector<double> seconds;
    for (int r = 1; r <= repeats; ++r) {
      const Clock::time_point start = Clock::now();
      body(r);
      seconds.push_back(SecondsSince(start));
    }
    return Median(seconds);
  };
  Progress(absl::StrCat("c: updates over ", FLAGS_update_mib, " MiB, ", repeats, " times each"));
  // The reference: a plain loop over the same arrays (a read from a flag, so nothing is folded away).
  const float a = -static_cast<float>(FLAGS_update_mib) * 1e-6f;
  const double axpy_s = time_median([&](int) {
    Axpy(params.data(), grad.data(), n, a);
  });
  const double axpy_gbs = bytes / axpy_s / kGB;
  const std::string reference = absl::StrFormat("y += a*x: %.2f GB/s", axpy_gbs);

  struct Rule {
    std::string label;
    tessera::v1::OptimizerSpec::Kind kind;
    float momentum;
    std::string target;
  };
  for (const Rule& rule : {Rule{"SGD", tessera::v1::OptimizerSpec::SGD, 0.0f, ""},
                           Rule{"SGD, momentum 0.9", tessera::v1::OptimizerSpec::SGD, 0.9f, ""},
                           Rule{"Adam", tessera::v1::OptimizerSpec::ADAM, 0.0f, ">= 0.4x"},
                           Rule{"AdamW, weight decay 0.01", tessera::v1::OptimizerSpec::ADAMW, 0.0f, ">= 0.4x"}}) {
    tessera::v1::OptimizerSpec spec;
    spec.set_kind(rule.kind);
    spec.set_learning_rate(1e-4f);
    spec.set_momentum(rule.momentum);
    if (rule.kind == tessera::v1::OptimizerSpec::ADAMW) spec.set_weight_decay(0.01f);
    if (rule.kind == tessera::v1::OptimizerSpec::ADAM || rule.kind == tessera::v1::OptimizerSpec::ADAMW) {
      spec.set_beta1(0.9f);
      spec.set_beta2(0.999f);
      spec.set_epsilon(1e-8f);
    }
    const UpdateRule update(spec);
    std::fill(state.begin(), state.end(), 0.0f);
    const size_t state_floats = static_cast<size_t>(update.state_slots()) * n;
    int64_t step = 0;
    const double s = time_median([&](int) {
      update.Apply(absl::MakeSpan(params), absl::MakeConstSpan(grad), absl::MakeSpan(state.data(), state_floats),
                   ++step, 1.0f);
    });
    const double gbs = bytes / s / kGB;
    table.Add({"c", absl::StrCat("update ", FLAGS_update_mib, " MiB, ", rule.label), Gbs(gbs), reference,
               Ratio(gbs, axpy_gbs), rule.target,
               absl::StrCat("GB/s of parameters updated, one thread; ", Roofline(gbs, axpy_gbs, 12, TouchedBytes(update, true)))});
  }

  // The servers' work when the script's optimizer steps: summing and adding, against y += x.
  const double add_s = time_median([&](int) {
    Axpy(params.data(), grad.data(), n, 1.0f);
  });
  const double add_gbs = bytes / add_s / kGB;
  const std::string add_reference = absl::StrFormat("y += x: %.2f GB/s", add_gbs);
  SyncRound round;
  round.Prepare(n, 2, /*keep_apart=*/false);
  const double sum_s = time_median([&](int) {
    round.Add(0, grad, 1);
    round.Add(1, grad, 3);
    round.Reset();
  });
  const double sum_gbs = 2 * bytes / sum_s / kGB;
  table.Add({"c", absl::StrCat("a SYNC round's weighted sum, 2 workers x ", FLAGS_update_mib, " MiB (SyncRound::Add)"),
             Gbs(sum_gbs), add_reference, Ratio(sum_gbs, add_gbs), "", "GB/s of gradients summed, one thread"});
  for (const auto& [label, kind] :
       {std::pair<std::string, tessera::v1::OptimizerSpec::Kind>{"ROUND_MEAN (SCRIPT in SYNC: values := the mean)",
                                                                 tessera::v1::OptimizerSpec::ROUND_MEAN},
        {"SCRIPT (ASYNC: values += a worker's change)", tessera::v1::OptimizerSpec::SCRIPT}}) {
    tessera::v1::OptimizerSpec spec;
    spec.set_kind(kind);
    spec.set_learning_rate(1.0f);
    const UpdateRule update(spec);
    int64_t step = 0;
    const double s = time_median([&](int) {
      update.Apply(absl::MakeSpan(params), absl::MakeConstSpan(grad), {}, ++step, 1.0f, 0.25f);
    });
    const double gbs = bytes / s / kGB;
    table.Add({"c", absl::StrCat("update ", FLAGS_update_mib, " MiB, ", label), Gbs(gbs), add_reference,
               Ratio(gbs, add_gbs), "",
               absl::StrCat("GB/s of parameters updated, one thread; ", Roofline(gbs, add_gbs, 12, TouchedBytes(update, kind != tessera::v1::OptimizerSpec::ROUND_MEAN)))});
  }
  double checksum = 0;
  for (int64_t i = 0; i < n; i += 4096) checksum += params[i];
  if (!std::isfinite(checksum)) Progress("c: warning: parameters became non-finite");
}

// ---------------------------------------------------------------------------------------------------------------
// d. End to end: the Quick start MLP.

struct RunResult {
  double wall_seconds = NAN;               // summary.json
  double training_seconds = NAN;           // summary.json "training": end of the first step to end of the last
  int64_t training_steps = 0;              // steps in that span
  std::optional<double> seconds_to_target;  // summary.json
  double command_seconds = NAN;            // the whole command, as measured here
  int64_t steps = 0;
  int64_t push_bytes = 0;                  // summary.json: values pushed to the servers
  int64_t replica_bytes = 0;               // summary.json: what the servers handed to backups
};

// Runs `argv` to completion and reads `run_dir`/summary.json.
absl::StatusOr<RunResult> RunToSummary(const std::string& name, const std::vector<std::string>& argv,
                                       const std::string& run_dir, const std::string& log) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(name, argv, log);
  if (!p.ok()) return p.status();
  if (!(*p)->WaitForExit(absl::Seconds(FLAGS_run_timeout_s))) {
    (*p)->Stop(absl::Seconds(10));
    return absl::DeadlineExceededError(absl::StrCat(name, " did not finish in ", FLAGS_run_timeout_s, " s"));
  }
  RunResult r;
  r.command_seconds = SecondsSince(start);
  if (absl::Status s = (*p)->ExitStatus(); !s.ok()) return s;
  absl::StatusOr<nlohmann::json> summary = ReadJson(run_dir + "/summary.json");
  if (!summary.ok()) return summary.status();
  if ((*summary)["wall_seconds"].is_number()) r.wall_seconds = (*summary)["wall_seconds"].get<double>();
  if ((*summary)["seconds_to_target"].is_number()) r.seconds_to_target = (*summary)["seconds_to_target"].get<double>();
  if ((*summary)["steps"].is_number()) r.steps = (*summary)["steps"].get<int64_t>();
  if ((*summary)["push_bytes"].is_number()) r.push_bytes = (*summary)["push_bytes"].get<int64_t>();
  if ((*summary)["replica_bytes"].is_number()) r.replica_bytes = (*summary)["replica_bytes"].get<int64_t>();
  const nlohmann::json& training = (*summary)["training"];
  if (training.is_object() && training["seconds"].is_number()) {
    r.training_seconds = training["seconds"].get<double>();
    r.training_steps = training["to_clock"].get<int64_t>() - training["from_clock"].get<int64_t>();
  }
  return r;
}

void EndToEndSection(const Context& ctx, Table& table) {
  absl::StatusOr<JobSpec> sync_job = LoadJobSpec(FLAGS_sync_job);
  absl::StatusOr<JobSpec> local_job = LoadJobSpec(FLAGS_local_job);
  if (!sync_job.ok() || !local_job.ok()) {
    table.Failed("d", "job files", sync_job.ok() ? local_job.status() : sync_job.status());
    return;
  }
  const int per_worker_batch = sync_job->batch_size();

  struct Config {
    std::string label;  // row label
    bool local;
    int servers, workers;
    int batch;           // per worker (or the local batch)
    int reference;       // index of the local config this one is compared with; -1: itself a reference
    DataPlane plane = {tessera::v1::GRPC, tessera::v1::WireSpec::FP32};
  };
  std::vector<Config> configs = {
      {absl::StrCat("local baseline, batch ", per_worker_batch), true, 0, 1, per_worker_batch, -1},
      {absl::StrCat("local baseline, batch ", 2 * per_worker_batch), true, 0, 1, 2 * per_worker_batch, -1},
  };
  absl::StatusOr<std::vector<DataPlane>> planes = DataPlanes();
  if (!planes.ok()) {
    table.Failed("d", "flags", planes.status());
    return;
  }
  for (const DataPlane& plane : *planes) {
    const std::string over = DataPlaneLabel(plane);
    configs.push_back({absl::StrCat("1 server + 1 worker, sync, ", over, ", batch ", per_worker_batch), false, 1, 1,
                       per_worker_batch, 0, plane});
    configs.push_back({absl::StrCat("2 servers + 2 workers, sync, ", over, ", batch ", per_worker_batch, "/worker (",
                                    2 * per_worker_batch, " global)"),
                       false, 2, 2, per_worker_batch, 1, plane});
  }
  // kind 0: fixed steps; kind 1: to the target accuracy.
  for (int kind = 0; kind < 2; ++kind) {
    if (kind == 1 && FLAGS_target_accuracy <= 0) break;
    std::vector<absl::StatusOr<RunResult>> results;
    for (size_t i = 0; i < configs.size(); ++i) {
      const Config& c = configs[i];
      JobSpec job = c.local ? *local_job : *sync_job;
      job.set_batch_size(c.batch);
      job.mutable_stop()->Clear();
      if (!c.local) SetDataPlane(c.plane, job);
      if (kind == 0) {
        job.mutable_stop()->set_max_steps(FLAGS_steps);
        // Every run of the fixed steps evaluates once, after its last step: nothing evaluates while it is timed.
        job.set_eval_every_steps(static_cast<int32_t>(FLAGS_steps));
        job.set_eval_every_seconds(0);
      } else {
        job.mutable_stop()->set_target_accuracy(static_cast<float>(FLAGS_target_accuracy));
        job.mutable_stop()->set_epochs(10);
      }
      if (!c.local) {
        job.mutable_cluster()->set_num_servers(c.servers);
        job.mutable_cluster()->set_num_workers(c.workers);
      }
      const std::string name = absl::StrCat("e2e-", kind == 0 ? "steps" : "target", "-", i);
      Progress(absl::StrCat("d: ", c.label, ", ",
                            kind == 0 ? absl::StrCat(FLAGS_steps, " steps")
                                      : absl::StrCat("to ", FLAGS_target_accuracy, " test accuracy")));
      absl::StatusOr<std::string> dir = MakeDir(ctx, name);
      absl::Status written = dir.ok() ? WriteJob(job, *dir + "/job.pbtxt") : dir.status();
      if (!written.ok()) {
        results.push_back(written);
        continue;
      }
      const std::string run_dir = *dir + "/run";
      std::vector<std::string> argv =
          c.local ? std::vector<std::string>{ctx.bin_dir + "/tessera-worker", "--local", "--job=" + *dir + "/job.pbtxt",
                                             "--run_dir=" + run_dir, "--device=" + FLAGS_device, "--http_port=-1"}
                  : std::vector<std::string>{ctx.bin_dir + "/tessera-launch", "--linger_s=0", "--job=" + *dir + "/job.pbtxt",
                                             "--run_dir=" + run_dir, "--device=" + FLAGS_device};
      results.push_back(RunToSummary(c.label, argv, run_dir, *dir + "/run.log"));
    }
    for (size_t i = 0; i < configs.size(); ++i) {
      const Config& c = configs[i];
      const std::string what = kind == 0 ? absl::StrCat(c.label, ": ms per step, ", FLAGS_steps, " steps")
                                         : absl::StrCat(c.label, ": s to ", FLAGS_target_accuracy);
      if (!results[i].ok()) {
        table.Failed("d", what, results[i].status());
        continue;
      }
      // Fixed steps: the steady state, milliseconds per step between the end of the first step and the end of
      // the last (start-up, declaration and the final evaluation are outside it, for every row alike).
      auto figure = [&](const RunResult& r) -> double {
        if (kind == 1) return r.seconds_to_target.value_or(NAN);
        return r.training_steps > 0 ? 1e3 * r.training_seconds / r.training_steps : NAN;
      };
      const char* unit = kind == 0 ? "ms" : "s";
      const double value = figure(*results[i]);
      const std::string value_text = std::isfinite(value) ? absl::StrFormat("%.2f %s", value, unit) : "not reached";
      std::string reference = "(reference)";
      std::string ratio = std::isfinite(value) ? "1.00x" : "n/a";
      std::string target;
      if (c.reference >= 0) {
        const absl::StatusOr<RunResult>& ref = results[c.reference];
        const double ref_value = ref.ok() ? figure(*ref) : NAN;
        reference = absl::StrCat(configs[c.reference].label, ": ",
                                 std::isfinite(ref_value) ? absl::StrFormat("%.2f %s", ref_value, unit) : "n/a");
        ratio = Ratio(value, ref_value);
        // The targets: gRPC with float32, and UCX with bfloat16.
        const bool ucx = c.plane.transport == tessera::v1::UCX;
        if (kind == 0 && c.workers == 1 && ucx == (c.plane.wire == tessera::v1::WireSpec::BF16) &&
            (ucx || c.plane.wire == tessera::v1::WireSpec::FP32)) {
          target = ucx ? "<= 1.5x" : "<= 2.3x";
        }
        if (kind == 1 && c.workers == 2) target = "<= 1.5x";
      }
      table.Add({"d", what, value_text, reference, ratio, target,
                 absl::StrFormat("%d steps; summary wall %.2f s; whole command %.1f s", results[i]->steps,
                                 results[i]->wall_seconds, results[i]->command_seconds)});
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// r. Replication's cost.

// What authenticating a hand-over costs a primary (the backup's check is the same pass): a credential over a
// Replicate of 16 MiB of values, against copying those bytes once.
void ReplicaCredentialRow(Table& table) {
  absl::StatusOr<std::unique_ptr<ReplicaKey>> primary = ReplicaKey::Generate();
  absl::StatusOr<std::unique_ptr<ReplicaKey>> backup = ReplicaKey::Generate();
  if (!primary.ok() || !backup.ok()) {
    table.Failed("r", "replication keys", primary.ok() ? backup.status() : primary.status());
    return;
  }
  constexpr size_t kBytes = size_t{16} << 20;
  tessera::v1::ReplicateBatch batch;
  tessera::v1::ReplicateRequest& unit = *batch.add_units();
  unit.set_server_id(0);
  unit.mutable_state()->set_param("w");
  unit.mutable_state()->set_values(std::string(kBytes, '\x01'));
  std::vector<char> copy(kBytes);
  std::vector<double> credential_s, copy_s;
  std::string credential;
  for (int r = 0; r <= 10; ++r) {
    Clock::time_point start = Clock::now();
    credential = (*primary)->Credential((*backup)->public_key(), 1, 1, batch);
    if (r > 0) credential_s.push_back(SecondsSince(start));
    start = Clock::now();
    std::memcpy(copy.data(), unit.state().values().data(), kBytes);
    if (r > 0) copy_s.push_back(SecondsSince(start));
  }
  if (credential.size() != kReplicaCredentialBytes) {
    table.Failed("r", "a hand-over's credential", absl::InternalError("no credential"));
    return;
  }
  const double gbs = kBytes / Median(credential_s) / kGB, copy_gbs = kBytes / Median(copy_s) / kGB;
  table.Add({"r", "a hand-over's credential (AES-256-GMAC of its serialization), 16 MiB of values", Gbs(gbs),
             absl::StrFormat("memcpy: %.2f GB/s", copy_gbs), Ratio(gbs, copy_gbs), "",
             "GB/s of hand-over authenticated, one thread, the primary's side (the backup's check is the same pass)"});
}

void ReplicationSection(const Context& ctx, Table& table) {
  ReplicaCredentialRow(table);
  absl::StatusOr<JobSpec> sync_job = LoadJobSpec(FLAGS_sync_job);
  if (!sync_job.ok()) {
    table.Failed("r", "job file", sync_job.status());
    return;
  }
  for (const auto mode : {tessera::v1::ConsistencySpec::SYNC, tessera::v1::ConsistencySpec::ASYNC}) {
    const std::string label = absl::StrCat("3 servers + 2 workers, ", mode == tessera::v1::ConsistencySpec::SYNC ? "sync" : "async", ", gRPC");
    absl::StatusOr<RunResult> runs[2];
    for (int backups = 0; backups < 2; ++backups) {
      JobSpec job = *sync_job;
      job.mutable_consistency()->set_mode(mode);
      job.mutable_cluster()->set_num_servers(3);
      job.mutable_cluster()->set_num_workers(2);
      job.mutable_replication()->set_backups(backups);
      job.mutable_stop()->Clear();
      job.mutable_stop()->set_max_steps(FLAGS_steps);
      job.set_eval_every_steps(static_cast<int32_t>(FLAGS_steps));  // evaluates once, after the timed span
      job.set_eval_every_seconds(0);
      SetDataPlane({tessera::v1::GRPC, tessera::v1::WireSpec::FP32}, job);
      const std::string name = absl::StrCat("replication-", mode, "-", backups);
      Progress(absl::StrCat("r: ", label, ", backups ", backups, ", ", FLAGS_steps, " steps"));
      absl::StatusOr<std::string> dir = MakeDir(ctx, name);
      absl::Status written = dir.ok() ? WriteJob(job, *dir + "/job.pbtxt") : dir.status();
      if (!written.ok()) {
        runs[backups] = written;
        continue;
      }
      const std::string run_dir = *dir + "/run";
      runs[backups] = RunToSummary(absl::StrCat(label, ", backups ", backups),
                                   {ctx.bin_dir + "/tessera-launch", "--linger_s=0", "--job=" + *dir + "/job.pbtxt",
                                    "--run_dir=" + run_dir, "--device=" + FLAGS_device},
                                   run_dir, *dir + "/run.log");
    }
    const std::string what = absl::StrCat(label, ", backups 1: ms per step, ", FLAGS_steps, " steps");
    if (!runs[0].ok() || !runs[1].ok()) {
      table.Failed("r", what, runs[0].ok() ? runs[1].status() : runs[0].status());
      continue;
    }
    auto ms = [](const RunResult& r) {
      return r.training_steps > 0 ? 1e3 * r.training_seconds / r.training_steps : NAN;
    };
    table.Add({"r", what, absl::StrFormat("%.2f ms", ms(*runs[1])),
               absl::StrFormat("backups 0: %.2f ms", ms(*runs[0])), Ratio(ms(*runs[1]), ms(*runs[0])), "",
               "steady state, end of the first step to end of the last"});
    const RunResult& r = *runs[1];
    const double steps = static_cast<double>(std::max<int64_t>(1, r.steps));
    const double replica_kb = r.replica_bytes / steps / 1024.0, pushed_kb = r.push_bytes / steps / 1024.0;
    table.Add({"r", absl::StrCat(label, ", backups 1: bytes handed to backups per step"),
               absl::StrFormat("%.1f KiB", replica_kb), absl::StrFormat("pushed to the servers: %.1f KiB", pushed_kb),
               Ratio(replica_kb, pushed_kb), "",
               absl::StrFormat("%lld steps; totals %lld and %lld bytes", static_cast<long long>(r.steps),
                               static_cast<long long>(r.replica_bytes), static_cast<long long>(r.push_bytes))});
  }
}

// ---------------------------------------------------------------------------------------------------------------
// e. GPU stand-in: simulated compute, real communication.

bool WorkerHasFlag(const Context& ctx, const std::string& flag) {
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start("tessera-worker --help", {ctx.bin_dir + "/tessera-worker", "--help"},
                     ctx.work_dir + "/worker-help.txt");
  if (!p.ok() || !(*p)->WaitForExit(absl::Seconds(30))) return false;
  std::ifstream in(ctx.work_dir + "/worker-help.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return absl::StrContains(text, "-" + flag);
}

JobSpec StandInJob(int workers) {
  JobSpec job;
  job.set_name("bench-gpu-stand-in");
  for (int width : {2048, 1024, 512}) job.mutable_model()->mutable_mlp()->add_hidden_sizes(width);
  tessera::v1::DataSpec& data = *job.mutable_data();
  data.set_format(tessera::v1::DataSpec::SYNTHETIC);
  data.set_synthetic_train_examples(4096);
  data.set_synthetic_test_examples(16);  // evaluation runs on worker 0's path: keep it short
  data.set_synthetic_features(784);
  data.set_synthetic_classes(10);
  job.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::SGD);
  job.mutable_optimizer()->set_learning_rate(0.01f);
  job.mutable_optimizer()->set_momentum(0.9f);
  job.set_batch_size(64);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::SYNC);
  job.mutable_stop()->set_max_steps(FLAGS_gpu_steps);
  job.set_eval_every_steps(std::max<int64_t>(1, FLAGS_gpu_steps / 4));
  job.set_seed(42);
  job.set_chunk_bytes(FLAGS_chunk_bytes);
  job.mutable_cluster()->set_num_servers(2);
  job.mutable_cluster()->set_num_workers(workers);
  return job;
}

void StandInSection(const Context& ctx, Table& table) {
  const double t_ms = FLAGS_simulate_compute_ms;
  const double compute_only = 1000.0 / t_ms;
  const std::string reference = absl::StrFormat("1000/T = %.1f steps/s (T = %d ms)", compute_only, FLAGS_simulate_compute_ms);
  const bool supported = WorkerHasFlag(ctx, "simulate_compute_ms");
  absl::StatusOr<std::vector<DataPlane>> planes = DataPlanes();
  if (!planes.ok()) {
    table.Failed("e", "flags", planes.status());
    return;
  }
  for (const DataPlane& plane : *planes) {
  for (int workers : {1, 2}) {
    const std::string over = DataPlaneLabel(plane);
    const std::string what =
        absl::StrCat("GPU stand-in, 16 MiB MLP, 2 servers + ", workers, workers == 1 ? " worker" : " workers",
                     ", sync, ", over, ": steps/s");
    const std::string target = workers == 1 ? ">= 0.9x" : ">= 0.8x";
    if (!supported) {
      table.Add({"e", what, "n/a (needs --simulate_compute_ms)", reference, "n/a", target,
                 "tessera-worker has no --simulate_compute_ms yet"});
      continue;
    }
    Progress(absl::StrCat("e: GPU stand-in, ", workers, " worker(s), ", over, ", ", FLAGS_gpu_steps, " steps"));
    JobSpec job = StandInJob(workers);
    SetDataPlane(plane, job);
    absl::StatusOr<std::unique_ptr<Cluster>> cluster =
        StartCluster(ctx, absl::StrCat("stand-in-", workers, "-", over), job, workers,
                     {"--device=" + FLAGS_device, absl::StrCat("--simulate_compute_ms=", FLAGS_simulate_compute_ms)});
    absl::Status status = cluster.ok() ? (*cluster)->WaitForJob(absl::Seconds(FLAGS_run_timeout_s)) : cluster.status();
    if (!status.ok()) {
      table.Failed("e", what, status);
      continue;
    }
    // Steps/s between the first and the last evaluation record: start-up and the first steps are left out.
    const std::vector<nlohmann::json> records = ReadJsonLines((*cluster)->dir + "/run/metrics.jsonl");
    double per_second = NAN;
    std::string note = "no two evaluation records in metrics.jsonl";
    if (records.size() >= 2) {
      const nlohmann::json& first = records.front();
      const nlohmann::json& last = records.back();
      const double steps = last.value("step", 0.0) - first.value("step", 0.0);
      const double seconds = last.value("wall_seconds", 0.0) - first.value("wall_seconds", 0.0);
      if (steps > 0 && seconds > 0) {
        per_second = steps / seconds;
        note = absl::StrFormat("steps %d to %d; batch 64/worker", first.value("step", 0), last.value("step", 0));
      }
    }
    table.Add({"e", what, std::isfinite(per_second) ? absl::StrFormat("%.1f steps/s", per_second) : "n/a", reference,
               Ratio(per_second, compute_only), target, note});
  }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// f. Server memory.

void MemorySection(const Context& ctx, Table& table) {
  const int params = std::max(1, FLAGS_memory_params);
  const int64_t per_param = static_cast<int64_t>(FLAGS_memory_mib * kMiB / sizeof(float) / params);
  const double model_bytes = static_cast<double>(per_param) * params * sizeof(float);
  const JobSpec job = TransferJob("bench-memory", 1, FLAGS_memory_chunk_bytes, 0.9f);
  const UpdateRule rule(job.optimizer());
  const double held = model_bytes * (1 + rule.state_slots());
  const std::string what = absl::StrFormat("server RSS, %d MiB model (%d x %d MiB), SGD momentum, 1 server",
                                           FLAGS_memory_mib, params, static_cast<int>(per_param * 4 / kMiB));
  Progress(absl::StrCat("f: ", what));
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = StartCluster(ctx, "memory", job, 0, {});
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      cluster.ok() ? ConnectClient(**cluster) : absl::StatusOr<std::unique_ptr<PsClient>>(cluster.status());
  std::vector<tessera::v1::ParameterSpec> specs;
  std::vector<std::string> names;
  for (int i = 0; i < params; ++i) {
    names.push_back(absl::StrCat("m", i));
    specs.push_back(FloatParam(names.back(), per_param));
  }
  absl::Status status = client.ok() ? (*client)->Declare(specs) : client.status();
  if (status.ok()) {
    // One gradient buffer serves every parameter: the client's own memory is not what is measured.
    std::vector<float> grad(per_param, 1.0f);
    const std::vector<absl::Span<const float>> grads(params, absl::MakeConstSpan(grad));
    status = (*client)->Push(names, grads, 1);
  }
  if (!status.ok()) {
    table.Failed("f", what, status);
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the server settle after the push
  const pid_t pid = (*cluster)->servers[0]->pid();
  const int64_t rss = ProcStatusBytes(pid, "VmRSS");
  const int64_t peak = ProcStatusBytes(pid, "VmHWM");
  (*client)->Done().IgnoreError();
  if (rss < 0) {
    table.Failed("f", what, absl::NotFoundError(absl::StrCat("no VmRSS in /proc/", pid, "/status")));
    return;
  }
  table.Add({"f", what, absl::StrFormat("%.0f MiB", rss / kMiB),
             absl::StrFormat("held (values + %d state slot%s): %.0f MiB", rule.state_slots(),
                             rule.state_slots() == 1 ? "" : "s", held / kMiB),
             Ratio(rss, held), "<= 1.2x + 100 MiB",
             absl::StrFormat("RSS - 1.2 x held = %+.0f MiB (target <= 100); peak RSS %.0f MiB", (rss - 1.2 * held) / kMiB,
                             peak / kMiB)});
}

// ---------------------------------------------------------------------------------------------------------------

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "unknown CPU";
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  tessera::ParseProgramFlags(
      "tessera-bench [--sections=a,b,c,d,e,f] [--repeats=N] ...\n"
      "Data-plane benchmark: prints one Markdown table, every speed a ratio to a reference measured in the same run.\n"
      "Run from the repository root (the job files of section d are relative paths), or use deploy/bench/data_plane.sh.",
      "data_plane_bench", &argc, &argv);
  tessera::KeepTransientBuffersMapped();  // the bench's client is a worker: same malloc settings
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // see common/daemon/daemon_init.h
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and errors only: the progress lines are ours
  if (FLAGS_serve_echo_port > 0) return ServeEcho(FLAGS_serve_echo_port);

  const std::string sections = FLAGS_sections;
  auto want = [&](const char* s) {
    for (absl::string_view part : absl::StrSplit(sections, ',', absl::SkipEmpty())) {
      if (absl::StripAsciiWhitespace(part) == s) return true;
    }
    return false;
  };

  Context ctx;
  std::error_code error;
  ctx.bin_dir = std::filesystem::read_symlink("/proc/self/exe", error).parent_path().string();
  for (const char* daemon : {"tessera-scheduler", "tessera-server", "tessera-worker", "tessera-launch"}) {
    if (access((ctx.bin_dir + "/" + daemon).c_str(), X_OK) != 0) {
      std::cerr << "tessera-bench: " << daemon << " is not in " << ctx.bin_dir << "; build it first" << std::endl;
      return 2;
    }
  }
  const bool temporary = FLAGS_work_dir.empty();
  if (temporary) {
    std::string pattern = (std::filesystem::temp_directory_path(error) / "tessera-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      std::cerr << "tessera-bench: cannot create a temporary directory " << pattern << std::endl;
      return 2;
    }
    ctx.work_dir = pattern;
  } else {
    ctx.work_dir = std::filesystem::absolute(FLAGS_work_dir).string();
    std::filesystem::create_directories(ctx.work_dir, error);
  }
  Progress(absl::StrCat("binaries in ", ctx.bin_dir, "; logs in ", ctx.work_dir));
  const std::string remove_on_signal = temporary && !FLAGS_keep_work_dir ? ctx.work_dir : "";
  WatchTerminationSignals([remove_on_signal](int signal) {
    std::cerr << "tessera-bench: signal " << signal << "; stopping every daemon" << std::endl;
    KillAllProcesses();
    std::error_code ignored;
    if (!remove_on_signal.empty()) std::filesystem::remove_all(remove_on_signal, ignored);
    std::_Exit(128 + signal);
  });

  const Clock::time_point start = Clock::now();
  Table table;
  if (want("a") || want("b")) TransferSections(ctx, want("a"), want("b"), table);
  if (want("c")) UpdateSection(table);
  if (want("d")) EndToEndSection(ctx, table);
  if (want("e")) StandInSection(ctx, table);
  if (want("f")) MemorySection(ctx, table);
  if (want("g")) TlsSection(ctx, table);
  if (want("r")) ReplicationSection(ctx, table);
  if (want("s")) RowSection(ctx, table);

  std::cout << absl::StrFormat("Tessera data plane, %s, %s, %d cores; tessera-bench %s; %.0f s\n\n",
                               absl::FormatTime("%Y-%m-%d %H:%M", absl::Now(), absl::LocalTimeZone()), CpuModel(),
                               static_cast<int>(std::thread::hardware_concurrency()),
                               args.empty() ? "(defaults)" : absl::StrJoin(args, " "),
                               SecondsSince(start));
  table.Print(std::cout);
  std::cout << "\nGB/s = 1e9 bytes of float32 payload per second (push-then-pull counts both directions); each a "
               "median of timed calls. a, b: this process is the worker (a PsClient), the servers and scheduler are "
               "real processes on loopback, ASYNC job, chunk_bytes "
            << FLAGS_chunk_bytes
            << "; before each timed pull an untimed push changes the values, and pulls alternate between two "
               "buffers. d: local rows train alone (tessera-worker --local); the 1x1 row is compared with the local "
               "baseline of the same batch, the 2x2 row (global batch 2x) with the local baseline of the global "
               "batch; ms per step is the steady state from summary.json's training span (end of the first step to "
               "end of the last), the same for every row, with one evaluation after the last step and none inside "
               "the span (the summary's wall time and the whole command's are in the note); the runs to the target "
               "evaluate every 100 steps, so s to target is rounded up to the next evaluation. e: steps/s between the first and the "
               "last evaluation record. f: VmRSS of the server process after one push. r: ms per step as in d; bytes per "
               "step from the servers' statistics in summary.json, per clock of the job.\n";
  std::cout.flush();

  if (temporary && !FLAGS_keep_work_dir) {
    std::filesystem::remove_all(ctx.work_dir, error);
  } else {
    Progress(absl::StrCat("logs kept in ", ctx.work_dir));
  }
  return 0;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) { return tessera::bench::Main(argc, argv); }
