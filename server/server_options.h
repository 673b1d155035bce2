// Everything a parameter server is configured with, read once from flags (server_main.cc) or set by tests.
#ifndef TESSERA_SERVER_SERVER_OPTIONS_H_
#define TESSERA_SERVER_SERVER_OPTIONS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/rpc/security.h"

namespace tessera {

struct ServerOptions {
  std::string scheduler_address;         // HOST:PORT of the scheduler (required)
  std::string listen_host = "127.0.0.1";  // loopback unless told otherwise
  int port = 0;                          // 0: any free port
  std::string advertise_host;            // what workers dial; default: listen_host
  int connect_timeout_s = 30;            // how long to wait for the scheduler at start-up
  int id = -1;                           // the server id to take (kept across restarts); -1: the first free one
  int heartbeat_timeout_ms = 10000;      // exit when the scheduler is silent this long
  int http_port = 0;                     // /healthz and /metrics on listen_host; 0: a free port; -1: off
  // UCX for jobs with transport UCX (server/fabric_service.h): on or off. Stopped at once when the job's
  // transport is gRPC.
  bool fabric = true;
  int fabric_spin_us = -1;               // UCX polling after events (common/fabric/ucx_worker.h); -1: automatic
  bool fabric_tcp = false;               // whether UCX may use (and listen on) TCP: FabricOptions::tcp
  int update_threads = 2;                // threads that apply pushes of at least inline_update_bytes
  int inline_update_bytes = 64 << 10;    // smaller pushes are applied on the gRPC thread (microseconds)
  // The memory the rows of embedding tables may take on this server (values, optimizer state, index); a push
  // that would create rows beyond it is refused (RESOURCE_EXHAUSTED). 0: no cap.
  double max_row_memory_mb = 0;
  std::shared_ptr<const Security> security = Security::Plaintext();  // TLS and the job token (common/rpc/security.h)
};

// INVALID_ARGUMENT naming the flag at fault.
[[nodiscard]] absl::Status ValidateServerOptions(const ServerOptions& options);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVER_OPTIONS_H_
