// The worker-side client library: what a training loop programs against.
//
//   tessera::PsClient::Options options;
//   options.scheduler_address = "127.0.0.1:7000";
//   auto client = tessera::PsClient::Connect(options);      // registers: rank and JobSpec come back
//   if (!client.ok()) return client.status();
//   tessera::v1::ParameterSpec w;                            // name, dtype, shape, init
//   w.set_name("w"); w.set_dtype(tessera::v1::DT_FLOAT32); w.add_shape(1000);
//   TESSERA_RETURN_IF_ERROR((*client)->Declare({w}));        // placed on the servers in chunks
//   std::vector<float> values(1000), grad(1000);
//   while (true) {
//     TESSERA_RETURN_IF_ERROR((*client)->Pull({"w"}, {absl::MakeSpan(values)}));
//     ... compute grad from values on a batch of 32 ...
//     TESSERA_RETURN_IF_ERROR((*client)->Push({"w"}, {grad}, /*batch_size=*/32));
//     TESSERA_ASSIGN_OR_RETURN(tessera::ClockResult clock, (*client)->Clock());
//     if (clock.stop) break;
//   }
//   TESSERA_RETURN_IF_ERROR((*client)->Done());
//
// Every chunk of a call travels as its own RPC; up to Options::window_per_server of them are in flight per
// server, the rest queue in the order the names were given (so list the first layer first). Values go from
// the caller's spans to the socket and from the socket into the caller's spans, copied once on each side.
// Calls retry by themselves when a server is briefly unavailable and when the shard map moved on
// (FAILED_PRECONDITION with a newer epoch: the map is refreshed from the scheduler first). A retried push
// reuses its sequence number, so a server applies it at most once.
//
// Unchanged chunks cost no bytes: a Pull into the same memory as the previous Pull of a chunk names the version
// it holds, and a server whose chunk has not changed since sends nothing. That assumes the caller did not
// write into that memory in between; pull into other memory (or call ForgetPulledValues()) otherwise.
//
// A training step can be one exchange per chunk instead of push, clock and pull (see BeginStep):
//
//   auto step = client->BeginStep(names, grads, batch_size, values);   // values: where the new values go
//   for (int i = last layer; i >= 0; --i) { ...backward of layer i...; step->Send(i); }   // pushes start now
//   TESSERA_ASSIGN_OR_RETURN(tessera::ClockResult clock, step->Finish());  // clock advanced
//   for (int i = 0; i < layers; ++i) { step->WaitValues(i); ...forward of layer i... }  // as values arrive
//
// Consistency is the job's: in SYNC, Push contributes to the round of the current clock and Clock() returns when
// every worker has pushed that round; in SSP(s), Clock() holds a worker more than s clocks ahead of the slowest;
// in ASYNC it never waits.
//
// The library's parts: this API, which knows no transport; the chunk calls (chunk_calls.h), which carry each
// chunk's request through the job's transport (chunk_transport.h: gRPC in grpc_chunk_transport.cc, UCX in
// ucx_chunk_transport.cc); the rows of embedding tables (row_client.h over row_calls.h); how every call is
// retried (call_retries.h); and the step protocols (step_protocols.h), one per consistency mode, behind BeginStep.
#ifndef TESSERA_WORKER_CLIENT_PS_CLIENT_H_
#define TESSERA_WORKER_CLIENT_PS_CLIENT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/batch_slice.h"
#include "common/rpc/security_options.h"
#include "common/model/shard_map.h"
#include "common/base/thread_pool.h"
#include "proto/cluster.pb.h"
#include "worker/client/call_retries.h"
#include "worker/client/chunk_types.h"
#include "worker/client/row_client.h"

namespace tessera {

class ChunkCaller;
class ShardMapIndex;
struct ChunkCall;
class Heartbeater;
class SchedulerClient;
class Security;
class StepExchange;

struct ClockResult {
  int64_t clock = 0;      // this worker's clock now (steps completed)
  int64_t min_clock = 0;  // the slowest worker's clock when the gate opened
  bool stop = false;      // the job is over: finish and call Done()
  std::string stop_reason;
  bool rolled_back = false;  // SYNC: the job went back to a checkpoint; see PsClient::TakeRollback
  bool late = false;         // SYNC with backup workers: the step's round closed without this worker's gradients
  std::vector<int64_t> joining_clocks;  // SYNC: start clocks of live workers that joined after the start
  int values_keeper = 0;  // the worker that sends what rank 0 sends while it is there (AdvanceClockResponse)
  int64_t checkpoint_clock = 0;  // SYNC, the script's optimizer: a checkpoint is cut at this clock (0: none)
};

// Not thread-safe: one training loop drives one client (its heartbeat runs on a thread of its own).
class PsClient {
 public:
  struct Options {
    std::string scheduler_address;                   // HOST:PORT (required)
    std::string device = "cpu";                      // reported to the scheduler
    int rank = -1;                                   // the rank to take (kept across restarts); -1: any free one
    absl::Duration connect_timeout = absl::Seconds(120);  // how long to wait for the scheduler at start-up
    absl::Duration rpc_timeout = absl::Seconds(30);  // per data-plane RPC
    absl::Duration clock_wait_timeout = absl::Minutes(5);  // longest wait at the clock gate
    absl::Duration declare_timeout = absl::Minutes(2);     // waiting for servers to register
    int retries = 8;                                 // per call, on UNAVAILABLE or a stale epoch, at least
    // ... and for at least this long: longer than the scheduler's heartbeat timeout, so that a server's death
    // is noticed and its chunks moved before a call gives up.
    absl::Duration unavailable_window = absl::Seconds(30);
    int window_per_server = 8;                       // chunk RPCs in flight per server
    int connections_per_server = 1;                  // TCP connections per server; chunks alternate among them
    // What carries the chunk calls: "" the job's (JobSpec.transport), or "grpc" or "ucx" to override it. UCX
    // needs a job with trusted_network: true.
    std::string transport;
    // UCX: microseconds its progress thread polls after events before sleeping; -1: 50 where the process may use
    // more than 4 cores, else 0 (common/fabric/ucx_worker.h).
    int fabric_spin_us = -1;
    // UCX: whether it may use TCP (between hosts without RDMA; the servers need --fabric_tcp too). Off, it listens
    // on no TCP port (common/fabric/ucx_worker.h FabricOptions::tcp).
    bool fabric_tcp = false;
    bool heartbeat = true;
    SecurityOptions security;                        // TLS files and the job token (common/rpc/security.h)
    // Called once (on the heartbeat thread) when the scheduler has not answered for its heartbeat timeout, or
    // refuses this worker's heartbeats (declared lost, or replaced by a newer incarnation).
    std::function<void(const absl::Status&)> on_scheduler_lost;
  };

  // Registers with the scheduler. UNAVAILABLE naming the address when no scheduler answers.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PsClient>> Connect(const Options& options);
  ~PsClient();

  int worker_id() const { return worker_id_; }
  // 1 for the first process of this rank, +1 for each that rejoined the job.
  uint64_t incarnation() const { return incarnation_; }
  // The key the scheduler gave this worker: its pushes and its calls to the scheduler carry it.
  const std::string& member_key() const { return member_key_; }
  const tessera::v1::JobSpec& job() const { return job_; }
  // Steps this worker has completed; after Connect, where it starts (0, or where a rejoining rank resumes).
  int64_t clock() const { return clock_; }
  // SYNC with a balanced split: this worker's examples of the global batch of step clock(), as the scheduler
  // decided them (count 0: the default, batch_size examples at rank * batch_size).
  BatchSlice batch_slice() const { return slice_; }
  // The last step computed `samples` examples in `busy` (forward, backward, without waiting for values): sent
  // with the next clock, as the scheduler's measure of this worker's throughput.
  void NoteStep(int samples, absl::Duration busy) {
    step_samples_ = samples;
    step_busy_ = busy;
  }
  uint64_t epoch() const { return map_ ? map_->epoch() : 0; }
  // The shard map this client holds; null before Declare.
  const tessera::v1::ShardMap* shard_map() const { return map_ ? &map_->map() : nullptr; }

  // Declares parameters (all workers declare the same ones; the first declaration places them). Blocks until
  // every server has registered and holds its chunks. FAILED_PRECONDITION when a name is already declared
  // with another shape.
  [[nodiscard]] absl::Status Declare(const std::vector<tessera::v1::ParameterSpec>& params);

  // The parameters the job's servers hold now, as the scheduler has them: empty before the first declaration.
  // A worker checks its model against them before it declares.
  [[nodiscard]] absl::StatusOr<std::vector<tessera::v1::ParameterSpec>> JobParameters();

  // Fills out[i] with the current value of names[i]. NOT_FOUND for an undeclared name; INVALID_ARGUMENT when a
  // span's size is not the parameter's element count.
  [[nodiscard]] absl::Status Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out);

  // Sends gradients of the mean loss over `batch_size` examples, for this worker's current clock. The server
  // rejects non-finite values (INVALID_ARGUMENT) and changes nothing then.
  [[nodiscard]] absl::Status Push(const std::vector<std::string>& names,
                                  const std::vector<absl::Span<const float>>& grads, int batch_size);

  // Push and Pull of the same parameters in one exchange per chunk: `out` receives the values after this push.
  // In SYNC each chunk answers once its round has closed (every worker pushed it), so this call waits for the
  // other workers like a barrier; then call Clock() as usual.
  [[nodiscard]] absl::Status PushPull(const std::vector<std::string>& names,
                                      const std::vector<absl::Span<const float>>& grads, int batch_size,
                                      const std::vector<absl::Span<float>>& out);

  // Overwrites the values of names[i] (initialisation or restore); applied at most once, like a push. It is not
  // a SYNC round: the rounds go on at the workers' clocks.
  [[nodiscard]] absl::Status Assign(const std::vector<std::string>& names,
                                    const std::vector<absl::Span<const float>>& values);

  // Embedding tables (ParameterSpec.embedding, declared like dense parameters; common/model/shard_map.h). Fills `out`
  // (ids.size() rows of the table's dim) with the rows of `ids`; an id repeated in `ids` travels once. A row no
  // gradient reached reads its initial values (zeros while it waits for admission). NOT_FOUND for an undeclared
  // table; INVALID_ARGUMENT for a dense parameter or an `out` of another size.
  [[nodiscard]] absl::Status PullRows(const std::string& table, absl::Span<const uint64_t> ids, absl::Span<float> out);

  // Sends the gradients `grads` (ids.size() rows of dim) of the rows of `ids`, of the mean loss over `batch_size`
  // examples, for this worker's current clock. The rows of an id repeated in `ids` are summed first, in an
  // order fixed by their values (so the sum does not depend on the batch's order), and each id travels once.
  // In a step, push the rows before the dense parameters (Push, PushPull or BeginStep): in SYNC a step's dense
  // round then closes only once every worker's rows are applied, which is what the next pull and a
  // checkpoint's cut rely on. `lr_factor` scales the table's learning rate (a schedule's factor); `skip` says
  // the worker skips this step (its gradient scaler found inf or NaN: in SYNC the round then changes nothing).
  // In SYNC, push every table the job trains once per step, with no ids when the batch touched none: the push
  // goes to every server of the table, whose round of rows waits for every worker (server/consistency/
  // row_rounds.h); each row then takes the round's batch-weighted mean gradient once, as one process would.
  // RESOURCE_EXHAUSTED, nothing applied, when the new rows do not fit a server's row memory.
  using RowsPushed = tessera::RowsPushed;
  [[nodiscard]] absl::StatusOr<RowsPushed> PushRows(const std::string& table, absl::Span<const uint64_t> ids,
                                                    absl::Span<const float> grads, int batch_size,
                                                    float lr_factor = 1.0f, bool skip = false);

  // Completes this worker's step: advances its clock and waits at the gate for the next one.
  [[nodiscard]] absl::StatusOr<ClockResult> Clock();

  // Starts a step whose gradients are sent parameter by parameter as they become final (StepExchange::Send)
  // and whose answer is the values for the next step, written into `out` as they arrive (WaitValues), and the
  // clock (Finish). In SYNC each chunk's exchange is answered when its round closes and the scheduler's clock
  // is advanced alongside, off the step's path; in ASYNC each push is answered with the values right after it;
  // in SSP the step runs push, clock gate and pull in Finish. The names and spans must stay valid, and `out`
  // unread, until the values were waited for or the exchange destroyed.
  [[nodiscard]] std::unique_ptr<StepExchange> BeginStep(const std::vector<std::string>& names,
                                                        const std::vector<absl::Span<const float>>& grads,
                                                        int batch_size, const std::vector<absl::Span<float>>& out);

  // SYNC: the clock to go on from when the job was rolled back to a checkpoint (a server was lost) since the last
  // call, else nullopt. Calls of the voided steps fail with ABORTED saying so. Taking it sets this client's
  // clock there; pull the values again and train on from that clock.
  std::optional<int64_t> TakeRollback();

  // The oldest version among the chunks of `name` as this client last pulled them; -1 when some chunk of it was
  // not pulled (or was forgotten since). A version counts every update of a chunk, assignments included: 0 is a
  // chunk nobody has changed yet.
  int64_t PulledVersion(const std::string& name) const;
  // The oldest clock the chunks of `name` held values of as this client last pulled them (in SYNC, the rounds
  // applied); -1 as for PulledVersion.
  int64_t PulledClock(const std::string& name) const;

  // Forgets which versions were pulled where: the next pulls move every byte (of `names` only: the next pull of
  // them).
  void ForgetPulledValues() { pulled_.clear(); }
  void ForgetPulledValues(const std::vector<std::string>& names);

  // Progress for the scheduler's records (clock and worker id are filled in). The answer says whether the job
  // has stopped (e.g. this evaluation reached the target accuracy).
  [[nodiscard]] absl::StatusOr<tessera::v1::ReportResponse> Report(tessera::v1::ReportRequest report);

  // True when the scheduler says the job is over (a quick question: never waits at the gate). False when it
  // cannot tell (e.g. unreachable, or this worker's next clock is already on its way).
  bool JobStopped();

  // This worker is finished; it no longer holds others back.
  [[nodiscard]] absl::Status Done();
  // This worker stops on `why`: it leaves the job now (the scheduler need not wait for its heartbeats to stop)
  // and the job's records name the error. Best effort: a scheduler that does not answer within 2 s is left.
  // `program_error`: the training program itself raised `why` (DoneRequest.program_error).
  // Nothing is sent when this worker has already left (Done or Fail).
  void Fail(const absl::Status& why, bool program_error = false);

  // Value bytes received by pulls and exchanges so far (unchanged chunks cost none).
  int64_t bytes_pulled() const;


 private:
  // The step protocols (step_protocols.cc) run a step with the client's calls, clock and caches.
  friend class ExchangeStep;
  friend class SyncExchangeStep;
  friend class AsyncExchangeStep;
  friend class SspStep;
  friend class ClippedStep;
  explicit PsClient(const Options& options);

  // Adopts the scheduler's map when it is newer (FAILED_PRECONDITION-free: 0 asks for whatever is newer).
  // `behind` (when given) is set when the scheduler's map is older than at_least_epoch: a server took a new view
  // a moment before the scheduler committed it, and asking again shortly finds it.
  absl::Status RefreshMap(uint64_t at_least_epoch, bool* behind = nullptr);
  // The clock advanced by a gate's answer.
  ClockResult Advanced(const tessera::v1::AdvanceClockResponse& gate);
  void NoteRollback(uint64_t generation, int64_t clock);
  // Runs one RPC per chunk of `names` (pull, push, assign or exchange), at most window_per_server in flight per
  // server; retries the whole set on a stale epoch or UNAVAILABLE.
  Stamp NewStamp() { return {++seq_, clock_}; }
  Stamp CurrentStamp() const { return {seq_, clock_}; }
  // kNorm: `norms` receives each chunk's squared norm.
  absl::Status RunChunks(ChunkOp op, const std::vector<std::string>& names,
                         const std::vector<absl::Span<const float>>& grads, int batch_size,
                         const std::vector<absl::Span<float>>& out, Stamp stamp,
                         std::map<std::pair<std::string, int>, double>* norms = nullptr);
  // The RPCs, one per chunk, of one parameter for `op` (see ChunkCaller::Make), of the chunks within values
  // [begin, end) of it.
  absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> MakeCalls(ChunkOp op, size_t name_index,
                                                                    const std::string& name,
                                                                    absl::Span<const float> grad, int batch_size,
                                                                    absl::Span<float> out, Stamp stamp,
                                                                    size_t begin = 0, size_t end = SIZE_MAX);
  // Takes the results of completed calls: caches pulled versions, counts bytes, and notes the failed ones in
  // `failed`. Returns the names whose calls may be retried; a call that may not be is returned as the error.
  absl::StatusOr<std::vector<size_t>> Absorb(const std::vector<ChunkCall*>& calls, FailedCalls& failed);
  void AddBytesPulled(int64_t bytes);

  const Options options_;
  std::shared_ptr<const Security> security_;
  std::string member_key_;  // from the registration: every push carries it
  std::unique_ptr<SchedulerClient> scheduler_;
  std::unique_ptr<Heartbeater> heartbeater_;
  std::atomic<bool> left_{false};  // Done or Fail was called: a later Fail has nothing to tell
  int worker_id_ = -1;
  uint64_t incarnation_ = 0;
  tessera::v1::JobSpec job_;
  std::shared_ptr<const ShardMapIndex> map_;  // shared with the calls made from it
  std::unique_ptr<ChunkCaller> caller_;       // the connections to the servers
  std::unique_ptr<CallRetries> retries_;      // how every call to the servers is retried
  std::unique_ptr<RowClient> rows_;           // embedding tables' calls
  // What the last pull of each chunk returned, and where its bytes were written (see PulledChunk).
  int64_t OldestPulled(const std::string& name, int64_t PulledChunk::*field) const;

  PulledChunks pulled_;
  mutable absl::Mutex bytes_mu_;
  int64_t bytes_pulled_ ABSL_GUARDED_BY(bytes_mu_) = 0;
  int64_t clock_ = 0;
  // clock_, for a return to a restarted scheduler (SchedulerClient::EnableReturn), which may run on another
  // thread.
  std::atomic<int64_t> shared_clock_{0};
  // The clock from which this worker pushed every round up to clock_ (its start, the last rollback's clock, or
  // where the last late answer sent it: the rounds it skipped are not its own), for the same return. Written
  // before shared_clock_, read after it.
  std::atomic<int64_t> shared_pushed_from_{0};
  BatchSlice slice_;
  int step_samples_ = 0;
  absl::Duration step_busy_;
  uint64_t seq_ = 0;
  uint64_t rollback_generation_ = 0;
  std::optional<int64_t> rollback_;  // not taken yet
  SerialExecutor clock_executor_;  // SYNC steps advance the clock here, alongside the exchange
  SerialExecutor launcher_;        // a step's exchanges start (and write to their sockets) here
};

// One step's exchanges (see PsClient::BeginStep). Called by the training loop's thread only; the replies are
// processed on gRPC's threads. Destroying it cancels what is still in flight. Thread-compatible.
class StepExchange {
 public:
  virtual ~StepExchange() = default;
  // grads[index] is final: its chunks start now (queued behind earlier parameters at a busy server).
  // INVALID_ARGUMENT when the gradient is not finite (nothing of it was sent beyond what SendPart sent). The
  // caller waits for the previous step's values of `index` (WaitValues) before sending it, here or through
  // Finish: both steps' replies write into the same memory, and the later one must land last.
  [[nodiscard]] virtual absl::Status Send(int index) = 0;
  // Before Send(index): the first `values` values of grads[index] are final (backward computes the rest): the
  // chunks that lie wholly within them may start now (INVALID_ARGUMENT, and none of them leaves, when those
  // values are not finite). The default, for steps whose gradients leave in Finish, does nothing.
  [[nodiscard]] virtual absl::Status SendPart(int index, size_t values) { return absl::OkStatus(); }
  // Sends what was not sent yet and returns the clock (in SSP after the gate and the pull). In SYNC and ASYNC
  // the values may still be arriving: WaitValues before reading them. When the clock says stop, whatever is
  // still in flight is cancelled.
  [[nodiscard]] virtual absl::StatusOr<ClockResult> Finish() = 0;
  // Waits until out[index] holds the values after this step (retrying what failed on a stale epoch or an
  // unavailable server). ABORTED when `give_up` (checked at least every 100 ms) returns true or the job stops
  // first.
  [[nodiscard]] virtual absl::Status WaitValues(int index, const std::function<bool()>& give_up = nullptr) {
    return absl::OkStatus();
  }
  // True once the scheduler said the job is over (SYNC; checked without blocking).
  virtual bool stopped() const { return false; }

  // Before the first Send: the learning rate of each parameter's updates in this step, as a factor of the job's
  // (a schedule the worker drives; PushRequest.lr_factor). Empty: the job's own.
  void SetLearningRateFactors(std::vector<float> factors) { lr_factors_ = std::move(factors); }
  // Before the first Send: this worker skips the step (its gradient scaler found inf or NaN). Every push says so
  // and nothing of its gradients is applied (they must still be finite: the caller sends zeros); in SYNC no chunk
  // applies the round, for any worker.
  void SkipStep() { skip_ = true; }
  // After the values were waited for: did the step apply no update? (This worker skipped it, or, in SYNC,
  // another worker did: every round of it closed without an update.)
  virtual bool skipped() const { return skip_; }

 protected:
  // The stamp of the pushes of parameter `index`, from the step's.
  Stamp StampOf(Stamp stamp, size_t index) const {
    stamp.lr_factor = index < lr_factors_.size() ? lr_factors_[index] : -1.0f;
    stamp.skip = skip_;
    return stamp;
  }
  // Gives `other` this step's learning-rate factors and skip (a step that runs its exchanges through another).
  void CopyTermsTo(StepExchange& other) const {
    other.lr_factors_ = lr_factors_;
    other.skip_ = skip_;
  }

 private:
  std::vector<float> lr_factors_;
  bool skip_ = false;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_PS_CLIENT_H_
