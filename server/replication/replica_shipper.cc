#include "server/replication/replica_shipper.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {

namespace {
int64_t StateBytes(const tessera::v1::ReplicateRequest& request) {
  size_t bytes = request.state().values().size() + request.state().optimizer_state().size();
  for (const auto& u : request.updates()) bytes += u.values().size();
  return static_cast<int64_t>(bytes);
}
}  // namespace

ReplicaShipper::~ReplicaShipper() {
  absl::MutexLock lock(&ships_mu_);
  stopping_ = true;
  ships_mu_.Await(absl::Condition(
      +[](int* in_flight) { return *in_flight == 0; }, &ships_in_flight_));
}

void ReplicaShipper::AfterApplied(Unit& unit, int64_t version, std::function<void(absl::Status)> done) {
  absl::Status held = absl::OkStatus();
  {
    absl::ReaderMutexLock lock(&state_.mu);
    absl::MutexLock unit_lock(&unit.mu);
    UnitReplication& replication = unit.replication;
    if (state_.server_id >= 0 && replication.primary != state_.server_id) {
      // A view adopted since the update moved the unit away or demoted it, and dropped its backups: the update
      // may be on no copy that counts. The caller asks the new primary, which applies it unless its copy holds it.
      held = MovedAway(state_.epoch);
    } else if (!replication.backups.empty() && version > replication.replicated_version) {
      replication.waiting.emplace_back(version, std::move(done));
      done = nullptr;
    }
  }
  if (done) {
    done(held);
    return;
  }
  Ship(unit);
}

void ReplicaShipper::Ship(Unit& unit) {
  {
    absl::MutexLock lock(&ships_mu_);
    if (stopping_) return;
    ++ships_in_flight_;
  }
  std::optional<Handover> handover;
  {
    absl::ReaderMutexLock lock(&state_.mu);
    absl::MutexLock unit_lock(&unit.mu);
    handover = PrepareLocked(unit);
  }
  if (!handover.has_value() || handover->targets.empty()) {
    absl::MutexLock lock(&ships_mu_);
    --ships_in_flight_;
    return;
  }
  bytes_sent_ += static_cast<int64_t>(handover->targets.size()) * StateBytes(*handover->request);
  Send(unit, std::move(*handover));
}

std::optional<ReplicaShipper::Handover> ReplicaShipper::PrepareLocked(Unit& unit) {
  UnitReplication& replication = unit.replication;
  const bool wanted = !replication.backups.empty() && !replication.shipping &&
                      (replication.replicated_version < 0 || !replication.waiting.empty());
  if (!wanted) return std::nullopt;
  replication.shipping = true;
  Handover handover;
  handover.request = std::make_shared<tessera::v1::ReplicateRequest>();
  handover.generation = replication.generation;
  tessera::v1::ReplicateRequest& request = *handover.request;
  request.set_epoch(state_.epoch);
  request.set_server_id(state_.server_id);
  // The updates since the version every backup holds, when they are kept; otherwise the whole state, from which
  // the log starts again.
  auto& log = replication.log;
  const bool in_step = replication.replicated_version >= 0 && replication.log_base >= 0 &&
                       replication.log_base <= replication.replicated_version &&
                       (log.empty() ? replication.log_base : log.back().version()) == unit.version;
  if (in_step) {
    for (const auto& u : log) {
      if (u.version() > replication.replicated_version) *request.add_updates() = u;
    }
    *request.mutable_state() = unit.ReplicaStateLocked(/*values=*/false);
  } else {
    *request.mutable_state() = unit.ReplicaStateLocked(/*values=*/true);
    replication.log_base = unit.version;
    log.clear();
    replication.log_bytes = 0;
  }
  for (int b : replication.backups) {
    auto peer = state_.peers.find(b);
    handover.targets.push_back(peer == state_.peers.end()
                                   ? ReplicaTarget{"", b, 0, ""}
                                   : ReplicaTarget{peer->second.address, b, peer->second.incarnation,
                                                   peer->second.replication_key});
  }
  return handover;
}

void ReplicaShipper::Send(Unit& unit, Handover handover) {
  const int64_t version = handover.request->state().version();
  struct Pending {
    absl::Mutex mu;
    size_t left;
    absl::Status status;
    int failed = -1;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = handover.targets.size();
  for (const ReplicaTarget& target : handover.targets) {
    // A backup holds the hand-over only when it says it holds the very version sent (one that ignored it, or
    // holds another state, is sent the whole state again).
    auto one_done = [this, &unit, pending, generation = handover.generation, version,
                     id = target.server_id](absl::StatusOr<int64_t> held) {
      absl::Status status = held.status();
      if (held.ok() && *held != version) {
        status = absl::FailedPreconditionError(absl::StrCat("backup server ", id, " holds version ", *held,
                                                            " of chunk ", unit.key.first, "/", unit.key.second, "; ",
                                                            version, " was sent"));
      }
      absl::Status all;
      int failed;
      {
        absl::MutexLock lock(&pending->mu);
        if (!status.ok() && pending->status.ok()) {
          pending->status = status;
          pending->failed = id;
        }
        if (--pending->left > 0) return;
        all = pending->status;
        failed = pending->failed;
      }
      Shipped(unit, generation, version, all, failed);
      absl::MutexLock lock(&ships_mu_);
      --ships_in_flight_;
    };
    if (target.address.empty()) {
      one_done(absl::UnavailableError("a backup is not in this server's view"));
    } else {
      sender_->Send(target, handover.request, std::move(one_done));
    }
  }
}

void ReplicaShipper::Shipped(Unit& unit, uint64_t generation, int64_t version, const absl::Status& status,
                             int failed) {
  std::vector<std::function<void(absl::Status)>> ready;
  bool retry = false;
  {
    absl::MutexLock unit_lock(&unit.mu);
    UnitReplication& replication = unit.replication;
    replication.shipping = false;
    if (generation == replication.generation) {
      if (status.ok()) {
        replication.replicated_version = std::max(replication.replicated_version, version);
        // What every backup holds leaves the log.
        auto& log = replication.log;
        const int64_t replicated = replication.replicated_version;
        auto held = std::find_if(log.begin(), log.end(), [replicated](const auto& u) {
          return u.version() > replicated;
        });
        for (auto it = log.begin(); it != held; ++it) replication.log_bytes -= it->values().size();
        log.erase(log.begin(), held);
        if (replication.log_base >= 0) replication.log_base = std::max(replication.log_base, replicated);
      } else {
        retry = true;
        // A backup out of step (or refusing): the next hand-over is the whole state.
        if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) replication.replicated_version = -1;
        LOG_EVERY_N(WARNING, 100) << "chunk " << unit.key.first << "/" << unit.key.second
                                  << ": a backup did not take its state, trying again: " << status;
      }
    }
    auto& waiting = replication.waiting;
    const int64_t replicated = replication.replicated_version;
    auto unheld = std::partition(waiting.begin(), waiting.end(), [replicated](const auto& w) {
      return w.first > replicated;
    });
    for (auto it = unheld; it != waiting.end(); ++it) ready.push_back(std::move(it->second));
    waiting.erase(unheld, waiting.end());
  }
  for (auto& done : ready) done(absl::OkStatus());
  if (retry) {
    ShipLater(&unit, failed, status);
  } else {
    Ship(unit);  // updates that came meanwhile, or backups that changed meanwhile
  }
}

void ReplicaShipper::ShipLater(Unit* unit, int failed, const absl::Status& why) {
  {
    absl::MutexLock lock(&retry_mu_);
    retry_.insert(unit);
    if (failed >= 0 && (absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why))) unreachable_[failed] = why;
    if (retry_scheduled_) return;
    retry_scheduled_ = true;
  }
  retries_.Submit([this] { Retry(); });
}

void ReplicaShipper::Retry() {
  std::map<int, absl::Status> unreachable;
  {
    absl::MutexLock lock(&retry_mu_);
    const absl::Time now = absl::Now();
    for (auto& [id, why] : unreachable_) {
      absl::Time& last = reported_[id];
      if (now - last < absl::Seconds(1)) continue;
      last = now;
      unreachable[id] = why;
    }
    unreachable_.clear();
  }
  if (on_unreachable_) {
    for (const auto& [id, why] : unreachable) {
      uint64_t incarnation = 0;
      {
        absl::ReaderMutexLock lock(&state_.mu);
        if (auto peer = state_.peers.find(id); peer != state_.peers.end()) incarnation = peer->second.incarnation;
      }
      on_unreachable_(id, incarnation, why);
    }
  }
  absl::SleepFor(absl::Milliseconds(50));
  std::set<Unit*> units;
  {
    absl::MutexLock lock(&retry_mu_);
    units.swap(retry_);
    retry_scheduled_ = false;
  }
  for (Unit* unit : units) Ship(*unit);
}

}  // namespace tessera
