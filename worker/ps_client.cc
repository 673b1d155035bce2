#include "worker/ps_client.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/wire_payload.h"
#include "glog/logging.h"

namespace tessera {

using tessera::v1::PullRequest;
using tessera::v1::PullResponse;
using tessera::v1::PushRequest;
using tessera::v1::PushResponse;

namespace {

// What one chunk RPC does.
enum ChunkOp { kPull = 0, kPush = 1, kAssign = 2, kExchange = 3 };

const char* MethodName(ChunkOp op) {
  switch (op) {
    case kPull:
      return "/tessera.v1.ParameterServer/Pull";
    case kExchange:
      return "/tessera.v1.ParameterServer/PushPull";
    default:
      return "/tessera.v1.ParameterServer/Push";
  }
}

}  // namespace

// One chunk's RPC: owns everything the callback API needs until the call completes.
struct ChunkCall {
  ChunkOp op = kPull;
  // The map the call was made from, kept alive with it: a step's calls outlive a refresh of the client's map.
  std::shared_ptr<const ShardMapIndex> map;
  const tessera::v1::ChunkPlacement* placement = nullptr;  // in `map`
  size_t name_index = 0;  // also the priority: lower goes first at a busy server
  int server_id = 0;
  std::string server;
  grpc::GenericStub* stub = nullptr;  // one of the server's connections
  absl::Span<float> dst;  // pull and exchange: where the chunk's values go
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  // Filled on completion.
  absl::Status status;
  int64_t version = -1;
  int64_t clock_version = 0;
  int64_t bytes = 0;  // value bytes received

  std::string What() const {
    return absl::StrCat(op == kPull ? "Pull " : op == kExchange ? "PushPull " : "Push ", placement->param(), "/",
                        placement->index(), " at ", server);
  }
};

// The chunk RPCs of one call or step: at most `window` in flight per server, the rest queued by priority.
// Replies are decoded on gRPC's threads, straight into the destination spans. Thread-safe.
class ChunkBatch {
 public:
  // With `launcher` (not owned; must outlive the batch), calls are started there instead of on the adding
  // thread: starting a call writes its bytes to the socket, which a training loop should not wait for.
  explicit ChunkBatch(int window, ThreadPool* launcher = nullptr) : window_(window), launcher_(launcher) {}
  ~ChunkBatch() {
    CancelAll();
    WaitAll();
  }

  // Starts `call` now, or queues it behind calls of higher priority to a busy server.
  void Add(std::unique_ptr<ChunkCall> call) {
    ChunkCall* c = call.get();
    c->context.set_wait_for_ready(false);
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back(std::move(call));
      ++pending_;
      ++pending_by_name_[c->name_index];
      Server& s = servers_[c->server_id];
      if (s.in_flight < window_) {
        ++s.in_flight;
        start = true;
      } else {
        s.queue.emplace(c->name_index, c);
      }
    }
    if (!start) return;
    if (launcher_ != nullptr) {
      launcher_->Submit([this, c] { Launch(c); });  // the destructor waits for every call, launched or not
    } else {
      Launch(c);
    }
  }

  // Waits until every added call completed (each has a deadline of its own). When `give_up` (asked at least
  // every 100 ms, without the batch's lock held) returns true, the calls still running are cancelled first.
  void WaitAll(const std::function<bool()>& give_up = nullptr) {
    while (give_up) {
      {
        absl::MutexLock lock(&mu_);
        if (pending_ == 0) return;
        call_done_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
        if (pending_ == 0) return;
      }
      if (give_up()) {
        CancelAll();
        break;
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](size_t* p) { return *p == 0; }, &pending_));
  }

  // Waits until every call of parameter `name_index` completed (true), or `give_up` returns true (false;
  // asked whenever a call completes and at least every 100 ms, without the batch's lock held).
  bool WaitForName(size_t name_index, const std::function<bool()>& give_up) {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (pending_by_name_[name_index] == 0) return true;
        call_done_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
        if (pending_by_name_[name_index] == 0) return true;
      }
      if (give_up && give_up()) return false;
    }
  }

  // The calls of parameter `name_index` (valid once WaitForName returned true for it).
  std::vector<ChunkCall*> CallsOf(size_t name_index) {
    absl::MutexLock lock(&mu_);
    std::vector<ChunkCall*> out;
    for (auto& c : calls_) {
      if (c->name_index == name_index) out.push_back(c.get());
    }
    return out;
  }

  void CancelAll() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (auto& c : calls_) c->context.TryCancel();
    for (auto& [id, s] : servers_) {
      pending_ -= s.queue.size();
      for (auto& [prio, c] : s.queue) {
        c->status = absl::CancelledError(c->What() + ": cancelled");
        --pending_by_name_[c->name_index];
      }
      s.queue.clear();
    }
    call_done_.SignalAll();
  }

  // Valid once Wait() returned true.
  const std::vector<std::unique_ptr<ChunkCall>>& calls() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return calls_; }

 private:
  struct Server {
    int in_flight = 0;
    std::multimap<size_t, ChunkCall*> queue;
  };

  void Launch(ChunkCall* c) {
    c->stub->UnaryCall(&c->context, MethodName(c->op), grpc::StubOptions(), &c->request, &c->response,
                    [this, c](grpc::Status status) { OnDone(c, status); });
  }

  // On a gRPC thread.
  void OnDone(ChunkCall* c, const grpc::Status& status) {
    c->status = FromGrpcStatus(status, c->context, c->What());
    if (c->status.ok()) c->status = Decode(*c);
    ChunkCall* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      Server& s = servers_[c->server_id];
      if (!s.queue.empty() && !cancelled_) {
        next = s.queue.begin()->second;
        s.queue.erase(s.queue.begin());
      } else {
        --s.in_flight;
      }
      --pending_;
      --pending_by_name_[c->name_index];
      call_done_.SignalAll();
    }
    if (next != nullptr) Launch(next);
  }

  static absl::Status Decode(ChunkCall& c) {
    if (c.op == kPush || c.op == kAssign) {
      PushResponse reply;
      ReceivedPayload none;
      TESSERA_RETURN_IF_ERROR(ParseWithPayload(c.response, /*field_number=*/0, &reply, &none));
      c.version = reply.version();
      return absl::OkStatus();
    }
    PullResponse header;
    ReceivedPayload payload;
    TESSERA_RETURN_IF_ERROR(ParseWithPayload(c.response, PullResponse::kDataFieldNumber, &header, &payload));
    c.version = header.version();
    c.clock_version = header.clock_version();
    if (payload.empty()) return absl::OkStatus();  // unchanged since the version the pull named
    // Servers check every value that enters a chunk, so values that leave one need no second check here.
    TESSERA_RETURN_IF_ERROR(payload.CopyFloatsTo(c.dst, /*check_finite=*/false, c.What()));
    c.bytes = static_cast<int64_t>(payload.size());
    return absl::OkStatus();
  }

  const int window_;
  ThreadPool* const launcher_;  // not owned; null: calls start on the adding thread
  absl::Mutex mu_;
  absl::CondVar call_done_;
  std::vector<std::unique_ptr<ChunkCall>> calls_ ABSL_GUARDED_BY(mu_);
  std::map<int, Server> servers_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<size_t, int> pending_by_name_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

PsClient::PsClient(const Options& options) : options_(options) {}

PsClient::~PsClient() {
  if (heartbeater_) heartbeater_->Stop();
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(const Options& options) {
  if (options.scheduler_address.empty()) return absl::InvalidArgumentError("scheduler address is required");
  if (options.window_per_server < 1 || options.connections_per_server < 1) {
    return absl::InvalidArgumentError(absl::StrCat("window_per_server and connections_per_server must be at least 1, got ",
                                                   options.window_per_server, " and ", options.connections_per_server));
  }
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const Security> security, Security::Load(options.security));
  std::unique_ptr<PsClient> client(new PsClient(options));
  client->security_ = security;
  client->scheduler_ = std::make_unique<SchedulerClient>(options.scheduler_address, security);
  tessera::v1::RegisterRequest request;
  request.set_role(tessera::v1::WORKER);
  request.set_device(options.device);
  if (options.rank >= 0) request.set_requested_id(options.rank);
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::RegisterResponse registered,
                           client->scheduler_->Register(request, options.connect_timeout));
  client->worker_id_ = registered.id();
  client->incarnation_ = registered.incarnation();
  client->member_key_ = registered.member_key();
  client->clock_ = registered.start_clock();
  client->slice_ = {registered.batch_offset(), registered.batch_count()};
  client->job_ = registered.job();
  if (options.heartbeat) {
    client->heartbeater_ = client->scheduler_->StartHeartbeats(
        tessera::v1::WORKER, client->worker_id_, client->incarnation_,
        absl::Milliseconds(registered.heartbeat_interval_ms()), [] {},
        [address = options.scheduler_address, lost = options.on_scheduler_lost](const absl::Status& why) {
          absl::Status status = absl::UnavailableError(absl::StrCat("lost the scheduler at ", address, ": ", why.message()));
          LOG(ERROR) << status;
          if (lost) lost(status);
        },
        registered.heartbeat_timeout_ms() > 0 ? absl::Milliseconds(registered.heartbeat_timeout_ms())
                                              : absl::Seconds(30));
  }
  return client;
}

absl::Status PsClient::Declare(const std::vector<tessera::v1::ParameterSpec>& params) {
  tessera::v1::DeclareRequest request;
  request.set_worker_id(worker_id_);
  for (const auto& p : params) *request.add_params() = p;
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::ShardMap map, scheduler_->Declare(request, options_.declare_timeout));
  rollback_generation_ = map.rollback_generation();  // rollbacks before this worker joined are not its own
  map_ = std::make_shared<const ShardMapIndex>(std::move(map));
  return absl::OkStatus();
}

absl::Status PsClient::RefreshMap(uint64_t at_least_epoch) {
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::ShardMap map, scheduler_->GetShardMap());
  if (map.epoch() < at_least_epoch) {
    return absl::UnavailableError(absl::StrCat("scheduler's shard map is at epoch ", map.epoch(),
                                               ", a server is already at ", at_least_epoch));
  }
  if (map_ != nullptr && map.epoch() <= map_->epoch()) return absl::OkStatus();  // nothing new
  NoteRollback(map.rollback_generation(), map.rollback_clock());
  VLOG(1) << "worker " << worker_id_ << ": shard map epoch " << epoch() << " -> " << map.epoch();
  map_ = std::make_shared<const ShardMapIndex>(std::move(map));
  return absl::OkStatus();
}

grpc::GenericStub* PsClient::StubFor(int server_id, int lane) {
  absl::StatusOr<std::string> address = map_->ServerAddress(server_id);
  const std::string host_port = address.ok() ? *address : "";
  auto& stub = stubs_[{host_port, lane}];
  if (!stub) stub = std::make_unique<grpc::GenericStub>(MakeChannel(host_port, *security_));  // a connection of its own
  return stub.get();
}

int64_t PsClient::bytes_pulled() const {
  absl::MutexLock lock(&bytes_mu_);
  return bytes_pulled_;
}

absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> PsClient::MakeCalls(
    int op_number, size_t name_index, const std::string& name, absl::Span<const float> grad, int batch_size,
    absl::Span<float> out, Stamp stamp) {
  const ChunkOp op = static_cast<ChunkOp>(op_number);
  if (map_ == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  TESSERA_ASSIGN_OR_RETURN(const tessera::v1::ParameterSpec* spec, map_->Param(name));
  const size_t expected = static_cast<size_t>(NumElements(spec->shape()));
  const bool sends = op != kPull;
  const bool receives = op == kPull || op == kExchange;
  if ((sends && grad.size() != expected) || (receives && out.size() != expected)) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has shape ", ShapeString(spec->shape()),
                                                   " (", expected, " values); the span holds ",
                                                   sends && grad.size() != expected ? grad.size() : out.size()));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<const tessera::v1::ChunkPlacement*> chunks, map_->Chunks(name));
  const absl::Duration timeout =
      op == kExchange ? std::max(options_.rpc_timeout, options_.clock_wait_timeout) : options_.rpc_timeout;
  std::vector<std::unique_ptr<ChunkCall>> calls;
  for (const tessera::v1::ChunkPlacement* placement : chunks) {
    // A chunk of a server the view no longer has is moving to another one: retry once the view says where.
    if (absl::StatusOr<std::string> server = map_->ServerAddress(placement->server_id()); !server.ok()) {
      return absl::UnavailableError(absl::StrCat("chunk ", placement->param(), "/", placement->index(), " is on server ",
                                                 placement->server_id(), ", which is out of the cluster view at epoch ",
                                                 map_->epoch(), "; its chunks are moving"));
    }
    auto call = std::make_unique<ChunkCall>();
    call->op = op;
    call->map = map_;
    call->placement = placement;
    call->name_index = name_index;
    call->server_id = placement->server_id();
    call->server = map_->ServerAddress(placement->server_id()).value_or("?");
    call->stub = StubFor(call->server_id, placement->index() % options_.connections_per_server);
    SetTimeout(call->context, timeout);
    security_->Authorize(call->context);
    call->context.AddMetadata(kMemberKeyHeader, member_key_);
    auto cached = pulled_.find({placement->param(), placement->index()});
    if (receives) call->dst = out.subspan(placement->offset(), placement->length());
    if (op == kPull) {
      PullRequest r;
      r.set_epoch(map_->epoch());
      r.set_worker_id(worker_id_);
      r.mutable_key()->set_param(placement->param());
      r.mutable_key()->set_index(placement->index());
      const bool same_memory = cached != pulled_.end() && cached->second.where == call->dst.data();
      r.set_have_version(same_memory ? cached->second.version : -1);
      grpc::Slice slice(r.SerializeAsString());
      call->request = grpc::ByteBuffer(&slice, 1);
    } else {
      PushRequest r;
      r.set_epoch(map_->epoch());
      r.set_worker_id(worker_id_);
      r.set_incarnation(incarnation_);
      r.set_seq(stamp.seq);
      r.set_clock(stamp.clock);
      r.set_read_clock_version(cached == pulled_.end() ? stamp.clock : cached->second.clock_version);
      r.set_batch_size(batch_size);
      r.set_kind(op == kAssign ? PushRequest::ASSIGN : PushRequest::GRADIENT);
      r.mutable_key()->set_param(placement->param());
      r.mutable_key()->set_index(placement->index());
      call->request = SerializeWithPayload(r, PushRequest::kDataFieldNumber,
                                           BorrowedFloatsSlice(grad.subspan(placement->offset(), placement->length())));
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

absl::StatusOr<PsClient::Absorbed> PsClient::Absorb(const std::vector<ChunkCall*>& calls) {
  Absorbed result;
  int64_t bytes = 0;
  for (const auto& call : calls) {
    if (call->status.ok()) {
      bytes += call->bytes;
      if (call->op == kPull || call->op == kExchange) {
        PulledChunk& cached = pulled_[{call->placement->param(), call->placement->index()}];
        cached.version = call->version;
        cached.clock_version = call->clock_version;
        cached.where = call->dst.data();
      }
      continue;
    }
    std::optional<uint64_t> epoch = GetCurrentEpoch(call->status);
    if (call->status.code() == absl::StatusCode::kFailedPrecondition && epoch) {
      result.newer_epoch = std::max(result.newer_epoch, *epoch);
    } else if (call->status.code() != absl::StatusCode::kUnavailable) {
      return call->status;  // not retryable: the caller must fix something
    }
    result.retry = call->status;
    // The destination may hold part of the chunk now: its cached version no longer describes it.
    pulled_.erase({call->placement->param(), call->placement->index()});
    std::vector<size_t>& failed = result.failed_names;
    if (failed.empty() || failed.back() != call->name_index) failed.push_back(call->name_index);
  }
  absl::MutexLock lock(&bytes_mu_);
  bytes_pulled_ += bytes;
  return result;
}

absl::Status PsClient::RunChunks(int op, const std::vector<std::string>& names,
                                 const std::vector<absl::Span<const float>>& grads, int batch_size,
                                 const std::vector<absl::Span<float>>& out, Stamp stamp) {
  if (map_ == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  const bool sends = op != kPull, receives = op == kPull || op == kExchange;
  if ((sends && names.size() != grads.size()) || (receives && names.size() != out.size())) {
    return absl::InvalidArgumentError(absl::StrCat(names.size(), " names but ", sends ? grads.size() : out.size(),
                                                   " value spans"));
  }
  absl::Duration backoff = absl::Milliseconds(20);
  std::vector<size_t> todo(names.size());
  for (size_t i = 0; i < names.size(); ++i) todo[i] = i;
  absl::Status last;
  // At least `retries` attempts, and for at least `unavailable_window`: a server that died is replaced in the
  // cluster view within the scheduler's heartbeat timeout, and the map is asked for again on each attempt.
  const absl::Time keep_trying_until = absl::Now() + options_.unavailable_window;
  int attempt = 0;
  for (; attempt <= options_.retries || absl::Now() < keep_trying_until; ++attempt) {
    ChunkBatch batch(options_.window_per_server);
    std::vector<size_t> unplaceable;  // names with a chunk on a server that left the view
    for (size_t i : todo) {
      absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> calls =
          MakeCalls(op, i, names[i], sends ? grads[i] : absl::Span<const float>(), batch_size,
                    receives ? out[i] : absl::Span<float>(), stamp);
      if (absl::IsUnavailable(calls.status())) {
        unplaceable.push_back(i);
        last = calls.status();
        continue;
      }
      if (!calls.ok()) return calls.status();
      for (auto& c : *calls) batch.Add(std::move(c));
    }
    // A call to a server that froze waits out its deadline: once the job is stopping nothing will answer it.
    batch.WaitAll([this] { return scheduler_->stopping(); });
    std::vector<ChunkCall*> done;
    for (const auto& c : batch.calls()) done.push_back(c.get());
    TESSERA_ASSIGN_OR_RETURN(Absorbed absorbed, Absorb(done));
    if (absorbed.failed_names.empty() && unplaceable.empty()) return absl::OkStatus();
    todo = std::move(absorbed.failed_names);
    todo.insert(todo.end(), unplaceable.begin(), unplaceable.end());
    std::sort(todo.begin(), todo.end());
    if (!absorbed.retry.ok()) last = std::move(absorbed.retry);
    if (absorbed.newer_epoch > 0) {
      TESSERA_RETURN_IF_ERROR(RefreshMap(absorbed.newer_epoch));
    } else {
      // A backoff between attempts of remote calls, not a synchronisation point.
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
      backoff = std::min(backoff * 2, absl::Seconds(1));
      // The server may be gone and its chunks elsewhere by now.
      TESSERA_RETURN_IF_ERROR(RefreshMap(0));
    }
    if (scheduler_->stopping()) {
      // Nothing will move or come back once the job is stopping (a server lost without a checkpoint): the step
      // ends here and the gate says stop.
      return absl::AbortedError(absl::StrCat("the job is stopping: ", last.message()));
    }
    if (rollback_) {
      return absl::AbortedError(absl::StrCat("the job was rolled back to clock ", *rollback_,
                                             " (a server was lost); this step is void"));
    }
  }
  return Annotate(last, absl::StrCat("gave up after ", attempt, " attempts"));
}

absl::Status PsClient::Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out) {
  return RunChunks(kPull, names, {}, 0, out, CurrentStamp());
}

absl::Status PsClient::Push(const std::vector<std::string>& names, const std::vector<absl::Span<const float>>& grads,
                            int batch_size) {
  // Checked here too, so that a bad gradient reaches no server: the servers check each chunk on its own, and a
  // push rejected by one of them but applied by another would change part of the parameter.
  for (size_t i = 0; i < names.size() && i < grads.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(CheckFinite(grads[i], absl::StrCat("gradient of '", names[i], "'")));
  }
  return RunChunks(kPush, names, grads, batch_size, {}, NewStamp());
}

absl::Status PsClient::PushPull(const std::vector<std::string>& names,
                                const std::vector<absl::Span<const float>>& grads, int batch_size,
                                const std::vector<absl::Span<float>>& out) {
  for (size_t i = 0; i < names.size() && i < grads.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(CheckFinite(grads[i], absl::StrCat("gradient of '", names[i], "'")));
  }
  return RunChunks(kExchange, names, grads, batch_size, out, NewStamp());
}

absl::Status PsClient::Assign(const std::vector<std::string>& names,
                              const std::vector<absl::Span<const float>>& values) {
  return RunChunks(kAssign, names, values, 1, {}, NewStamp());
}

absl::StatusOr<ClockResult> PsClient::Clock() {
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::AdvanceClockResponse gate,
                           scheduler_->AdvanceClock(worker_id_, clock_ + 1, options_.clock_wait_timeout,
                                                    step_samples_, absl::ToDoubleSeconds(step_busy_)));
  return Advanced(gate);
}

ClockResult PsClient::Advanced(const tessera::v1::AdvanceClockResponse& gate) {
  ++clock_;
  if (gate.late() && gate.next_clock() > clock_) clock_ = gate.next_clock();  // on to the others' round
  slice_ = {gate.batch_offset(), gate.batch_count()};
  if (gate.rolled_back()) {
    // Numbered, so that a rollback heard of both here and from the map is taken once.
    NoteRollback(gate.rollback_generation() > 0 ? gate.rollback_generation() : rollback_generation_ + 1,
                 gate.rollback_clock());
  }
  ClockResult result;
  result.clock = clock_;
  result.min_clock = gate.min_clock();
  result.stop = gate.stop();
  result.stop_reason = gate.stop_reason();
  result.rolled_back = rollback_.has_value();
  result.late = gate.late();
  return result;
}

void PsClient::NoteRollback(uint64_t generation, int64_t clock) {
  if (generation <= rollback_generation_) return;
  rollback_generation_ = generation;
  rollback_ = clock;
}

std::optional<int64_t> PsClient::TakeRollback() {
  std::optional<int64_t> to = rollback_;
  if (!to) return std::nullopt;
  rollback_.reset();
  clock_ = *to;
  pulled_.clear();  // what was pulled is from before the rollback
  return to;
}

bool PsClient::JobStopped() {
  if (scheduler_->stopping()) return true;  // a heartbeat said so already
  // Re-advancing to the clock the scheduler already holds returns at once, with `stop` once the job is over.
  absl::StatusOr<tessera::v1::AdvanceClockResponse> gate =
      scheduler_->AdvanceClock(worker_id_, clock_, absl::Milliseconds(1));
  return gate.ok() && gate->stop();
}

absl::StatusOr<tessera::v1::ReportResponse> PsClient::Report(tessera::v1::ReportRequest report) {
  report.set_worker_id(worker_id_);
  report.set_clock(clock_);
  return scheduler_->Report(report);
}

absl::Status PsClient::Done() {
  if (heartbeater_) heartbeater_->Stop();
  return scheduler_->Done(worker_id_, clock_);
}

void PsClient::Fail(const absl::Status& why) {
  if (heartbeater_) heartbeater_->Stop();
  if (absl::Status told = scheduler_->Done(worker_id_, clock_, why); !told.ok()) {
    LOG(INFO) << "could not tell the scheduler that this worker stops: " << told;
  }
}

// SYNC and ASYNC: one exchange per chunk, started as each gradient is sent; in SYNC the clock is advanced on
// the client's clock executor at the same time. The values arrive while the caller goes on (WaitValues).
// SSP: push, clock gate and pull, all in Finish().
class StepExchangeImpl final : public StepExchange {
 public:
  StepExchangeImpl(PsClient* client, const std::vector<std::string>& names,
                   const std::vector<absl::Span<const float>>& grads, int batch_size,
                   const std::vector<absl::Span<float>>& out)
      : client_(client),
        names_(names),
        grads_(grads),
        batch_size_(batch_size),
        out_(out),
        mode_(client->job().consistency().mode()),
        sent_(names.size(), false),
        deferred_(names.size(), false),
        settled_(names.size(), mode_ == tessera::v1::ConsistencySpec::SSP),
        batch_(client->options_.window_per_server, &client->launcher_) {
    if (mode_ == tessera::v1::ConsistencySpec::SSP) return;
    stamp_ = client_->NewStamp();  // one sequence number for the step's exchanges, reused by their retries
    if (mode_ == tessera::v1::ConsistencySpec::SYNC) {
      clock_state_ = std::make_shared<ClockState>();
      // With backup workers the clock says "every gradient of this step is sent" and goes out in Finish.
      if (client_->job_.consistency().backup_workers() == 0) StartClock();
    }
  }

  // Advances the scheduler's clock on the client's clock thread, alongside the exchanges.
  void StartClock() {
    auto state = clock_state_;
    SchedulerClient* scheduler = client_->scheduler_.get();
    const int worker = client_->worker_id_;
    const int64_t next = client_->clock_ + 1;
    const absl::Duration wait = client_->options_.clock_wait_timeout;
    const int samples = client_->step_samples_;
    const double busy = absl::ToDoubleSeconds(client_->step_busy_);
    client_->clock_executor_.Submit([state, scheduler, worker, next, wait, samples, busy] {
      absl::StatusOr<tessera::v1::AdvanceClockResponse> gate =
          scheduler->AdvanceClock(worker, next, wait, samples, busy);
      absl::MutexLock lock(&state->mu);
      state->stop = !gate.ok() || gate->stop();
      state->result = std::move(gate);
    });
  }

  ~StepExchangeImpl() override {
    // Values that were not waited for may be partly written: their cached versions no longer describe them.
    for (size_t i = 0; i < names_.size(); ++i) {
      if (settled_[i] || !sent_[i]) continue;
      for (ChunkCall* c : batch_.CallsOf(i)) client_->pulled_.erase({c->placement->param(), c->placement->index()});
    }
  }

  absl::Status Send(int index) override {
    if (index < 0 || static_cast<size_t>(index) >= names_.size() || sent_[index]) {
      return absl::InvalidArgumentError(absl::StrCat("Send(", index, "): no such unsent parameter"));
    }
    sent_[index] = true;
    TESSERA_RETURN_IF_ERROR(CheckFinite(grads_[index], absl::StrCat("gradient of '", names_[index], "'")));
    if (mode_ == tessera::v1::ConsistencySpec::SSP) return absl::OkStatus();
    absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> calls =
        client_->MakeCalls(kExchange, index, names_[index], grads_[index], batch_size_, out_[index], stamp_);
    if (absl::IsUnavailable(calls.status())) {
      deferred_[index] = true;  // sent through the retrying path when its values are waited for
      return absl::OkStatus();
    }
    if (!calls.ok()) return calls.status();
    for (auto& c : *calls) batch_.Add(std::move(c));
    return absl::OkStatus();
  }

  absl::StatusOr<ClockResult> Finish() override {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (!sent_[i]) TESSERA_RETURN_IF_ERROR(Send(static_cast<int>(i)));
    }
    if (mode_ == tessera::v1::ConsistencySpec::SSP) {
      TESSERA_RETURN_IF_ERROR(client_->Push(names_, grads_, batch_size_));
      TESSERA_ASSIGN_OR_RETURN(ClockResult gate, client_->Clock());
      if (!gate.stop) TESSERA_RETURN_IF_ERROR(client_->Pull(names_, out_));
      return gate;
    }
    if (mode_ == tessera::v1::ConsistencySpec::ASYNC) return client_->Clock();  // never waits at the gate
    if (client_->job_.consistency().backup_workers() > 0) StartClock();
    TESSERA_ASSIGN_OR_RETURN(tessera::v1::AdvanceClockResponse gate, WaitClock());
    // The job is over: rounds still open may never close, so nobody waits for them.
    if (gate.stop()) batch_.CancelAll();
    return Advance(gate);
  }

  absl::Status WaitValues(int index, const std::function<bool()>& give_up) override {
    if (index < 0 || static_cast<size_t>(index) >= names_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("WaitValues(", index, "): no such parameter"));
    }
    if (settled_[index]) return absl::OkStatus();
    if (!sent_[index]) {
      return absl::FailedPreconditionError(absl::StrCat("WaitValues: '", names_[index], "' was never sent"));
    }
    // A SYNC round closes only when every worker pushed it; one that left (the job then stops) never will, and
    // the scheduler is asked, about once a second, whether the job is over.
    absl::Time next_poll = absl::Now() + absl::Seconds(1);
    auto over = [&] {
      if ((clock_state_ && ClockStopped()) || (give_up && give_up())) return true;
      if (mode_ != tessera::v1::ConsistencySpec::SYNC || absl::Now() < next_poll) return false;
      next_poll = absl::Now() + absl::Seconds(1);
      return client_->JobStopped();
    };
    if (!batch_.WaitForName(index, over)) {
      return absl::AbortedError(absl::StrCat("stopped waiting for the values of '", names_[index],
                                             "': the job is stopping"));
    }
    TESSERA_ASSIGN_OR_RETURN(PsClient::Absorbed absorbed, client_->Absorb(batch_.CallsOf(index)));
    if (!absorbed.failed_names.empty() || deferred_[index]) {
      // Retry through the ordinary path, with the same sequence number: a server that applied the push
      // answers the retry as a duplicate, with the values.
      if (absorbed.newer_epoch > 0) TESSERA_RETURN_IF_ERROR(client_->RefreshMap(absorbed.newer_epoch));
      TESSERA_RETURN_IF_ERROR(client_->RunChunks(kExchange, {names_[index]}, {grads_[index]}, batch_size_,
                                                 {out_[index]}, stamp_));
    }
    settled_[index] = true;
    return absl::OkStatus();
  }

  bool stopped() const override { return (clock_state_ && ClockStopped()) || client_->scheduler_->stopping(); }

 private:
  struct ClockState {
    absl::Mutex mu;
    std::optional<absl::StatusOr<tessera::v1::AdvanceClockResponse>> result ABSL_GUARDED_BY(mu);
    // The gate answered stop or failed. Atomic: read by give-up checks without `mu`.
    std::atomic<bool> stop{false};
  };

  bool ClockStopped() const { return clock_state_->stop.load(); }

  absl::StatusOr<tessera::v1::AdvanceClockResponse> WaitClock() {
    absl::MutexLock lock(&clock_state_->mu);
    clock_state_->mu.Await(absl::Condition(
        +[](std::optional<absl::StatusOr<tessera::v1::AdvanceClockResponse>>* r) { return r->has_value(); },
        &clock_state_->result));  // the clock call has its own deadline
    return *clock_state_->result;
  }

  ClockResult Advance(const tessera::v1::AdvanceClockResponse& gate) { return client_->Advanced(gate); }

  PsClient* const client_;
  const std::vector<std::string>& names_;
  const std::vector<absl::Span<const float>> grads_;
  const int batch_size_;
  const std::vector<absl::Span<float>> out_;
  const tessera::v1::ConsistencySpec::Mode mode_;
  std::vector<bool> sent_;
  std::vector<bool> deferred_;  // sent, but no chunk call could be made (a server left the view)
  std::vector<bool> settled_;  // values in place and absorbed into the client's cache
  std::shared_ptr<ClockState> clock_state_;
  PsClient::Stamp stamp_;
  ChunkBatch batch_;
};

std::unique_ptr<StepExchange> PsClient::BeginStep(const std::vector<std::string>& names,
                                                  const std::vector<absl::Span<const float>>& grads, int batch_size,
                                                  const std::vector<absl::Span<float>>& out) {
  return std::make_unique<StepExchangeImpl>(this, names, grads, batch_size, out);
}

}  // namespace tessera
