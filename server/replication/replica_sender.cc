#include "server/replication/replica_sender.h"

#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/grpc_status.h"

namespace tessera {

namespace {
size_t HandoverBytes(const tessera::v1::ReplicateRequest& request) {
  size_t bytes = request.state().values().size() + request.state().optimizer_state().size();
  for (const auto& u : request.updates()) bytes += u.values().size();
  return bytes;
}

// A unit's result as the backup gave it.
absl::StatusOr<int64_t> FromResult(const tessera::v1::ReplicateResult& result, const std::string& what) {
  if (result.code() == 0) return result.version();
  const bool known = result.code() > 0 && result.code() <= static_cast<int>(absl::StatusCode::kUnauthenticated);
  return absl::Status(known ? static_cast<absl::StatusCode>(result.code()) : absl::StatusCode::kUnknown,
                      absl::StrCat(what, ": ", result.message()));
}
}  // namespace

struct GrpcReplicaSender::Core {
  struct Queued {
    std::shared_ptr<const tessera::v1::ReplicateRequest> request;
    std::function<void(absl::StatusOr<int64_t>)> done;
  };
  // The hand-overs for one backup (address, id, incarnation).
  struct Outbox {
    bool in_flight = false;
    std::vector<Queued> queued;
  };
  using Key = std::tuple<std::string, int, uint64_t>;

  Core(std::shared_ptr<const Security> security, absl::Duration timeout, std::shared_ptr<const ReplicaKey> key,
       size_t batch_bytes)
      : timeout(timeout),
        batch_bytes(batch_bytes),
        security(security),
        key(std::move(key)),
        stubs(std::move(security), [](std::shared_ptr<grpc::Channel> channel) {
          return tessera::v1::ParameterServer::NewStub(std::move(channel));
        }) {}

  // The next call's hand-overs for `key`, or none (the outbox is then idle and forgotten).
  std::vector<Queued> TakeNextLocked(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = outboxes.find(key);
    std::vector<Queued> next;
    if (it == outboxes.end()) return next;
    Outbox& outbox = it->second;
    if (outbox.queued.empty()) {
      outboxes.erase(it);
      return next;
    }
    size_t bytes = 0, taken = 0;
    while (taken < outbox.queued.size() &&
           (taken == 0 || bytes + HandoverBytes(*outbox.queued[taken].request) <= batch_bytes)) {
      bytes += HandoverBytes(*outbox.queued[taken].request);
      ++taken;
    }
    next.assign(std::make_move_iterator(outbox.queued.begin()),
                std::make_move_iterator(outbox.queued.begin() + static_cast<std::ptrdiff_t>(taken)));
    outbox.queued.erase(outbox.queued.begin(), outbox.queued.begin() + static_cast<std::ptrdiff_t>(taken));
    outbox.in_flight = true;
    return next;
  }

  // One call with `units` to `backup`; when it ends, each unit's `done` runs and the next call goes.
  static void Call(std::shared_ptr<Core> core, ReplicaTarget backup, std::vector<Queued> units) {
    struct InFlight {
      grpc::ClientContext context;
      tessera::v1::ReplicateBatch request;
      tessera::v1::ReplicateBatchResponse response;
      std::vector<Queued> units;
    };
    auto* call = new InFlight;
    for (const Queued& unit : units) *call->request.add_units() = *unit.request;
    call->units = std::move(units);
    SetTimeout(call->context, core->timeout);
    core->security->Authorize(call->context);
    // For this backup only: another server cannot take it as its own, and the backup learns no secret of ours.
    call->context.AddMetadata(kReplicaCredentialHeader,
                              core->key->Credential(backup.replication_key, backup.server_id, backup.incarnation,
                                                    call->request));
    core->stubs.Get(backup.address)->async()->Replicate(
        &call->context, &call->request, &call->response, [core, backup, call](grpc::Status status) {
          const std::string to = absl::StrCat(" to server ", backup.server_id, " at ", backup.address);
          auto what = [&](int i) {
            const tessera::v1::ChunkState& state = call->request.units(i).state();
            return absl::StrCat("Replicate ", state.param(), "/", state.index(), to);
          };
          const int n = static_cast<int>(call->units.size());
          absl::Status answered = FromGrpcStatus(
              status, call->context, n == 1 ? what(0) : absl::StrCat("Replicate of ", n, " chunks", to));
          if (answered.ok() && call->response.results_size() != n) {
            answered = absl::InternalError(absl::StrCat("Replicate of ", n, " chunks", to, ": ",
                                                        call->response.results_size(), " results"));
          }
          for (int i = 0; i < n; ++i) {
            call->units[i].done(answered.ok() ? FromResult(call->response.results(i), what(i))
                                              : absl::StatusOr<int64_t>(answered));
          }
          // Hand-overs the answers made (the shipper's next ones) join what came meanwhile.
          std::vector<Queued> next;
          {
            absl::MutexLock lock(&core->mu);
            next = core->TakeNextLocked({backup.address, backup.server_id, backup.incarnation});
          }
          delete call;
          if (!next.empty()) Call(core, backup, std::move(next));
        });
  }

  const absl::Duration timeout;
  const size_t batch_bytes;
  const std::shared_ptr<const Security> security;
  const std::shared_ptr<const ReplicaKey> key;
  StubCache<tessera::v1::ParameterServer::Stub> stubs;
  absl::Mutex mu;
  std::map<Key, Outbox> outboxes ABSL_GUARDED_BY(mu);
};

GrpcReplicaSender::GrpcReplicaSender(std::shared_ptr<const Security> security, absl::Duration timeout,
                                     std::shared_ptr<const ReplicaKey> key, size_t batch_bytes)
    : core_(std::make_shared<Core>(std::move(security), timeout, std::move(key), batch_bytes)) {}

void GrpcReplicaSender::Send(const ReplicaTarget& backup,
                             std::shared_ptr<const tessera::v1::ReplicateRequest> request,
                             std::function<void(absl::StatusOr<int64_t>)> done) {
  {
    absl::MutexLock lock(&core_->mu);
    Core::Outbox& outbox = core_->outboxes[{backup.address, backup.server_id, backup.incarnation}];
    outbox.queued.push_back({std::move(request), std::move(done)});
    if (outbox.in_flight) return;  // goes with the next call
    outbox.in_flight = true;       // held for the start below: what comes meanwhile joins it
  }
  // Started from the sender's own thread, not the caller's: the hand-overs the caller's siblings make meanwhile
  // (the other chunks of a round that closed, of a push that came in parts) go in this first call, not the next.
  starts_.Submit([core = core_, backup] {
    std::vector<Core::Queued> now;
    {
      absl::MutexLock lock(&core->mu);
      const Core::Key key{backup.address, backup.server_id, backup.incarnation};
      core->outboxes[key].in_flight = false;
      now = core->TakeNextLocked(key);
    }
    if (!now.empty()) Core::Call(core, backup, std::move(now));
  });
}

}  // namespace tessera
