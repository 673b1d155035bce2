// Propagation macros for absl::Status and absl::StatusOr, which the installed Abseil lacks.
//
//   TESSERA_RETURN_IF_ERROR(store.Push(req));            // returns the status when it is not OK
//   TESSERA_ASSIGN_OR_RETURN(auto spec, LoadJobSpec(path));  // unwraps a StatusOr or returns its status
#ifndef TESSERA_COMMON_BASE_STATUS_MACROS_H_
#define TESSERA_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include <cstdint>
#include <optional>
#include <string_view>

#define TESSERA_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status tessera_status_ = (expr);           \
    if (!tessera_status_.ok()) return tessera_status_; \
  } while (0)

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(tessera_statusor_, __LINE__), lhs, expr)

#define TESSERA_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                   \
  if (!var.ok()) return std::move(var).status();       \
  lhs = std::move(var).value()

namespace tessera {

// Prefixes a status message with context, keeping its code and payloads.
absl::Status Annotate(const absl::Status& status, std::string_view context);

// The shard-map epoch a server attached to a FAILED_PRECONDITION answer, if any.
//
// A server that sees a request for an epoch other than its own answers FAILED_PRECONDITION and attaches its
// current epoch; the client library refreshes its map (to at least that epoch) and retries.
void SetCurrentEpoch(absl::Status& status, uint64_t epoch);
std::optional<uint64_t> GetCurrentEpoch(const absl::Status& status);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_STATUS_MACROS_H_
