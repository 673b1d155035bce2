#include "common/rpc/scheduler_client.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "glog/logging.h"

namespace tessera {
namespace {
constexpr absl::Duration kControlTimeout = absl::Seconds(10);
constexpr absl::Duration kFarewellTimeout = absl::Seconds(2);
}  // namespace

SchedulerClient::SchedulerClient(std::string address, std::shared_ptr<const Security> security)
    : address_(std::move(address)),
      security_(std::move(security)),
      channel_(MakeChannel(address_, *security_)),
      stub_(tessera::v1::Scheduler::NewStub(channel_)) {}

void SchedulerClient::Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
  SetTimeout(context, timeout);
  security_->Authorize(context);
  absl::MutexLock lock(&mu_);
  if (!member_key_.empty()) context.AddMetadata(kMemberKeyHeader, member_key_);
}

std::string SchedulerClient::member_key() const {
  absl::MutexLock lock(&mu_);
  return member_key_;
}

absl::StatusOr<tessera::v1::RegisterResponse> SchedulerClient::Register(tessera::v1::RegisterRequest request,
                                                                        absl::Duration give_up_after) {
  if (request.hostname().empty()) {
    char hostname[256] = {0};
    gethostname(hostname, sizeof(hostname) - 1);
    request.set_hostname(hostname);
  }
  tessera::v1::RegisterResponse response;
  RetryPolicy policy;
  policy.give_up_after = give_up_after;
  policy.channel = channel_;
  policy.waiting_line = absl::StrCat("waiting for the scheduler at ", address_, " (up to ",
                                     absl::FormatDuration(give_up_after), ", --connect_timeout_s)");
  absl::Status status = RetryWhileUnavailable(
      policy, absl::StrCat("no scheduler answered at ", address_, " (it has not started, or its job ended and it exited)"),
      [&]() -> absl::Status {
        grpc::ClientContext context;
        // Registration waits behind whatever the scheduler is doing (a checkpoint, a recovery: each bounded by
        // its heartbeat timeout), so it gets longer than that; an absent scheduler fails at once anyway.
        Prepare(context, absl::Seconds(20));
        return FromGrpcStatus(stub_->Register(&context, request, &response), context,
                              absl::StrCat("Register with scheduler ", address_));
      });
  if (!status.ok()) return status;
  {
    absl::MutexLock lock(&mu_);
    member_key_ = response.member_key();
    registration_ = request;
    registered_ = response;
    registered_.clear_job();
    registered_.mutable_job()->set_name(response.job().name());
    last_heard_ = absl::Now();
  }
  return response;
}

void SchedulerClient::EnableReturn(std::function<void(tessera::v1::MemberReturn&)> state) {
  absl::MutexLock lock(&mu_);
  return_state_ = std::move(state);
}

void SchedulerClient::Heard() {
  absl::MutexLock lock(&mu_);
  last_heard_ = absl::Now();
}

absl::Status SchedulerClient::MemberCall(const std::function<absl::Status()>& attempt, bool retry_unavailable) {
  Backoff backoff(absl::Milliseconds(50), absl::Seconds(1));
  bool came_back = false;
  for (;;) {
    uint64_t returns;
    absl::Time give_up_at;
    bool can_return;
    {
      absl::MutexLock lock(&mu_);
      returns = returns_;
      can_return = return_state_ != nullptr;
      give_up_at = last_heard_ + absl::Milliseconds(registered_.heartbeat_timeout_ms());
    }
    absl::Status status = attempt();
    if (status.code() != absl::StatusCode::kUnavailable) Heard();
    if (!can_return) return status;
    if (status.code() == absl::StatusCode::kNotFound && !came_back) {
      // A scheduler that does not know this member: it restarted. Come back, then try once more.
      TESSERA_RETURN_IF_ERROR(ComeBack(returns));
      came_back = true;
      continue;
    }
    if (status.code() != absl::StatusCode::kUnavailable || !retry_unavailable || absl::Now() >= give_up_at) {
      return status;
    }
    backoff.Wait(give_up_at, channel_.get());
  }
}

absl::Status SchedulerClient::ComeBack(uint64_t seen_returns) {
  absl::MutexLock once(&return_mu_);
  tessera::v1::RegisterRequest request;
  absl::Duration give_up_after;
  std::function<void(tessera::v1::MemberReturn&)> state;
  {
    absl::MutexLock lock(&mu_);
    if (returns_ != seen_returns) return absl::OkStatus();  // another call came back meanwhile
    request = registration_;
    request.set_requested_id(registered_.id());
    tessera::v1::MemberReturn* back = request.mutable_rejoin();
    back->set_job(registered_.job().name());
    back->set_incarnation(registered_.incarnation());
    give_up_after = absl::Milliseconds(registered_.heartbeat_timeout_ms());
    state = return_state_;
  }
  state(*request.mutable_rejoin());  // without mu_: it takes the member's own locks
  LOG(WARNING) << "the scheduler at " << address_ << " does not know this member (it restarted): coming back";
  tessera::v1::RegisterResponse response;
  RetryPolicy policy;
  policy.give_up_after = give_up_after;
  policy.channel = channel_;
  absl::Status status = RetryWhileUnavailable(policy, absl::StrCat("coming back to scheduler ", address_), [&] {
    grpc::ClientContext context;
    Prepare(context, absl::Seconds(20));
    return FromGrpcStatus(stub_->Register(&context, request, &response), context,
                          absl::StrCat("Register (coming back) with scheduler ", address_));
  });
  if (!status.ok()) {
    LOG(ERROR) << "could not come back to the restarted scheduler: " << status;
    return status;
  }
  LOG(INFO) << "came back to the restarted scheduler at " << address_;
  absl::MutexLock lock(&mu_);
  ++returns_;
  last_heard_ = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<tessera::v1::HeartbeatResponse> SchedulerClient::Heartbeat(
    const tessera::v1::HeartbeatRequest& request) {
  tessera::v1::HeartbeatResponse response;
  absl::Status status = MemberCall(
      [&] {
        grpc::ClientContext context;
        Prepare(context, kControlTimeout);
        return FromGrpcStatus(stub_->Heartbeat(&context, request, &response), context,
                              absl::StrCat("Heartbeat to scheduler ", address_));
      },
      /*retry_unavailable=*/false);
  if (!status.ok()) return status;
  return response;
}

std::unique_ptr<Heartbeater> SchedulerClient::StartHeartbeats(tessera::v1::Role role, int id, uint64_t incarnation,
                                                              absl::Duration interval,
                                                              std::function<void()> on_job_finished,
                                                              std::function<void(const absl::Status&)> on_lost,
                                                              absl::Duration give_up_after) {
  auto heartbeater = std::make_unique<Heartbeater>(
      std::max(interval, absl::Milliseconds(10)),
      [this, role, id, incarnation, on_job_finished = std::move(on_job_finished)]() -> absl::Status {
        tessera::v1::HeartbeatRequest beat;
        beat.set_role(role);
        beat.set_id(id);
        beat.set_incarnation(incarnation);
        absl::StatusOr<tessera::v1::HeartbeatResponse> response = Heartbeat(beat);
        if (!response.ok()) return response.status();
        if (response->stopping() || response->job_finished()) stopping_ = true;
        if (response->job_finished()) on_job_finished();
        return absl::OkStatus();
      },
      [this, on_lost = std::move(on_lost)](const absl::Status& why) {
        stopping_ = true;  // no scheduler, no job: whatever waits on it may stop waiting
        if (on_lost) on_lost(why);
      },
      give_up_after);
  heartbeater->Start();
  return heartbeater;
}

absl::StatusOr<tessera::v1::ShardMap> SchedulerClient::Declare(const tessera::v1::DeclareRequest& request,
                                                               absl::Duration timeout) {
  tessera::v1::DeclareResponse response;
  RetryPolicy policy;
  policy.give_up_after = timeout + absl::Seconds(6);
  policy.channel = channel_;
  absl::Status status = RetryWhileUnavailable(policy, "Declare", [&]() -> absl::Status {
    return MemberCall(
        [&] {
          grpc::ClientContext context;
          Prepare(context, kControlTimeout);
          return FromGrpcStatus(stub_->Declare(&context, request, &response), context,
                                absl::StrCat("Declare with scheduler ", address_));
        },
        /*retry_unavailable=*/false);
  });
  if (!status.ok()) return status;
  return std::move(*response.mutable_shard_map());
}

absl::StatusOr<tessera::v1::ShardMap> SchedulerClient::GetShardMap() {
  tessera::v1::ShardMap map;
  absl::Status status = MemberCall(
      [&] {
        grpc::ClientContext context;
        Prepare(context, kControlTimeout);
        return FromGrpcStatus(stub_->GetShardMap(&context, {}, &map), context,
                              absl::StrCat("GetShardMap from scheduler ", address_));
      },
      /*retry_unavailable=*/true);
  if (!status.ok()) return status;
  return map;
}

absl::StatusOr<tessera::v1::AdvanceClockResponse> SchedulerClient::AdvanceClock(int worker_id, int64_t clock,
                                                                                absl::Duration wait_timeout,
                                                                                int step_samples,
                                                                                double step_busy_seconds) {
  tessera::v1::AdvanceClockRequest request;
  request.set_worker_id(worker_id);
  request.set_clock(clock);
  request.set_step_samples(step_samples);
  request.set_step_busy_seconds(step_busy_seconds);
  request.set_wait_timeout_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(wait_timeout)));
  tessera::v1::AdvanceClockResponse response;
  absl::Status status = MemberCall(
      [&] {
        grpc::ClientContext context;
        // The scheduler answers at wait_timeout with the names of the stragglers; the call's own deadline is later.
        Prepare(context, wait_timeout + absl::Seconds(5));
        return FromGrpcStatus(stub_->AdvanceClock(&context, request, &response), context,
                              absl::StrCat("AdvanceClock of worker ", worker_id, " to ", clock, " at scheduler ",
                                           address_));
      },
      /*retry_unavailable=*/true);
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<tessera::v1::ReportResponse> SchedulerClient::Report(const tessera::v1::ReportRequest& request) {
  tessera::v1::ReportResponse response;
  absl::Status status = MemberCall(
      [&] {
        grpc::ClientContext context;
        Prepare(context, kControlTimeout);
        return FromGrpcStatus(stub_->Report(&context, request, &response), context,
                              absl::StrCat("Report to scheduler ", address_));
      },
      /*retry_unavailable=*/true);
  if (!status.ok()) return status;
  return response;
}

namespace {
// An error's text ("CODE: message", or the message alone without `with_code`), cut at a character boundary
// within the limit the scheduler accepts.
std::string ErrorText(const absl::Status& error, bool with_code = true) {
  std::string text = with_code ? error.ToString() : std::string(error.message());
  if (text.size() > kMaxErrorBytes) {
    size_t cut = kMaxErrorBytes;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
  }
  return text;
}
}  // namespace

absl::Status SchedulerClient::ReportServer(tessera::v1::Role role, int member_id, int server_id,
                                           uint64_t incarnation, const absl::Status& error) {
  tessera::v1::ReportServerRequest request;
  request.set_role(role);
  request.set_member_id(member_id);
  request.set_server_id(server_id);
  request.set_incarnation(incarnation);
  request.set_error(ErrorText(error));
  tessera::v1::ReportServerResponse response;
  return MemberCall(
      [&] {
        grpc::ClientContext context;
        Prepare(context, kFarewellTimeout);
        return FromGrpcStatus(stub_->ReportServer(&context, request, &response), context,
                              absl::StrCat("ReportServer to scheduler ", address_));
      },
      /*retry_unavailable=*/false);
}

absl::Status SchedulerClient::Done(int worker_id, int64_t clock, const absl::Status& failure,
                                   bool program_error) {
  tessera::v1::DoneRequest request;
  request.set_worker_id(worker_id);
  request.set_clock(clock);
  if (!failure.ok()) {
    // A program's error is its own text ("ValueError: ..."), not a status.
    request.set_failure(ErrorText(failure, /*with_code=*/!program_error));
    request.set_program_error(program_error);
  }
  tessera::v1::DoneResponse response;
  return MemberCall(
      [&] {
        grpc::ClientContext context;
        // A failing worker is on its way out: it does not wait long for a scheduler that does not answer.
        Prepare(context, failure.ok() ? kControlTimeout : kFarewellTimeout);
        return FromGrpcStatus(stub_->Done(&context, request, &response), context,
                              absl::StrCat("Done to scheduler ", address_));
      },
      /*retry_unavailable=*/failure.ok());
}

}  // namespace tessera
