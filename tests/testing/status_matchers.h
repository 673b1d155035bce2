// Status assertions for tests: the exact code, and optionally text the message must contain.
//
//   EXPECT_THAT(store.Push(request), StatusIs(absl::StatusCode::kInvalidArgument, "expected 400 bytes"));
#ifndef TESSERA_TESTS_TESTING_STATUS_MATCHERS_H_
#define TESSERA_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace tessera::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER_P2(StatusIs, code, substring,
           std::string("has code ") + absl::StatusCodeToString(code) + " and a message containing '" + substring +
               "'") {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status.ToString();
  return status.code() == code && std::string(status.message()).find(substring) != std::string::npos;
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status.ToString();
  return status.ok();
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_STATUS_MATCHERS_H_
