#include "server/server_options.h"

#include "absl/strings/str_cat.h"
#include "common/daemon/command_line.h"
#include "common/fabric/ucx_worker.h"
#include "common/rpc/rpc.h"

namespace tessera {

absl::Status ValidateServerOptions(const ServerOptions& options) {
  std::string host;
  int port = 0;
  if (options.scheduler_address.empty()) return absl::InvalidArgumentError("--scheduler=HOST:PORT is required");
  if (absl::Status s = SplitHostPort(options.scheduler_address, &host, &port); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--scheduler: ", s.message()));
  }
  if (absl::Status s = CheckPortOption("--port", options.port, /*off_allowed=*/false); !s.ok()) return s;
  if (absl::Status s = CheckPortOption("--http_port", options.http_port, /*off_allowed=*/true); !s.ok()) return s;
  if (absl::Status s = CheckSpinOption(options.fabric_spin_us); !s.ok()) return s;
  if (options.id < -1) return absl::InvalidArgumentError(absl::StrCat("--id: expected >= 0, or -1 (any), got ", options.id));
  if (options.connect_timeout_s < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--connect_timeout_s: expected >= 1, got ", options.connect_timeout_s));
  }
  if (options.heartbeat_timeout_ms < 100) return absl::InvalidArgumentError("--heartbeat_timeout_ms: expected >= 100");
  if (options.update_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--update_threads: expected >= 1, got ", options.update_threads));
  }
  if (options.inline_update_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inline_update_bytes: expected >= 0, got ", options.inline_update_bytes));
  }
  if (!(options.max_row_memory_mb >= 0 && options.max_row_memory_mb <= static_cast<double>(int64_t{1} << 30))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_row_memory_mb: expected 0 (no cap) .. 2^30, got ", options.max_row_memory_mb));
  }
  return absl::OkStatus();
}

}  // namespace tessera
