#include "worker/ps_client.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"

namespace tessera {

using tessera::v1::PullRequest;
using tessera::v1::PullResponse;
using tessera::v1::PushRequest;
using tessera::v1::PushResponse;

// One chunk's RPC: owns everything the callback API needs until the call completes.
struct PsClient::ChunkCall {
  const tessera::v1::ChunkPlacement* placement = nullptr;
  size_t name_index = 0;
  std::string server;
  grpc::ClientContext context;
  PullRequest pull;
  PullResponse pulled;
  PushRequest push;
  PushResponse pushed;
  absl::Status status;
};

PsClient::PsClient(const Options& options) : options_(options) {}

PsClient::~PsClient() {
  if (heartbeater_) heartbeater_->Stop();
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(const Options& options) {
  if (options.scheduler_address.empty()) return absl::InvalidArgumentError("scheduler address is required");
  std::unique_ptr<PsClient> client(new PsClient(options));
  client->scheduler_ = std::make_unique<SchedulerClient>(options.scheduler_address);
  tessera::v1::RegisterRequest request;
  request.set_role(tessera::v1::WORKER);
  request.set_device(options.device);
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::RegisterResponse registered,
                           client->scheduler_->Register(request, options.connect_attempts));
  client->worker_id_ = registered.id();
  client->job_ = registered.job();
  if (options.heartbeat) {
    client->heartbeater_ = client->scheduler_->StartHeartbeats(
        tessera::v1::WORKER, client->worker_id_, absl::Milliseconds(registered.heartbeat_interval_ms()), [] {},
        [](const absl::Status& why) { LOG(WARNING) << "worker heartbeats stopped: " << why; }, absl::Seconds(30));
  }
  return client;
}

absl::Status PsClient::Declare(const std::vector<tessera::v1::ParameterSpec>& params) {
  tessera::v1::DeclareRequest request;
  request.set_worker_id(worker_id_);
  for (const auto& p : params) *request.add_params() = p;
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::ShardMap map, scheduler_->Declare(request, options_.declare_timeout));
  map_ = std::make_unique<ShardMapIndex>(std::move(map));
  return absl::OkStatus();
}

absl::Status PsClient::RefreshMap(uint64_t at_least_epoch) {
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::ShardMap map, scheduler_->GetShardMap());
  if (map.epoch() < at_least_epoch) {
    return absl::UnavailableError(absl::StrCat("scheduler's shard map is at epoch ", map.epoch(),
                                               ", a server is already at ", at_least_epoch));
  }
  VLOG(1) << "worker " << worker_id_ << ": shard map epoch " << epoch() << " -> " << map.epoch();
  map_ = std::make_unique<ShardMapIndex>(std::move(map));
  return absl::OkStatus();
}

tessera::v1::ParameterServer::Stub* PsClient::StubFor(int server_id) {
  absl::StatusOr<std::string> address = map_->ServerAddress(server_id);
  const std::string key = address.ok() ? *address : "";
  auto& stub = stubs_[key];
  if (!stub) stub = tessera::v1::ParameterServer::NewStub(MakeChannel(key));
  return stub.get();
}

absl::Status PsClient::RunChunks(bool push, PushRequest::Kind kind, const std::vector<std::string>& names,
                                 const std::vector<absl::Span<const float>>& grads, int batch_size,
                                 const std::vector<absl::Span<float>>& out) {
  if (map_ == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  if (names.size() != (push ? grads.size() : out.size())) {
    return absl::InvalidArgumentError(absl::StrCat(names.size(), " names but ", push ? grads.size() : out.size(),
                                                   " value spans"));
  }
  if (push) ++seq_;  // one sequence number per call, reused by its retries
  absl::Duration backoff = absl::Milliseconds(20);
  absl::Status last;
  for (int attempt = 0; attempt <= options_.retries; ++attempt) {
    std::vector<std::unique_ptr<ChunkCall>> calls;
    for (size_t i = 0; i < names.size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(const tessera::v1::ParameterSpec* spec, map_->Param(names[i]));
      const size_t expected = static_cast<size_t>(NumElements(spec->shape()));
      const size_t given = push ? grads[i].size() : out[i].size();
      if (given != expected) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", names[i], "' has shape ",
                                                       ShapeString(spec->shape()), " (", expected,
                                                       " values); the span holds ", given));
      }
      TESSERA_ASSIGN_OR_RETURN(std::vector<const tessera::v1::ChunkPlacement*> chunks, map_->Chunks(names[i]));
      for (const tessera::v1::ChunkPlacement* placement : chunks) {
        auto call = std::make_unique<ChunkCall>();
        call->placement = placement;
        call->name_index = i;
        call->server = map_->ServerAddress(placement->server_id()).value_or("?");
        SetTimeout(call->context, options_.rpc_timeout);
        tessera::v1::ChunkKey key;
        key.set_param(placement->param());
        key.set_index(placement->index());
        if (push) {
          PushRequest& r = call->push;
          r.set_epoch(map_->epoch());
          r.set_worker_id(worker_id_);
          r.set_seq(seq_);
          r.set_clock(clock_);
          auto it = pulled_.find({placement->param(), placement->index()});
          r.set_read_clock_version(it == pulled_.end() ? clock_ : it->second.clock_version);
          r.set_batch_size(batch_size);
          r.set_kind(kind);
          *r.mutable_key() = key;
          EncodeFloats(grads[i].subspan(placement->offset(), placement->length()), r.mutable_data());
        } else {
          PullRequest& r = call->pull;
          r.set_epoch(map_->epoch());
          r.set_worker_id(worker_id_);
          auto it = pulled_.find({placement->param(), placement->index()});
          r.set_have_version(it == pulled_.end() ? -1 : it->second.version);
          *r.mutable_key() = key;
        }
        calls.push_back(std::move(call));
      }
    }

    absl::Mutex mu;
    size_t pending = calls.size();
    for (auto& call : calls) {
      ChunkCall* c = call.get();
      auto done = [c, &mu, &pending, push](grpc::Status status) {
        absl::Status converted = FromGrpcStatus(
            status, c->context,
            absl::StrCat(push ? "Push " : "Pull ", c->placement->param(), "/", c->placement->index(), " at ",
                         c->server));
        absl::MutexLock lock(&mu);
        c->status = std::move(converted);
        --pending;
      };
      auto* stub = StubFor(c->placement->server_id());
      if (push) {
        stub->async()->Push(&c->context, &c->push, &c->pushed, done);
      } else {
        stub->async()->Pull(&c->context, &c->pull, &c->pulled, done);
      }
    }
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](size_t* p) { return *p == 0; }, &pending));  // every call has a deadline
    }

    absl::Status retry;
    uint64_t newer_epoch = 0;
    bool all_ok = true;
    for (const auto& call : calls) {
      if (call->status.ok()) continue;
      all_ok = false;
      std::optional<uint64_t> epoch = GetCurrentEpoch(call->status);
      if (call->status.code() == absl::StatusCode::kFailedPrecondition && epoch) {
        newer_epoch = std::max(newer_epoch, *epoch);
        retry = call->status;
      } else if (call->status.code() == absl::StatusCode::kUnavailable) {
        retry = call->status;
      } else {
        return call->status;  // not retryable: the caller must fix something
      }
    }
    if (all_ok) {
      if (!push) {
        for (const auto& call : calls) {
          const auto* p = call->placement;
          absl::Span<float> dst = out[call->name_index].subspan(p->offset(), p->length());
          PulledChunk& cached = pulled_[{p->param(), p->index()}];
          if (call->pulled.data().empty() && call->pulled.version() == cached.version &&
              cached.values.size() == dst.size()) {
            std::copy(cached.values.begin(), cached.values.end(), dst.begin());  // unchanged: no bytes came
          } else {
            TESSERA_RETURN_IF_ERROR(
                DecodeFloats(call->pulled.data(), dst, absl::StrCat("pulled ", p->param(), "/", p->index())));
            cached.values.assign(dst.begin(), dst.end());
            bytes_pulled_ += static_cast<int64_t>(call->pulled.data().size());
          }
          cached.version = call->pulled.version();
          cached.clock_version = call->pulled.clock_version();
        }
      }
      return absl::OkStatus();
    }
    last = retry;
    if (newer_epoch > 0) {
      TESSERA_RETURN_IF_ERROR(RefreshMap(newer_epoch));
      continue;
    }
    // A backoff between attempts of remote calls, not a synchronisation point.
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  return Annotate(last, absl::StrCat("gave up after ", options_.retries + 1, " attempts"));
}

absl::Status PsClient::Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out) {
  return RunChunks(/*push=*/false, PushRequest::GRADIENT, names, {}, 0, out);
}

absl::Status PsClient::Push(const std::vector<std::string>& names, const std::vector<absl::Span<const float>>& grads,
                            int batch_size) {
  // Checked here too, so that a bad gradient reaches no server: the servers check each chunk on its own, and a
  // push rejected by one of them but applied by another would change part of the parameter.
  for (size_t i = 0; i < names.size() && i < grads.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(CheckFinite(grads[i], absl::StrCat("gradient of '", names[i], "'")));
  }
  return RunChunks(/*push=*/true, PushRequest::GRADIENT, names, grads, batch_size, {});
}

absl::Status PsClient::PushPull(const std::vector<std::string>& names,
                                const std::vector<absl::Span<const float>>& grads, int batch_size,
                                const std::vector<absl::Span<float>>& out) {
  TESSERA_RETURN_IF_ERROR(Push(names, grads, batch_size));
  return Pull(names, out);
}

absl::Status PsClient::Assign(const std::vector<std::string>& names,
                              const std::vector<absl::Span<const float>>& values) {
  return RunChunks(/*push=*/true, PushRequest::ASSIGN, names, values, 1, {});
}

absl::StatusOr<ClockResult> PsClient::Clock() {
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::AdvanceClockResponse gate,
                           scheduler_->AdvanceClock(worker_id_, clock_ + 1, options_.clock_wait_timeout));
  ++clock_;
  ClockResult result;
  result.clock = clock_;
  result.min_clock = gate.min_clock();
  result.stop = gate.stop();
  result.stop_reason = gate.stop_reason();
  return result;
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

}  // namespace tessera
