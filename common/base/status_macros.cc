#include "common/base/status_macros.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {
constexpr char kEpochPayload[] = "tessera.v1/current_epoch";
}  // namespace

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(std::string(context), ": ", std::string(status.message())));
  status.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

void SetCurrentEpoch(absl::Status& status, uint64_t epoch) {
  status.SetPayload(kEpochPayload, absl::Cord(absl::StrCat(epoch)));
}

std::optional<uint64_t> GetCurrentEpoch(const absl::Status& status) {
  auto payload = status.GetPayload(kEpochPayload);
  if (!payload) return std::nullopt;
  uint64_t epoch = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &epoch)) return std::nullopt;
  return epoch;
}

}  // namespace tessera
