#include "common/fabric/ucx_worker.h"

#include <poll.h>

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "glog/logging.h"

namespace tessera {

absl::Status FromUcsStatus(ucs_status_t status, std::string_view what) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrCat(std::string(what), ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return absl::DeadlineExceededError(message);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_BUSY:
    case UCS_ERR_SOME_CONNECTS_FAILED:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Start(std::string name, FabricOptions options) {
  std::unique_ptr<UcxWorker> w(new UcxWorker(std::move(name), SpinAfterEvents(options.spin_us), options.tcp));
  // The worker is made, driven and destroyed on the progress thread: UCX checks that a single-threaded worker
  // is used by one thread.
  absl::Notification made;
  absl::Status status;
  UcxWorker* self = w.get();
  w->thread_ = std::thread([self, &made, &status] {
    status = self->Create();
    const bool ok = status.ok();
    made.Notify();  // `status` and `made` are gone after this
    if (ok) self->Loop();
    self->Destroy();
  });
  made.WaitForNotification();
  if (!status.ok()) {
    w->thread_.join();
    return status;
  }
  return w;
}

namespace {

// The value of UCX_TLS in `config` ("all" unless the environment set it).
std::string ConfiguredTransports(const ucp_config_t* config) {
  char* text = nullptr;
  size_t length = 0;
  FILE* out = open_memstream(&text, &length);
  if (out == nullptr) return "all";
  ucp_config_print(config, out, nullptr, UCS_CONFIG_PRINT_CONFIG);
  std::fclose(out);
  std::string tls = "all";
  for (absl::string_view line : absl::StrSplit(absl::string_view(text, length), '\n')) {
    if (absl::ConsumePrefix(&line, "UCX_TLS=")) tls = std::string(line);
  }
  std::free(text);
  return tls;
}

}  // namespace

absl::StatusOr<ucp_config_t*> UcxWorker::ReadConfig() {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return FromUcsStatus(status, "UCX: reading its configuration");
  if (tcp_) return config;
  absl::StatusOr<std::string> tls = TransportsWithoutTcp(ConfiguredTransports(config));
  if (tls.ok()) {
    status = ucp_config_modify(config, "TLS", tls->c_str());
    if (status != UCS_OK) tls = FromUcsStatus(status, absl::StrCat("UCX: setting UCX_TLS=", *tls));
  }
  if (!tls.ok()) {
    ucp_config_release(config);
    return tls.status();
  }
  return config;
}

absl::Status UcxWorker::Create() {
  absl::StatusOr<ucp_config_t*> read = ReadConfig();
  if (!read.ok()) return read.status();
  ucp_config_t* config = *read;
  ucs_status_t status = UCS_OK;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("UCX could not start for ", name_, ": ", ucs_status_string(status)));
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) return FromUcsStatus(status, absl::StrCat("UCX worker of ", name_));
  status = ucp_worker_get_efd(worker_, &event_fd_);
  if (status != UCS_OK) return FromUcsStatus(status, absl::StrCat("UCX event descriptor of ", name_));
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(worker_, &address, &address_length);
  if (status != UCS_OK) return FromUcsStatus(status, absl::StrCat("UCX address of ", name_));
  address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);
  return absl::OkStatus();
}

void UcxWorker::Destroy() {
  ucp_worker_h worker = nullptr;
  {
    absl::MutexLock lock(&mu_);  // no Wake() signals it from here on
    std::swap(worker, worker_);
  }
  if (worker != nullptr) ucp_worker_destroy(worker);
  if (!requests_.empty()) {
    VLOG(1) << name_ << ": " << requests_.size() << " requests UCX never completed (to peers that died), freed";
  }
  requests_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
}

UcxRequestState* UcxWorker::Hold(std::string header, std::shared_ptr<const void> keep,
                                 std::function<void(const absl::Status&)> done) {
  auto state = std::make_unique<UcxRequestState>(
      UcxRequestState{this, std::move(header), std::move(keep), std::move(done)});
  UcxRequestState* held = state.get();
  requests_.emplace(held, std::move(state));
  return held;
}

void UcxWorker::Complete(UcxRequestState* state, ucs_status_t status, const char* what) {
  auto it = requests_.find(state);
  if (it == requests_.end()) return;
  std::unique_ptr<UcxRequestState> owned = std::move(it->second);
  requests_.erase(it);
  if (owned->done) owned->done(FromUcsStatus(status, what));
}

UcxWorker::~UcxWorker() { Stop(); }

void UcxWorker::Stop() {
  if (!thread_.joinable() || OnProgressThread()) return;
  stopping_ = true;
  Wake();
  thread_.join();
}

void UcxWorker::Post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    posted_.push_back(std::move(fn));
  }
  Wake();
}

void UcxWorker::Wake() {
  absl::MutexLock lock(&mu_);
  if (worker_ != nullptr) ucp_worker_signal(worker_);  // thread-safe: wakes a thread asleep on the event descriptor
}

void UcxWorker::Run(std::function<void()> fn) {
  absl::Notification ran;
  Post([&] {
    fn();
    ran.Notify();
  });
  ran.WaitForNotification();
}

void UcxWorker::CloseLater(ucp_ep_h ep) { closing_.emplace_back(absl::Now() + absl::Seconds(1), ep); }

void UcxWorker::SetTick(absl::Duration every, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  tick_every_ = every;
  tick_ = std::move(fn);
}

void UcxWorker::SetOnStop(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  on_stop_ = std::move(fn);
}

void UcxWorker::SetDrained(std::function<bool()> fn) {
  absl::MutexLock lock(&mu_);
  drained_ = std::move(fn);
}

void UcxWorker::Drain() {
  std::function<bool()> drained;
  {
    absl::MutexLock lock(&mu_);
    drained = drained_;
  }
  if (!drained) return;
  const absl::Time until = absl::Now() + kDrainLimit;
  while (!drained() && absl::Now() < until) {
    const bool progressed = ucp_worker_progress(worker_) != 0;
    if (!RunPosted() && !progressed) absl::SleepFor(absl::Microseconds(100));
  }
  if (!drained()) LOG(WARNING) << name_ << ": sends still in flight after " << kDrainLimit << "; closing anyway";
}

absl::Status UcxWorker::SetHandler(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                     UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  param.id = id;
  param.cb = cb;
  param.arg = arg;
  param.flags = UCP_AM_FLAG_WHOLE_MSG;
  return FromUcsStatus(ucp_worker_set_am_recv_handler(worker_, &param),
                       absl::StrCat("UCX handler ", id, " of ", name_));
}

bool UcxWorker::RunPosted() {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    run.swap(posted_);
  }
  for (auto& fn : run) fn();
  return !run.empty();
}

namespace {

// The cores this process may use: the CPUs of its affinity mask, fewer when a cgroup (v2) quota allows less
// (a container limited to 2 CPUs on a large host has 2).
int UsableCores() {
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                             : static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream max_file("/sys/fs/cgroup/cpu.max");
  std::string quota;
  int64_t period = 0;
  if (max_file >> quota >> period && quota != "max" && period > 0) {
    int64_t q = 0;
    if (absl::SimpleAtoi(quota, &q) && q > 0) cores = std::min<int>(cores, static_cast<int>((q + period - 1) / period));
  }
  return std::max(cores, 1);
}

}  // namespace

absl::Duration SpinAfterEvents(int spin_us) {
  if (spin_us >= 0) return absl::Microseconds(spin_us);
  return UsableCores() > 4 ? absl::Microseconds(50) : absl::ZeroDuration();
}

absl::Status CheckSpinOption(int spin_us) {
  if (spin_us >= -1 && spin_us <= 1000000) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--fabric_spin_us: expected -1 (automatic) or 0 to 1000000 microseconds, got ", spin_us));
}

void UcxWorker::Loop() {
  // How long to keep polling after the last event before sleeping: a reply that follows a request within this
  // is taken without a wakeup's system calls.
  const absl::Duration kSpin = spin_;
  absl::Time next_tick = absl::Now();
  absl::Time last_event = absl::Now();
  auto tick = [&] {
    absl::Time now = absl::Now();
    if (now < next_tick) return;
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (it->first > now) {
        ++it;
        continue;
      }
      CloseEndpoint(it->second);
      it = closing_.erase(it);
    }
    std::function<void()> fn;
    absl::Duration every;
    {
      absl::MutexLock lock(&mu_);
      fn = tick_;
      every = tick_every_;
    }
    next_tick = every == absl::InfiniteDuration() ? now + absl::Milliseconds(100) : now + every;
    if (fn) fn();
  };
  while (!stopping_) {
    bool busy = false;
    while (ucp_worker_progress(worker_) != 0) busy = true;
    if (RunPosted()) busy = true;
    tick();
    if (busy) {
      last_event = absl::Now();
      continue;
    }
    if (absl::Now() - last_event < kSpin) continue;
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    if (armed != UCS_OK) LOG(ERROR) << FromUcsStatus(armed, absl::StrCat("UCX worker of ", name_, ": arming"));
    pollfd fd{event_fd_, POLLIN, 0};
    const int timeout_ms =
        static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(next_tick - absl::Now()) + 1));
    poll(&fd, 1, armed == UCS_OK ? timeout_ms : 1);
    last_event = absl::Now();
  }
  Drain();
  // Closing: what the owner closes completes while the thread still polls.
  std::function<void()> on_stop;
  {
    absl::MutexLock lock(&mu_);
    on_stop = std::move(on_stop_);
  }
  RunPosted();
  if (on_stop) on_stop();
  RunPosted();
  for (auto& [when, ep] : closing_) CloseEndpoint(ep);
  closing_.clear();
  // Until 20 ms pass without an event (the closes completed), at most half a second.
  const absl::Time until = absl::Now() + absl::Milliseconds(500);
  absl::Time quiet_since = absl::Now();
  while (absl::Now() < until && absl::Now() - quiet_since < absl::Milliseconds(20)) {
    const bool progressed = ucp_worker_progress(worker_) != 0;
    if (RunPosted() || progressed) {
      quiet_since = absl::Now();
    } else {
      absl::SleepFor(absl::Microseconds(200));
    }
  }
}

void CloseEndpoint(ucp_ep_h ep) {
  ucp_request_param_t close{};
  close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t closing = ucp_ep_close_nbx(ep, &close);
  // A pending close completes from progress; nothing waits for it but the worker's own teardown.
  if (closing != nullptr && !UCS_PTR_IS_ERR(closing)) ucp_request_free(closing);
}

std::string EncodeFabricAddress(const std::string& address) { return absl::Base64Escape(address); }

absl::StatusOr<std::string> DecodeFabricAddress(std::string_view text) {
  std::string address;
  if (text.empty() || !absl::Base64Unescape(absl::string_view(text.data(), text.size()), &address)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a fabric address must be a UCX worker address in base64; got ", text.size(), " characters"));
  }
  return address;
}

absl::StatusOr<std::string> TransportsWithoutTcp(std::string_view tls) {
  if (tls.empty() || tls == "all") return std::string("^tcp");
  const bool excluding = tls.front() == '^';
  std::vector<std::string> kept;
  bool had_tcp = false;
  for (absl::string_view name : absl::StrSplit(absl::string_view(tls.data() + (excluding ? 1 : 0),
                                                                 tls.size() - (excluding ? 1 : 0)),
                                               ',', absl::SkipEmpty())) {
    if (name == "tcp") {
      had_tcp = true;
      if (!excluding) continue;
    }
    kept.emplace_back(name);
  }
  if (excluding) {
    if (!had_tcp) kept.push_back("tcp");
    return absl::StrCat("^", absl::StrJoin(kept, ","));
  }
  if (kept.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX_TLS=", std::string(tls), " leaves UCX only TCP, which this process may not use: give it --fabric_tcp "
        "(on a fabric no untrusted process reaches) or name other transports"));
  }
  return absl::StrJoin(kept, ",");
}

}  // namespace tessera
