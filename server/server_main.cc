// tessera-server: a parameter server daemon. It registers with the scheduler, receives its shards, serves pulls
// and pushes, and exits when the scheduler ends the job.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/daemon/cluster_environment.h"
#include "common/daemon/daemon_init.h"
#include "common/rpc/security_flags.h"
#include "common/daemon/signals.h"
#include "common/base/status_macros.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "server/server.h"

DEFINE_string(scheduler, "",
              "HOST:PORT of the scheduler; under Slurm, default: the first host of SLURM_JOB_NODELIST with "
              "--scheduler_port");
DEFINE_int32(scheduler_port, 7070, "the scheduler's port when its host comes from SLURM_JOB_NODELIST");
DEFINE_string(host, "127.0.0.1", "address to listen on (loopback by default; 0.0.0.0 for every interface)");
DEFINE_int32(port, 0, "port to listen on; 0 picks a free one");
DEFINE_string(advertise_host, "",
              "host name or address workers should dial; default: --host, or when that is 0.0.0.0 or ::, POD_IP "
              "(Kubernetes), else SLURMD_NODENAME (Slurm), else this machine's name");
DEFINE_int32(id, -1,
             "the server id to take (0 .. num_servers-1), also when that id's previous process is still registered: "
             "a restarted server takes its place in the running job; -1: the first free id, or the first whose "
             "server was lost. Default under Slurm: SLURM_PROCID; in a Kubernetes StatefulSet: the pod's ordinal");
DEFINE_int32(connect_timeout_s, 30,
             "how long to wait for the scheduler at start-up (tried again every second); a server started after its job "
             "ended gives up after this long");
DEFINE_int32(http_port, 0, "port of /healthz and /metrics on --host; 0 picks a free one (logged), -1 turns them off");
DEFINE_int32(heartbeat_timeout_ms, 10000,
             "exit when the scheduler has not answered for this long (a scheduler that says its own timeout wins)");
DEFINE_int32(update_threads, 2, "threads that apply large pushes, so that gRPC's threads keep reading the network");
DEFINE_bool(fabric, true,
            "start UCX for jobs with transport: UCX (a trusted network); workers connect to the address the server "
            "registers, which only the job's members receive. A job whose transport is GRPC stops it at once");
DEFINE_bool(fabric_tcp, false,
            "let UCX use TCP between hosts; UCX then listens on a TCP port of each interface it uses, whose connection "
            "code trusts its peers: only on a fabric no untrusted process can reach (shared memory, cross-memory "
            "attach and RDMA need no port)");
DEFINE_int32(fabric_spin_us, -1,
             "microseconds the UCX progress thread keeps polling after its last event before it sleeps; -1: 50 where "
             "the process may use more than 4 cores (affinity, cgroup quota), else 0 (where polling takes a core from the updates)");
DEFINE_double(max_row_memory_mb, 0,
              "memory the rows of embedding tables may take on this server (values, optimizer state, index), in MiB "
              "(fractions allowed); a push that would create rows beyond it is refused with RESOURCE_EXHAUSTED, "
              "changing nothing; 0: no cap");
DEFINE_int32(inline_update_bytes, 64 << 10,
             "pushes smaller than this many bytes are applied on the gRPC thread that received them");
TESSERA_DEFINE_SECURITY_FLAGS()

namespace {
// The server's options from its flags and the cluster's environment (Slurm, Kubernetes), validated.
absl::StatusOr<tessera::ServerOptions> OptionsFromFlags() {
  TESSERA_ASSIGN_OR_RETURN(tessera::ClusterEnvironment cluster, tessera::ReadClusterEnvironment());
  tessera::ServerOptions options;
  TESSERA_ASSIGN_OR_RETURN(options.scheduler_address,
                           tessera::SchedulerAddress(FLAGS_scheduler, FLAGS_scheduler_port, cluster));
  options.listen_host = FLAGS_host;
  options.port = FLAGS_port;
  options.advertise_host = FLAGS_advertise_host.empty() ? cluster.AdvertiseHost(FLAGS_host) : FLAGS_advertise_host;
  options.connect_timeout_s = FLAGS_connect_timeout_s;
  options.id = FLAGS_id;
  std::string id_source;
  if (options.id == -1) {
    if (std::optional<int> id = cluster.Rank(/*use_pod_ordinal=*/true, &id_source)) {
      options.id = *id;
      LOG(INFO) << "server id " << options.id << " from " << id_source;
    }
  }
  options.heartbeat_timeout_ms = FLAGS_heartbeat_timeout_ms;
  options.http_port = FLAGS_http_port;
  options.fabric = FLAGS_fabric;
  options.fabric_tcp = FLAGS_fabric_tcp;
  options.fabric_spin_us = FLAGS_fabric_spin_us;
  options.update_threads = FLAGS_update_threads;
  options.inline_update_bytes = FLAGS_inline_update_bytes;
  options.max_row_memory_mb = FLAGS_max_row_memory_mb;
  TESSERA_ASSIGN_OR_RETURN(options.security, tessera::Security::Load(SecurityFlags()));
  TESSERA_RETURN_IF_ERROR(tessera::ValidateServerOptions(options));
  return options;
}
}  // namespace

int main(int argc, char** argv) {
  tessera::InitDaemon("tessera-server --scheduler=HOST:PORT [--host=ADDR --port=N]", &argc, &argv);

  absl::StatusOr<tessera::ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "tessera-server: " << options.status().message() << std::endl;
    return 2;
  }

  auto server = tessera::Server::Start(*options);
  if (!server.ok()) {
    std::cerr << "tessera-server: " << server.status() << std::endl;
    return 1;
  }
  tessera::Server* daemon = server->get();
  tessera::DaemonRun run;
  run.stop = [daemon](int signal) {
    daemon->Stop(absl::CancelledError(absl::StrCat("stopped by ", tessera::SignalName(signal))));
  };
  run.wait = [daemon] {
    absl::Status status = daemon->Wait();
    if (status.ok()) LOG(INFO) << "server " << daemon->id() << " finished";
    return status;
  };
  return tessera::RunUntilStopped("tessera-server", run);
}
