#include "common/scheduler_client.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc.h"
#include "common/wire_limits.h"

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
      policy, absl::StrCat("no scheduler answered at ", address_), [&]() -> absl::Status {
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
  }
  return response;
}

absl::StatusOr<tessera::v1::HeartbeatResponse> SchedulerClient::Heartbeat(
    const tessera::v1::HeartbeatRequest& request) {
  grpc::ClientContext context;
  Prepare(context, kControlTimeout);
  tessera::v1::HeartbeatResponse response;
  absl::Status status = FromGrpcStatus(stub_->Heartbeat(&context, request, &response), context,
                                       absl::StrCat("Heartbeat to scheduler ", address_));
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
    grpc::ClientContext context;
    Prepare(context, kControlTimeout);
    return FromGrpcStatus(stub_->Declare(&context, request, &response), context,
                          absl::StrCat("Declare with scheduler ", address_));
  });
  if (!status.ok()) return status;
  return std::move(*response.mutable_shard_map());
}

absl::StatusOr<tessera::v1::ShardMap> SchedulerClient::GetShardMap() {
  grpc::ClientContext context;
  Prepare(context, kControlTimeout);
  tessera::v1::ShardMap map;
  absl::Status status = FromGrpcStatus(stub_->GetShardMap(&context, {}, &map), context,
                                       absl::StrCat("GetShardMap from scheduler ", address_));
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
  grpc::ClientContext context;
  // The scheduler answers at wait_timeout with the names of the stragglers; the call's own deadline is later.
  Prepare(context, wait_timeout + absl::Seconds(5));
  tessera::v1::AdvanceClockResponse response;
  absl::Status status = FromGrpcStatus(stub_->AdvanceClock(&context, request, &response), context,
                                       absl::StrCat("AdvanceClock of worker ", worker_id, " to ", clock,
                                                    " at scheduler ", address_));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<tessera::v1::ReportResponse> SchedulerClient::Report(const tessera::v1::ReportRequest& request) {
  grpc::ClientContext context;
  Prepare(context, kControlTimeout);
  tessera::v1::ReportResponse response;
  absl::Status status = FromGrpcStatus(stub_->Report(&context, request, &response), context,
                                       absl::StrCat("Report to scheduler ", address_));
  if (!status.ok()) return status;
  return response;
}

namespace {
// An error's text, cut at a character boundary within the limit the scheduler accepts.
std::string ErrorText(const absl::Status& error) {
  std::string text = error.ToString();
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
  grpc::ClientContext context;
  Prepare(context, kFarewellTimeout);
  tessera::v1::ReportServerResponse response;
  return FromGrpcStatus(stub_->ReportServer(&context, request, &response), context,
                        absl::StrCat("ReportServer to scheduler ", address_));
}

absl::Status SchedulerClient::Done(int worker_id, int64_t clock, const absl::Status& failure) {
  tessera::v1::DoneRequest request;
  request.set_worker_id(worker_id);
  request.set_clock(clock);
  if (!failure.ok()) request.set_failure(ErrorText(failure));
  grpc::ClientContext context;
  // A failing worker is on its way out: it does not wait long for a scheduler that does not answer.
  Prepare(context, failure.ok() ? kControlTimeout : kFarewellTimeout);
  tessera::v1::DoneResponse response;
  return FromGrpcStatus(stub_->Done(&context, request, &response), context, absl::StrCat("Done to scheduler ", address_));
}

}  // namespace tessera
