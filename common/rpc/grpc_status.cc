#include "common/rpc/grpc_status.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tessera {
namespace {
constexpr char kEpochKey[] = "tessera-current-epoch";
}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context) {
  if (status.ok()) return grpc::Status::OK;
  if (std::optional<uint64_t> epoch = GetCurrentEpoch(status); epoch && context != nullptr) {
    context->AddTrailingMetadata(kEpochKey, absl::StrCat(*epoch));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& context, std::string_view what) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   absl::StrCat(std::string(what), ": ", status.error_message()));
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find(kEpochKey); it != trailers.end()) {
    uint64_t epoch = 0;
    if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &epoch)) {
      SetCurrentEpoch(out, epoch);
    }
  }
  return out;
}

absl::Status FromGrpcCallStatus(const grpc::Status& status, const grpc::ClientContext& context, std::string_view what,
                                bool cancelled_here) {
  if (status.error_code() == grpc::StatusCode::CANCELLED && !cancelled_here) {
    return absl::UnavailableError(
        absl::StrCat(std::string(what), ": the server ended the call (", status.error_message(), "); it may be shutting down"));
  }
  return FromGrpcStatus(status, context, what);
}

}  // namespace tessera
