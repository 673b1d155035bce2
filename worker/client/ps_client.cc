#include "worker/client/ps_client.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/fabric/ucx_worker.h"
#include "common/base/heartbeater.h"
#include "common/rpc/rpc.h"
#include "common/rpc/scheduler_client.h"
#include "common/rpc/security.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "glog/logging.h"
#include "worker/client/chunk_calls.h"
#include "worker/client/grpc_chunk_transport.h"
#include "worker/client/row_calls.h"
#include "worker/client/ucx_chunk_transport.h"
#include "worker/client/step_protocols.h"

namespace tessera {

PsClient::PsClient(const Options& options) : options_(options) {}

PsClient::~PsClient() {
  if (heartbeater_) heartbeater_->Stop();
}

namespace {

// The transport `options` names instead of the job's (nullopt: the job's). INVALID_ARGUMENT for another name,
// checked before the client registers.
absl::StatusOr<std::optional<tessera::v1::Transport>> TransportOverride(const PsClient::Options& options) {
  if (options.transport.empty()) return std::nullopt;
  if (options.transport == "grpc") return tessera::v1::GRPC;
  if (options.transport == "ucx") return tessera::v1::UCX;
  return absl::InvalidArgumentError(
      absl::StrCat("transport '", options.transport, "': expected grpc or ucx (or empty: the job's)"));
}

// The job's transport for chunk calls, or the one `options` names instead.
absl::StatusOr<std::unique_ptr<ChunkTransport>> MakeChunkTransport(const tessera::v1::JobSpec& job,
                                                                    const PsClient::Options& options,
                                                                    std::shared_ptr<const Security> security,
                                                                    CallerIdentity who) {
  TESSERA_ASSIGN_OR_RETURN(std::optional<tessera::v1::Transport> override, TransportOverride(options));
  const tessera::v1::Transport transport = override.value_or(job.transport());
  if (transport == tessera::v1::GRPC) {
    return std::make_unique<GrpcChunkTransport>(std::move(security), options.connections_per_server);
  }
  if (!job.trusted_network()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job.name(), "' does not say trusted_network: true, so its chunks may not travel over UCX, which "
        "does not encrypt; use transport grpc"));
  }
  absl::StatusOr<std::unique_ptr<UcxChunkTransport>> ucx = UcxChunkTransport::Start(
      std::move(security), who, FabricOptions{options.fabric_spin_us, options.fabric_tcp});
  if (!ucx.ok()) return ucx.status();
  return std::unique_ptr<ChunkTransport>(*std::move(ucx));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(const Options& options) {
  if (options.scheduler_address.empty()) return absl::InvalidArgumentError("scheduler address is required");
  if (options.window_per_server < 1 || options.connections_per_server < 1) {
    return absl::InvalidArgumentError(absl::StrCat("window_per_server and connections_per_server must be at least 1, got ",
                                                   options.window_per_server, " and ", options.connections_per_server));
  }
  TESSERA_RETURN_IF_ERROR(TransportOverride(options).status());
  TESSERA_RETURN_IF_ERROR(CheckSpinOption(options.fabric_spin_us));
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
  client->shared_pushed_from_ = client->clock_;
  client->shared_clock_ = client->clock_;
  // A restarted scheduler takes this worker back at the clock it has reached, with the rounds it pushed. The
  // clock is read first: a pushed_from newer than it is capped to it by the table, while one older than the
  // clock read could claim rounds a late answer skipped.
  client->scheduler_->EnableReturn([clock = &client->shared_clock_, pushed_from = &client->shared_pushed_from_](
                                       tessera::v1::MemberReturn& back) {
    back.set_clock(clock->load());
    back.set_pushed_from(pushed_from->load());
  });
  client->slice_ = {registered.batch_offset(), registered.batch_count()};
  client->job_ = registered.job();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ChunkTransport> transport,
                           MakeChunkTransport(client->job_, options, security,
                                              {client->worker_id_, client->incarnation_, client->member_key_}));
  client->caller_ = std::make_unique<ChunkCaller>(std::move(transport), client->job_.wire());
  // Rows go over the job's fabric when it has one (UCX), else over gRPC.
  ChunkTransport* fabric = &client->caller_->transport();
  if (std::string_view(fabric->name()) != "ucx") fabric = nullptr;
  PsClient* self = client.get();
  client->retries_ = std::make_unique<CallRetries>(
      CallRetries::Options{options.retries, options.unavailable_window}, client->scheduler_.get(), client->worker_id_,
      [self](uint64_t at_least_epoch, bool* behind) { return self->RefreshMap(at_least_epoch, behind); },
      [self] { return self->rollback_; });
  client->rows_ = std::make_unique<RowClient>(std::make_unique<RowCaller>(security, options.rpc_timeout, fabric),
                                              client->retries_.get(), client->map_);
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
  caller_->transport().OnView(*map_);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<tessera::v1::ParameterSpec>> PsClient::JobParameters() {
  absl::StatusOr<tessera::v1::ShardMap> map = scheduler_->GetShardMap();
  if (map.status().code() == absl::StatusCode::kFailedPrecondition) return std::vector<tessera::v1::ParameterSpec>();
  TESSERA_RETURN_IF_ERROR(map.status());
  return std::vector<tessera::v1::ParameterSpec>(map->params().begin(), map->params().end());
}

absl::Status PsClient::RefreshMap(uint64_t at_least_epoch, bool* behind) {
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::ShardMap map, scheduler_->GetShardMap());
  if (map.epoch() < at_least_epoch) {
    if (behind != nullptr) *behind = true;
    return absl::UnavailableError(absl::StrCat("scheduler's shard map is at epoch ", map.epoch(),
                                               ", a server is already at ", at_least_epoch));
  }
  if (map_ != nullptr && map.epoch() <= map_->epoch()) return absl::OkStatus();  // nothing new
  NoteRollback(map.rollback_generation(), map.rollback_clock());
  VLOG(1) << "worker " << worker_id_ << ": shard map epoch " << epoch() << " -> " << map.epoch();
  map_ = std::make_shared<const ShardMapIndex>(std::move(map));
  caller_->transport().OnView(*map_);
  return absl::OkStatus();
}

int64_t PsClient::OldestPulled(const std::string& name, int64_t PulledChunk::*field) const {
  if (map_ == nullptr) return -1;
  absl::StatusOr<std::vector<const tessera::v1::ChunkPlacement*>> chunks = map_->Chunks(name);
  if (!chunks.ok() || chunks->empty()) return -1;
  int64_t oldest = INT64_MAX;
  for (const tessera::v1::ChunkPlacement* c : *chunks) {
    auto it = pulled_.find({c->param(), c->index()});
    if (it == pulled_.end()) return -1;
    oldest = std::min(oldest, it->second.*field);
  }
  return oldest;
}

void PsClient::ForgetPulledValues(const std::vector<std::string>& names) {
  if (map_ == nullptr) return;
  for (const std::string& name : names) {
    absl::StatusOr<std::vector<const tessera::v1::ChunkPlacement*>> chunks = map_->Chunks(name);
    if (!chunks.ok()) continue;
    for (const tessera::v1::ChunkPlacement* c : *chunks) pulled_.erase({c->param(), c->index()});
  }
}

int64_t PsClient::PulledVersion(const std::string& name) const { return OldestPulled(name, &PulledChunk::version); }

int64_t PsClient::PulledClock(const std::string& name) const {
  return OldestPulled(name, &PulledChunk::clock_version);
}

int64_t PsClient::bytes_pulled() const {
  absl::MutexLock lock(&bytes_mu_);
  return bytes_pulled_;
}

absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> PsClient::MakeCalls(
    ChunkOp op, size_t name_index, const std::string& name, absl::Span<const float> grad, int batch_size,
    absl::Span<float> out, Stamp stamp, size_t begin, size_t end) {
  // An exchange in SYNC is answered when its round closes: it may wait as long as the clock gate.
  const absl::Duration timeout =
      op == kExchange || op == kNorm ? std::max(options_.rpc_timeout, options_.clock_wait_timeout) : options_.rpc_timeout;
  return caller_->Make(op, map_, name_index, name, grad, batch_size, out, stamp,
                       {worker_id_, incarnation_, member_key_}, pulled_, timeout, begin, end);
}

absl::StatusOr<std::vector<size_t>> PsClient::Absorb(const std::vector<ChunkCall*>& calls, FailedCalls& failed) {
  std::vector<size_t> failed_names;
  int64_t bytes = 0;
  for (const auto& call : calls) {
    if (call->status.ok()) {
      bytes += call->bytes;
      if (call->op == kPull || call->op == kExchange) {
        PulledChunk& cached = pulled_[call->key()];
        cached.version = call->version;
        cached.clock_version = call->clock_version;
        cached.where = call->dst.data();
      }
      continue;
    }
    // The destination may hold part of the chunk now: its cached version no longer describes it.
    pulled_.erase(call->key());
    TESSERA_RETURN_IF_ERROR(failed.Add(call->status, *call->map, call->server_id));
    if (failed_names.empty() || failed_names.back() != call->name_index) failed_names.push_back(call->name_index);
  }
  AddBytesPulled(bytes);
  return failed_names;
}

void PsClient::AddBytesPulled(int64_t bytes) {
  absl::MutexLock lock(&bytes_mu_);
  bytes_pulled_ += bytes;
}

absl::Status PsClient::RunChunks(ChunkOp op, const std::vector<std::string>& names,
                                 const std::vector<absl::Span<const float>>& grads, int batch_size,
                                 const std::vector<absl::Span<float>>& out, Stamp stamp,
                                 std::map<std::pair<std::string, int>, double>* norms) {
  if (map_ == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  const bool sends = op != kPull, receives = op == kPull || op == kExchange;
  if ((sends && names.size() != grads.size()) || (receives && names.size() != out.size())) {
    return absl::InvalidArgumentError(absl::StrCat(names.size(), " names but ", sends ? grads.size() : out.size(),
                                                   " value spans"));
  }
  std::vector<size_t> todo(names.size());
  for (size_t i = 0; i < names.size(); ++i) todo[i] = i;
  return retries_->Run(
      [&](FailedCalls& failed) -> absl::Status {
        ChunkBatch batch(options_.window_per_server);
        std::vector<size_t> unplaceable;  // names with a chunk on a server that left the view
        for (size_t i : todo) {
          absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> calls =
              MakeCalls(op, i, names[i], sends ? grads[i] : absl::Span<const float>(), batch_size,
                        receives ? out[i] : absl::Span<float>(), stamp);
          if (absl::IsUnavailable(calls.status())) {
            unplaceable.push_back(i);
            failed.AddUnplaced(calls.status());
            continue;
          }
          if (!calls.ok()) return calls.status();
          for (auto& c : *calls) batch.Add(std::move(c));
        }
        // A call to a server that froze waits out its deadline: once the job is stopping nothing will answer it.
        batch.WaitAll([this] { return scheduler_->stopping(); });
        TESSERA_ASSIGN_OR_RETURN(std::vector<size_t> retry, Absorb(batch.calls(), failed));
        if (norms != nullptr) {
          for (const ChunkCall* c : batch.calls()) {
            if (c->status.ok()) (*norms)[c->key()] = c->round_sq_norm;
          }
        }
        todo = std::move(retry);
        todo.insert(todo.end(), unplaceable.begin(), unplaceable.end());
        std::sort(todo.begin(), todo.end());
        return absl::OkStatus();
      },
      /*void_on_rollback=*/true);
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
  if (gate.late()) {
    if (gate.next_clock() > clock_) clock_ = gate.next_clock();  // on to the others' round
    // The rounds before were decided without it (its last push among them): it pushes every round from here.
    shared_pushed_from_ = clock_;
  }
  shared_clock_ = clock_;
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
  result.joining_clocks.assign(gate.joining_clocks().begin(), gate.joining_clocks().end());
  result.values_keeper = gate.values_keeper();
  result.checkpoint_clock = gate.checkpoint_clock();
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
  shared_pushed_from_ = clock_;  // the rounds from the rollback's clock on are pushed again
  shared_clock_ = clock_;
  pulled_.clear();  // what was pulled is from before the rollback
  caller_->ForgetResiduals();  // and what rounding or top-k left of the voided steps' gradients
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
  left_ = true;
  if (heartbeater_) heartbeater_->Stop();
  return scheduler_->Done(worker_id_, clock_);
}

void PsClient::Fail(const absl::Status& why, bool program_error) {
  if (left_.exchange(true)) return;
  if (heartbeater_) heartbeater_->Stop();
  if (absl::Status told = scheduler_->Done(worker_id_, clock_, why, program_error); !told.ok()) {
    LOG(INFO) << "could not tell the scheduler that this worker stops: " << told;
  }
}

std::unique_ptr<StepExchange> PsClient::BeginStep(const std::vector<std::string>& names,
                                                  const std::vector<absl::Span<const float>>& grads, int batch_size,
                                                  const std::vector<absl::Span<float>>& out) {
  return MakeStepProtocol(this, names, grads, batch_size, out);
}

absl::Status PsClient::PullRows(const std::string& table, absl::Span<const uint64_t> ids, absl::Span<float> out) {
  TESSERA_ASSIGN_OR_RETURN(int64_t bytes, rows_->Pull(table, ids, out, clock_, {worker_id_, incarnation_, member_key_}));
  AddBytesPulled(bytes);
  return absl::OkStatus();
}

absl::StatusOr<PsClient::RowsPushed> PsClient::PushRows(const std::string& table, absl::Span<const uint64_t> ids,
                                                        absl::Span<const float> grads, int batch_size,
                                                        float lr_factor, bool skip) {
  tessera::v1::RowPushRequest request;
  const Stamp stamp = NewStamp();  // one seq for every server and every retry: each slot applies it once
  request.set_seq(stamp.seq);
  request.set_clock(stamp.clock);
  request.set_batch_size(batch_size);
  request.set_table(table);
  if (lr_factor != 1.0f) request.set_lr_factor(lr_factor);
  request.set_skip(skip);
  // SYNC: every server of the table takes part in the worker's round, with or without ids of its own.
  const bool every_server = job_.consistency().mode() == tessera::v1::ConsistencySpec::SYNC;
  return rows_->Push(std::move(request), ids, grads, every_server, {worker_id_, incarnation_, member_key_});
}

}  // namespace tessera
