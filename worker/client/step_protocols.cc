#include "worker/client/step_protocols.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/rpc/scheduler_client.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "worker/client/chunk_calls.h"

namespace tessera {

// One exchange per chunk, started as each gradient is sent; the values arrive while the caller goes on
// (WaitValues). What the clock does is the mode's (FinishClock).
class ExchangeStep : public StepExchange {
 public:
  ExchangeStep(PsClient* client, const std::vector<std::string>& names,
               const std::vector<absl::Span<const float>>& grads, int batch_size,
               const std::vector<absl::Span<float>>& out)
      : client_(client),
        names_(names),
        grads_(grads),
        batch_size_(batch_size),
        out_(out),
        stamp_(client->NewStamp()),  // one sequence number for the step's exchanges, reused by their retries
        sent_(names.size(), false),
        made_upto_(names.size(), 0),
        checked_upto_(names.size(), 0),
        deferred_(names.size(), false),
        settled_(names.size(), false),
        batch_(client->options_.window_per_server, &client->launcher_) {}

  ~ExchangeStep() override {
    // Values that were not waited for may be partly written: their cached versions no longer describe them.
    for (size_t i = 0; i < names_.size(); ++i) {
      if (settled_[i]) continue;
      for (ChunkCall* c : batch_.CallsOf(i)) client_->pulled_.erase(c->key());
    }
  }

  absl::Status Send(int index) override {
    if (index < 0 || static_cast<size_t>(index) >= names_.size() || sent_[index]) {
      return absl::InvalidArgumentError(absl::StrCat("Send(", index, "): no such unsent parameter"));
    }
    sent_[index] = true;
    return SendUpTo(index, grads_[index].size());
  }

  absl::Status SendPart(int index, size_t values) override {
    if (index < 0 || static_cast<size_t>(index) >= names_.size() || sent_[index]) {
      return absl::InvalidArgumentError(absl::StrCat("SendPart(", index, "): no such unsent parameter"));
    }
    return SendUpTo(index, std::min(values, grads_[index].size()));
  }

  absl::StatusOr<ClockResult> Finish() override {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (!sent_[i]) TESSERA_RETURN_IF_ERROR(Send(static_cast<int>(i)));
    }
    return FinishClock();
  }

  absl::Status WaitValues(int index, const std::function<bool()>& give_up) override {
    if (index < 0 || static_cast<size_t>(index) >= names_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("WaitValues(", index, "): no such parameter"));
    }
    if (settled_[index]) return absl::OkStatus();
    if (!sent_[index]) {
      return absl::FailedPreconditionError(absl::StrCat("WaitValues: '", names_[index], "' was never sent"));
    }
    if (!batch_.WaitForName(index, [&] { return JobOver() || (give_up && give_up()); })) {
      return absl::AbortedError(absl::StrCat("stopped waiting for the values of '", names_[index],
                                             "': the job is stopping"));
    }
    FailedCalls failed;
    TESSERA_ASSIGN_OR_RETURN(std::vector<size_t> retry, client_->Absorb(batch_.CallsOf(index), failed));
    for (const ChunkCall* c : batch_.CallsOf(index)) round_skipped_ = round_skipped_ || (c->status.ok() && c->skipped);
    if (!retry.empty() || deferred_[index]) {
      // Retry through the ordinary path, with the same sequence number: a server that applied the push
      // answers the retry as a duplicate, with the values.
      if (failed.newer_epoch() > 0) {
        // A scheduler not yet at the servers' view is waited for by RunChunks' own retries.
        bool behind = false;
        if (absl::Status refreshed = client_->RefreshMap(failed.newer_epoch(), &behind); !refreshed.ok() && !behind) {
          return refreshed;
        }
      }
      TESSERA_RETURN_IF_ERROR(client_->RunChunks(kExchange, {names_[index]}, {grads_[index]}, batch_size_,
                                                 {out_[index]}, StampOf(stamp_, index)));
    }
    settled_[index] = true;
    return absl::OkStatus();
  }

  bool stopped() const override { return client_->scheduler_->stopping(); }
  bool skipped() const override { return StepExchange::skipped() || round_skipped_; }

 protected:
  // Every gradient is on its way: advances the clock.
  virtual absl::StatusOr<ClockResult> FinishClock() = 0;
  // Asked while waiting for values: is the job over, so that they may never come?
  virtual bool JobOver() { return false; }

  PsClient* const client_;
  ChunkBatch batch_;

 private:
  const std::vector<std::string>& names_;
  const std::vector<absl::Span<const float>> grads_;
  const int batch_size_;
  const std::vector<absl::Span<float>> out_;
  const Stamp stamp_;
  std::vector<bool> sent_;
  std::vector<size_t> made_upto_;     // values of each gradient whose chunks are on their way
  std::vector<size_t> checked_upto_;  // values of each gradient found finite
  std::vector<bool> deferred_;  // sent, but no chunk call could be made (a server left the view)
  std::vector<bool> settled_;   // values in place and absorbed into the client's cache
  bool round_skipped_ = false;  // a reply said its round applied no update (another worker skipped the step)

  // Starts the chunks of parameter `index` that lie within its first `end` values and were not started yet,
  // once those values are found finite.
  absl::Status SendUpTo(int index, size_t end) {
    if (deferred_[index] || end <= made_upto_[index]) return absl::OkStatus();
    if (end > checked_upto_[index]) {
      const size_t from = checked_upto_[index];
      TESSERA_RETURN_IF_ERROR(CheckFinite(grads_[index].subspan(from, end - from),
                                          absl::StrCat("gradient of '", names_[index], "'"), from));
      checked_upto_[index] = end;
    }
    absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> calls =
        client_->MakeCalls(kExchange, index, names_[index], grads_[index], batch_size_, out_[index],
                           StampOf(stamp_, index), made_upto_[index], end);
    if (absl::IsUnavailable(calls.status())) {
      deferred_[index] = true;  // sent through the retrying path when its values are waited for
      return absl::OkStatus();
    }
    if (!calls.ok()) return calls.status();
    for (auto& c : *calls) {
      made_upto_[index] = std::max(made_upto_[index],
                                   static_cast<size_t>(c->placement->offset() + c->placement->length()));
      batch_.Add(std::move(c));
    }
    return absl::OkStatus();
  }
};

class SyncExchangeStep final : public ExchangeStep {
 public:
  // `clock_after_sends` (backup workers): the clock goes out in Finish instead of at once.
  SyncExchangeStep(PsClient* client, const std::vector<std::string>& names,
                   const std::vector<absl::Span<const float>>& grads, int batch_size,
                   const std::vector<absl::Span<float>>& out, bool clock_after_sends)
      : ExchangeStep(client, names, grads, batch_size, out),
        clock_after_sends_(clock_after_sends),
        clock_(std::make_shared<ClockState>()) {
    if (!clock_after_sends_) StartClock();
  }

  bool stopped() const override { return clock_->stop.load() || ExchangeStep::stopped(); }

 protected:
  absl::StatusOr<ClockResult> FinishClock() override {
    if (clock_after_sends_) StartClock();
    absl::StatusOr<tessera::v1::AdvanceClockResponse> gate;
    {
      absl::MutexLock lock(&clock_->mu);
      clock_->mu.Await(absl::Condition(
          +[](std::optional<absl::StatusOr<tessera::v1::AdvanceClockResponse>>* r) { return r->has_value(); },
          &clock_->result));  // the clock call has its own deadline
      gate = *clock_->result;
    }
    TESSERA_RETURN_IF_ERROR(gate.status());
    // The job is over: rounds still open may never close, so nobody waits for them.
    if (gate->stop()) batch_.CancelAll();
    return client_->Advanced(*gate);
  }

  // A round closes only when every worker pushed it; one that left (the job then stops) never will: the gate's
  // answer says so, and the scheduler is asked about once a second.
  bool JobOver() override {
    if (clock_->stop.load()) return true;
    if (absl::Now() < next_poll_) return false;
    next_poll_ = absl::Now() + absl::Seconds(1);
    return client_->JobStopped();
  }

 private:
  struct ClockState {
    absl::Mutex mu;
    std::optional<absl::StatusOr<tessera::v1::AdvanceClockResponse>> result ABSL_GUARDED_BY(mu);
    // The gate answered stop or failed. Atomic: read by give-up checks without `mu`.
    std::atomic<bool> stop{false};
  };

  // Advances the scheduler's clock on the client's clock executor, alongside the exchanges.
  void StartClock() {
    auto state = clock_;
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

  const bool clock_after_sends_;
  const std::shared_ptr<ClockState> clock_;  // shared with the clock call, which may outlive the step
  absl::Time next_poll_ = absl::Now() + absl::Seconds(1);
};

class AsyncExchangeStep final : public ExchangeStep {
 public:
  using ExchangeStep::ExchangeStep;

 protected:
  absl::StatusOr<ClockResult> FinishClock() override { return client_->Clock(); }  // never waits at the gate
};

// A step whose gradients all leave in Finish: Send only checks one and notes that it is final.
class DeferredStep : public StepExchange {
 public:
  DeferredStep(PsClient* client, const std::vector<std::string>& names,
               const std::vector<absl::Span<const float>>& grads, int batch_size,
               const std::vector<absl::Span<float>>& out)
      : client_(client), names_(names), grads_(grads), batch_size_(batch_size), out_(out), sent_(names.size(), false) {}

  absl::Status Send(int index) override {
    if (index < 0 || static_cast<size_t>(index) >= names_.size() || sent_[index]) {
      return absl::InvalidArgumentError(absl::StrCat("Send(", index, "): no such unsent parameter"));
    }
    sent_[index] = true;
    return CheckFinite(grads_[index], absl::StrCat("gradient of '", names_[index], "'"));
  }

 protected:
  // Finish: the gradients not sent yet are final too (each checked as Send does).
  absl::Status SendTheRest() {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (!sent_[i]) TESSERA_RETURN_IF_ERROR(Send(static_cast<int>(i)));
    }
    return absl::OkStatus();
  }

  PsClient* const client_;
  const std::vector<std::string> names_;
  const std::vector<absl::Span<const float>> grads_;
  const int batch_size_;
  const std::vector<absl::Span<float>> out_;

 private:
  std::vector<bool> sent_;
};

// Push, clock gate and pull, in Finish: the values of the next step are those after the gate.
class SspStep final : public DeferredStep {
 public:
  using DeferredStep::DeferredStep;

  absl::StatusOr<ClockResult> Finish() override {
    TESSERA_RETURN_IF_ERROR(SendTheRest());
    // One sequence number for the step; the parameters go out in groups of one learning-rate factor each.
    const Stamp stamp = client_->NewStamp();
    std::map<float, std::vector<size_t>> groups;
    for (size_t i = 0; i < names_.size(); ++i) groups[StampOf(stamp, i).lr_factor].push_back(i);
    for (const auto& [factor, members] : groups) {
      std::vector<std::string> names;
      std::vector<absl::Span<const float>> grads;
      for (size_t i : members) {
        names.push_back(names_[i]);
        grads.push_back(grads_[i]);
      }
      TESSERA_RETURN_IF_ERROR(client_->RunChunks(kPush, names, grads, batch_size_, {}, StampOf(stamp, members[0])));
    }
    TESSERA_ASSIGN_OR_RETURN(ClockResult gate, client_->Clock());
    if (!gate.stop) TESSERA_RETURN_IF_ERROR(client_->Pull(names_, out_));
    return gate;
  }

  absl::Status WaitValues(int index, const std::function<bool()>&) override {
    if (index < 0 || static_cast<size_t>(index) >= names_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("WaitValues(", index, "): no such parameter"));
    }
    return absl::OkStatus();  // Finish pulled them
  }
};

namespace {

// The step of the job's consistency mode.
std::unique_ptr<StepExchange> MakeModeStep(PsClient* client, const std::vector<std::string>& names,
                                           const std::vector<absl::Span<const float>>& grads, int batch_size,
                                           const std::vector<absl::Span<float>>& out) {
  const tessera::v1::ConsistencySpec& consistency = client->job().consistency();
  switch (consistency.mode()) {
    case tessera::v1::ConsistencySpec::SYNC:
      return std::make_unique<SyncExchangeStep>(client, names, grads, batch_size, out,
                                                /*clock_after_sends=*/consistency.backup_workers() > 0);
    case tessera::v1::ConsistencySpec::SSP:
      return std::make_unique<SspStep>(client, names, grads, batch_size, out);
    default:
      return std::make_unique<AsyncExchangeStep>(client, names, grads, batch_size, out);
  }
}

}  // namespace

// optimizer.clip_global_norm: the step's gradients are multiplied by min(1, clip / (norm + 1e-6)) (as
// torch.nn.utils.clip_grad_norm_) before the mode's step sends them, so they leave once all are final (Finish).
// SYNC: `norm` is of the round's batch-weighted mean gradient, from a norm round on every chunk (each chunk's
// squared norm, added in chunk order, the same on every worker); ASYNC and SSP: of this worker's own gradient.
class ClippedStep final : public DeferredStep {
 public:
  ClippedStep(PsClient* client, const std::vector<std::string>& names,
              const std::vector<absl::Span<const float>>& grads, int batch_size,
              const std::vector<absl::Span<float>>& out, double clip)
      : DeferredStep(client, names, grads, batch_size, out), clip_(clip) {}

  absl::StatusOr<ClockResult> Finish() override {
    TESSERA_RETURN_IF_ERROR(SendTheRest());
    double sq = 0;
    if (client_->job().consistency().mode() == tessera::v1::ConsistencySpec::SYNC) {
      std::map<std::pair<std::string, int>, double> norms;
      TESSERA_RETURN_IF_ERROR(
          client_->RunChunks(kNorm, names_, grads_, batch_size_, {}, client_->NewStamp(), &norms));
      for (const auto& [chunk, chunk_sq] : norms) sq += chunk_sq;
    } else {
      for (absl::Span<const float> g : grads_) {
        for (float v : g) sq += static_cast<double>(v) * v;
      }
    }
    coefficient_ = static_cast<float>(std::min(1.0, clip_ / (std::sqrt(sq) + 1e-6)));
    std::vector<absl::Span<const float>> clipped = grads_;
    if (coefficient_ < 1.0f) {
      scaled_.resize(grads_.size());
      for (size_t i = 0; i < grads_.size(); ++i) {
        scaled_[i].resize(grads_[i].size());
        for (size_t j = 0; j < grads_[i].size(); ++j) scaled_[i][j] = grads_[i][j] * coefficient_;
        clipped[i] = scaled_[i];
      }
    }
    inner_ = MakeModeStep(client_, names_, clipped, batch_size_, out_);
    CopyTermsTo(*inner_);
    return inner_->Finish();
  }

  absl::Status WaitValues(int index, const std::function<bool()>& give_up) override {
    if (inner_ == nullptr) return absl::FailedPreconditionError("WaitValues before Finish: the values come after it");
    return inner_->WaitValues(index, give_up);
  }
  bool stopped() const override { return inner_ != nullptr && inner_->stopped(); }
  bool skipped() const override { return inner_ != nullptr ? inner_->skipped() : StepExchange::skipped(); }

 private:
  const double clip_;
  float coefficient_ = 1.0f;
  std::vector<std::vector<float>> scaled_;  // the clipped gradients, while the inner step sends them
  std::unique_ptr<StepExchange> inner_;
};

std::unique_ptr<StepExchange> MakeStepProtocol(PsClient* client, const std::vector<std::string>& names,
                                               const std::vector<absl::Span<const float>>& grads, int batch_size,
                                               const std::vector<absl::Span<float>>& out) {
  const float clip = client->job().optimizer().clip_global_norm();
  if (clip > 0) return std::make_unique<ClippedStep>(client, names, grads, batch_size, out, clip);
  return MakeModeStep(client, names, grads, batch_size, out);
}

}  // namespace tessera
