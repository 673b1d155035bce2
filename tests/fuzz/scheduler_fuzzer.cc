// Fuzzes the scheduler's request handling: a JobCoordinator (with fake servers that accept everything) takes a
// sequence of requests from the wire (tests/fuzz/fuzz_input.h): Register, Heartbeat, Declare, GetShardMap,
// AdvanceClock, Report, Done, member-key checks and failure detection passes. Nothing may crash or hang.
#include "common/model/wire_limits.h"
#include "scheduler/job_coordinator.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_jobs.h"
#include "tests/testing/fake_server_control.h"

namespace tessera::fuzz {
namespace {

enum Operation : uint8_t {
  kRegister, kHeartbeat, kDeclare, kGetShardMap, kAdvanceClock, kReport, kDone, kCheckKey, kLiveness, kOperations
};

template <typename T>
bool Parse(std::string_view bytes, T* message) {
  return message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

void Run(const uint8_t* data, size_t size) {
  if (size == 0) return;
  testing::FakeServerControl servers;
  absl::StatusOr<std::unique_ptr<JobCoordinator>> created = JobCoordinator::Create(
      FuzzJob(data[0]), /*run_dir=*/"", absl::Milliseconds(100), absl::Seconds(10), &servers, [](const JobOutcome&) {});
  if (!created.ok()) __builtin_trap();
  JobCoordinator& coordinator = **created;
  const absl::Time start = absl::Now();
  RequestReader reader(data + 1, size - 1);
  uint8_t op = 0;
  std::string_view bytes;
  while (reader.Next(&op, &bytes)) {
    switch (op % kOperations) {
      case kRegister: {
        tessera::v1::RegisterRequest r;
        if (Parse(bytes, &r) && CheckKnownEnums(r).ok()) coordinator.Register(r, [](auto) {});
        break;
      }
      case kHeartbeat: {
        tessera::v1::HeartbeatRequest r;
        if (Parse(bytes, &r) && CheckKnownEnums(r).ok()) (void)coordinator.Heartbeat(r);
        break;
      }
      case kDeclare: {
        tessera::v1::DeclareRequest r;
        if (Parse(bytes, &r) && CheckKnownEnums(r).ok()) coordinator.Declare(r, [](auto) {});
        break;
      }
      case kGetShardMap:
        (void)coordinator.GetShardMap();
        break;
      case kAdvanceClock: {
        tessera::v1::AdvanceClockRequest r;
        // The waits end with the input (the coordinator's destruction answers them).
        if (Parse(bytes, &r)) coordinator.AdvanceClock(r, [](auto) {});
        break;
      }
      case kReport: {
        tessera::v1::ReportRequest r;
        if (Parse(bytes, &r)) (void)coordinator.Report(r);
        break;
      }
      case kDone: {
        tessera::v1::DoneRequest r;
        if (Parse(bytes, &r)) (void)coordinator.Done(r);
        break;
      }
      case kCheckKey: {
        tessera::v1::HeartbeatRequest r;  // role and id; the key is the rest of the bytes
        if (Parse(bytes, &r)) (void)coordinator.view().CheckMemberKey(r.role(), r.id(), absl::string_view(bytes.data(), bytes.size()));
        break;
      }
      case kLiveness:
        coordinator.CheckLiveness(start + absl::Seconds(bytes.empty() ? 0 : static_cast<uint8_t>(bytes[0])));
        break;
    }
  }
  (void)coordinator.StatusJson();
  (void)coordinator.MetricsText();
  coordinator.Abort("end of input");
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::Run(data, size);
  return 0;
}
