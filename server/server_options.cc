#include "server/server_options.h"

#include "absl/strings/str_cat.h"
#include "common/rpc.h"

namespace tessera {

absl::Status ValidateServerOptions(const ServerOptions& options) {
  std::string host;
  int port = 0;
  if (options.scheduler_address.empty()) return absl::InvalidArgumentError("--scheduler=HOST:PORT is required");
  if (absl::Status s = SplitHostPort(options.scheduler_address, &host, &port); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--scheduler: ", s.message()));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port: expected 0 .. 65535, got ", options.port));
  }
  if (options.http_port < -1 || options.http_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http_port: expected -1 .. 65535, got ", options.http_port));
  }
  if (options.connect_attempts < 1) return absl::InvalidArgumentError("--connect_attempts: expected >= 1");
  if (options.heartbeat_timeout_ms < 100) return absl::InvalidArgumentError("--heartbeat_timeout_ms: expected >= 100");
  if (options.update_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--update_threads: expected >= 1, got ", options.update_threads));
  }
  if (options.inline_update_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inline_update_bytes: expected >= 0, got ", options.inline_update_bytes));
  }
  return absl::OkStatus();
}

}  // namespace tessera
