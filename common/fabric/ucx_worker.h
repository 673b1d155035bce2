// One UCX context and worker, driven by a progress thread of its own: the base of the fabric transport's client
// (worker/client/ucx_chunk_transport.h) and server (server/fabric_service.h).
//
// Every UCX call of the worker runs on its progress thread (the worker is single-threaded, so UCX takes no
// locks); other threads hand work to it with Post, which wakes it. The thread polls while there is traffic and
// sleeps on the worker's event file descriptor when there is none, so an idle process costs no CPU. After the
// last event it keeps polling for SpinAfterEvents() (a reply that follows within it costs no wakeup), but only
// where cores are spare. Where the process may use 4 cores or fewer (its affinity mask and cgroup quota), a
// polling thread takes a core from the training or the updates, which costs more than the wakeups (on 2 cores,
// 1 server + 1 worker SYNC steps take 2.13 ms without polling against 2.52 ms with 50 us of it). The daemons' --fabric_spin_us overrides it.
//
//   absl::StatusOr<std::unique_ptr<UcxWorker>> w = UcxWorker::Start("server 0");
//   (*w)->Post([&] { ucp_am_send_nbx((*w)->worker(), ...); });   // on the progress thread
//   (*w)->SetTick(absl::Milliseconds(20), [&] { ... });              // deadlines, on the same thread
#ifndef TESSERA_COMMON_FABRIC_UCX_WORKER_H_
#define TESSERA_COMMON_FABRIC_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

// A UCX status as an absl status: UNAVAILABLE for a peer or connection failure (what gRPC's UNAVAILABLE means
// to the callers' recovery paths), DEADLINE_EXCEEDED for a timeout, CANCELLED, INTERNAL otherwise.
absl::Status FromUcsStatus(ucs_status_t status, std::string_view what);

// How long a progress thread polls after its last event before sleeping: `spin_us` microseconds when it is at
// least 0, else (automatic) 50 us where the process may use more than 4 cores (its CPU affinity and cgroup
// quota) and none otherwise.
absl::Duration SpinAfterEvents(int spin_us);
// INVALID_ARGUMENT naming --fabric_spin_us unless `spin_us` is -1 or 0 .. 1000000.
[[nodiscard]] absl::Status CheckSpinOption(int spin_us);

// How a process's UCX runs.
struct FabricOptions {
  int spin_us = -1;  // see SpinAfterEvents
  // Whether UCX may use TCP. UCX's TCP transport listens on every interface it uses and hands the bytes of any
  // peer that connects to UCX's own protocol code before a Tessera check can run (with Debian's libucx, whose
  // assertions are on, a malformed connection request aborts the process), and it holds a descriptor for every
  // connection a peer keeps open. Off, UCX uses shared memory, cross-memory attach and RDMA where the host has
  // it, and listens on no TCP port at all. On is for fabrics no untrusted process can reach.
  bool tcp = false;
};

// The UCX_TLS value (`tls`, as UCX read it from the environment; "all" by default) with TCP taken out: "all"
// becomes "^tcp", an exclusion list gains tcp, an explicit list loses it. INVALID_ARGUMENT when nothing is
// left (UCX_TLS=tcp alone).
[[nodiscard]] absl::StatusOr<std::string> TransportsWithoutTcp(std::string_view tls);

class UcxWorker;

// What a request holds until UCX completes it: its header, what keeps its data alive, its callback.
struct UcxRequestState {
  UcxWorker* owner;
  std::string header;
  std::shared_ptr<const void> keep;
  std::function<void(const absl::Status&)> done;
};

// Thread-safe: Post and SetTick from any thread; worker() only on the progress thread.
class UcxWorker {
 public:
  // Creates the context and worker (active messages and wakeup) and starts the progress thread. `name` names
  // the thread's errors. UNAVAILABLE when UCX cannot start (no transport usable here); INVALID_ARGUMENT when
  // UCX_TLS allows only TCP and `options` do not.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxWorker>> Start(std::string name,
                                                                      FabricOptions options = {});
  // Stop(), then frees.
  ~UcxWorker();
  // Runs `on_stop` (closing endpoints and listeners) on the progress thread, then stops it and frees the UCX
  // worker. The owner calls it first in its destructor, so that on_stop still finds it whole. Idempotent.
  void Stop();

  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h worker() const { return worker_; }
  const std::string& name() const { return name_; }
  // The worker's address (ucp_worker_get_address), which a peer connects to: it names the worker's transports
  // and their endpoints. Empty when it could not be read. Constant after Start.
  const std::string& address() const { return address_; }

  // Runs `fn` on the progress thread, soon; in the order posted.
  void Post(std::function<void()> fn);
  // Runs `fn` on the progress thread and waits for it (never from the progress thread).
  void Run(std::function<void()> fn);
  // `fn` runs on the progress thread at least every `every` (deadline checks).
  void SetTick(absl::Duration every, std::function<void()> fn);
  // Runs once on the progress thread when the worker is destroyed, before it stops polling: close endpoints
  // here (their requests complete while the thread still polls).
  void SetOnStop(std::function<void()> fn);
  // At Stop, before on_stop: the thread keeps polling until `fn` says that nothing is in flight, for at most
  // kDrainLimit. A forced close completes a rendezvous send at once, and the peer's acknowledgement of it that
  // arrives afterwards aborts UCX 1.13 (ucp_rndv_ats_handler's assertion): sends finish before endpoints close.
  void SetDrained(std::function<bool()> fn);
  static constexpr absl::Duration kDrainLimit = absl::Seconds(2);
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Progress thread: closes `ep` (force) a second from now, or when the worker stops. A failed peer's messages
  // already received (an acknowledgement in a shared-memory queue, say) are handled first: UCX 1.13 aborts when
  // one arrives for a request that closing the endpoint completed.
  void CloseLater(ucp_ep_h ep);

  // Registers `cb` for active messages of `id` (whole messages; see ucp_am_handler_param_t). Progress thread.
  [[nodiscard]] absl::Status SetHandler(unsigned id, ucp_am_recv_callback_t cb, void* arg);

  // Progress thread: a request's state (the user_data of its UCX callback), held by the worker until Complete.
  // UCX does not complete every request: a rendezvous send to a peer that died stays pending through the forced
  // close of its endpoint (peer-failure handling is off, see UcxChunkTransport::EndpointFor), and destroying the
  // UCX worker frees it without a callback. What is still held then is freed with the worker, its callback not
  // run: the owner is tearing down.
  UcxRequestState* Hold(std::string header, std::shared_ptr<const void> keep,
                        std::function<void(const absl::Status&)> done);
  // Progress thread: runs the state's callback with `status` (prefixed with `what`) and frees the state.
  void Complete(UcxRequestState* state, ucs_status_t status, const char* what);

 private:
  UcxWorker(std::string name, absl::Duration spin, bool tcp) : name_(std::move(name)), spin_(spin), tcp_(tcp) {}
  // On the progress thread: make and free the context and worker.
  absl::Status Create();
  // UCX's configuration from the environment, with TCP taken out unless tcp_. Caller releases it.
  absl::StatusOr<ucp_config_t*> ReadConfig();
  void Destroy();
  void Loop();
  // Wakes the progress thread (any thread).
  void Wake();
  // Runs what was posted; true when anything ran.
  bool RunPosted();
  // At stop: polls until drained_ says so, at most kDrainLimit.
  void Drain();

  const std::string name_;
  const absl::Duration spin_;  // polling after the last event
  const bool tcp_;
  std::string address_;  // written once by Create, before Start returns
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;  // written by the progress thread only, under mu_
  int event_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  std::vector<std::function<void()>> posted_ ABSL_GUARDED_BY(mu_);
  absl::Duration tick_every_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  std::function<void()> tick_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_stop_ ABSL_GUARDED_BY(mu_);
  std::function<bool()> drained_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<absl::Time, ucp_ep_h>> closing_;  // progress thread only
  absl::flat_hash_map<UcxRequestState*, std::unique_ptr<UcxRequestState>> requests_;  // progress thread only
};

// Closes `ep` at once (force: in-flight requests fail), from the progress thread but never from inside one of
// UCX's callbacks for it.
void CloseEndpoint(ucp_ep_h ep);

// A worker address as it travels in the cluster view (ServerInfo.fabric_address): base64, and back.
// INVALID_ARGUMENT for text that is not base64.
std::string EncodeFabricAddress(const std::string& address);
[[nodiscard]] absl::StatusOr<std::string> DecodeFabricAddress(std::string_view text);

}  // namespace tessera

#endif  // TESSERA_COMMON_FABRIC_UCX_WORKER_H_
