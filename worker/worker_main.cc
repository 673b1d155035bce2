// tessera-worker: joins a job (--scheduler) or trains one alone (--local --job), computing gradients on a GPU or
// the CPU.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/daemon/cluster_environment.h"
#include "common/daemon/daemon_init.h"
#include "common/daemon/run_recorder.h"
#include "common/rpc/security_flags.h"
#include "common/daemon/signals.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "worker/worker.h"

DEFINE_string(scheduler, "",
              "HOST:PORT of the scheduler (required unless --local); under Slurm, default: the first host of "
              "SLURM_JOB_NODELIST with --scheduler_port");
DEFINE_int32(scheduler_port, 7070, "the scheduler's port when its host comes from SLURM_JOB_NODELIST");
DEFINE_bool(local, false, "train --job alone in this process, with no scheduler or servers (the baseline)");
DEFINE_string(job, "", "--local only: the JobSpec file (text format or JSON)");
DEFINE_string(run_dir, "", "--local only: directory for metrics.jsonl and summary.json");
DEFINE_bool(overwrite, false,
            "--local only: start afresh in a --run_dir that holds an earlier run, whose records move to "
            "RUN_DIR/replaced-<time>/ (refused otherwise)");
DEFINE_string(device, "auto",
              "auto (a GPU when one answers, else the CPU; under Slurm the GPU of SLURM_LOCALID among the visible "
              "ones), cpu, or cuda:N");
DEFINE_int32(rank, -1,
             "the worker rank to take (0 .. num_workers-1), also when that rank's previous process is still "
             "registered: a restarted worker rejoins the running job with it; -1: the first free rank, or the "
             "first whose worker was lost. Default under Slurm: SLURM_PROCID; in a Kubernetes Indexed Job: "
             "JOB_COMPLETION_INDEX (each plus --rank_offset)");
DEFINE_int32(rank_offset, 0,
             "added to a rank taken from SLURM_PROCID or JOB_COMPLETION_INDEX: the first rank of this group of "
             "workers when several groups (a heterogeneous Slurm job's components, several Indexed Jobs) form one job");
DEFINE_int32(cpu_threads, 1, "BLAS threads of the CPU backend (more than the free cores slows every process down)");
DEFINE_string(host, "127.0.0.1", "address /healthz and /metrics listen on (loopback by default)");
DEFINE_int32(http_port, 0, "port of /healthz and /metrics; 0 picks a free one (logged), -1 turns them off");
DEFINE_int32(connect_timeout_s, 120, "how long to wait for the scheduler at start-up (tried again every second)");
DEFINE_int32(clock_wait_timeout_ms, 300000, "longest wait for slower workers at the clock gate");
DEFINE_string(transport, "",
              "what carries pushes and pulls: empty takes the job's (transport:), grpc or ucx override it; ucx needs "
              "a job with trusted_network: true");
DEFINE_int32(fabric_spin_us, -1,
             "microseconds the UCX progress thread keeps polling after its last event before it sleeps; -1: 50 where "
             "the process may use more than 4 cores (affinity, cgroup quota), else 0 (where polling takes a core from training)");
DEFINE_bool(fabric_tcp, false,
            "let UCX use TCP (between hosts without RDMA; give the servers --fabric_tcp too); UCX then listens on a TCP "
            "port that trusts its peers: only on a fabric no untrusted process can reach");
DEFINE_int32(inject_slowdown_ms, 0, "experiments: every step takes this many milliseconds longer (a straggler)");
DEFINE_double(slow_factor, 1.0, "experiments: compute this many times slower than this device does (a slower GPU)");
DEFINE_double(stall_probability, 0, "experiments: each step stalls with this probability for --stall_ms");
DEFINE_int32(stall_ms, 0, "experiments: how long a transient stall lasts");
DEFINE_uint64(stall_seed, 1, "experiments: seed of the stalls (with the rank): the same seed stalls the same steps");
DEFINE_int64(slow_from_step, 0, "experiments: the slowdowns above start at this clock (slowed in mid-run)");
DEFINE_int32(simulate_compute_ms, 0,
             "benchmarks only: replace forward and backward by waiting this many milliseconds per step, split "
             "across the layers (a stand-in for a fast GPU); 0 computes for real");
DEFINE_string(dump_params, "", "if this worker is rank 0 (or --local): write the final parameters to this file");
TESSERA_DEFINE_SECURITY_FLAGS()

int main(int argc, char** argv) {
  tessera::InitDaemon("tessera-worker --scheduler=HOST:PORT [--device=auto|cpu|cuda:N]\n"
                          "       tessera-worker --local --job=FILE [--run_dir=DIR]", &argc, &argv);

  auto cluster = tessera::ReadClusterEnvironment();
  if (!cluster.ok()) {
    std::cerr << "tessera-worker: " << cluster.status().message() << std::endl;
    return 2;
  }
  if (absl::Status s = tessera::ClaimRunDirectory(FLAGS_local ? FLAGS_run_dir : "", FLAGS_overwrite); !s.ok()) {
    std::cerr << "tessera-worker: " << s.message() << std::endl;
    return 2;
  }
  tessera::WorkerOptions options;
  if (!FLAGS_local) {
    auto join = tessera::ResolveWorkerJoin(FLAGS_scheduler, FLAGS_scheduler_port, FLAGS_rank, FLAGS_rank_offset, *cluster);
    if (!join.ok()) {
      std::cerr << "tessera-worker: " << join.status().message() << std::endl;
      return 2;
    }
    options.scheduler_address = join->scheduler_address;
    options.rank = join->rank;
    if (!join->rank_source.empty()) {
      LOG(INFO) << "rank " << options.rank << " from " << join->rank_source
                << (FLAGS_rank_offset != 0 ? absl::StrCat(" + --rank_offset=", FLAGS_rank_offset) : "")
                << (cluster->slurm_size ? absl::StrCat(" (SLURM_NTASKS=", *cluster->slurm_size, ")") : "");
    }
  } else {
    options.scheduler_address = FLAGS_scheduler;
    options.rank = FLAGS_rank;
  }
  options.local = FLAGS_local;
  options.job_path = FLAGS_job;
  options.run_dir = FLAGS_run_dir;
  options.device = FLAGS_device;
  options.local_device_index = cluster->slurm_local_rank.value_or(0);
  options.cpu_threads = FLAGS_cpu_threads;
  options.listen_host = FLAGS_host;
  options.http_port = FLAGS_http_port;
  options.connect_timeout_s = FLAGS_connect_timeout_s;
  options.clock_wait_timeout_ms = FLAGS_clock_wait_timeout_ms;
  options.transport = FLAGS_transport;
  options.fabric_spin_us = FLAGS_fabric_spin_us;
  options.fabric_tcp = FLAGS_fabric_tcp;
  options.trainer.straggler.delay_ms = FLAGS_inject_slowdown_ms;
  options.trainer.straggler.slow_factor = FLAGS_slow_factor;
  options.trainer.straggler.stall_probability = FLAGS_stall_probability;
  options.trainer.straggler.stall_ms = FLAGS_stall_ms;
  options.trainer.straggler.stall_seed = FLAGS_stall_seed;
  options.trainer.straggler.from_step = FLAGS_slow_from_step;
  options.trainer.simulate_compute_ms = FLAGS_simulate_compute_ms;
  options.trainer.dump_params = FLAGS_dump_params;
  options.security = SecurityFlags();
  if (absl::Status valid = tessera::ValidateWorkerOptions(options); !valid.ok()) {
    std::cerr << "tessera-worker: " << valid.message() << std::endl;
    return 2;
  }

  auto worker = tessera::Worker::Start(options);
  if (!worker.ok()) {
    std::cerr << "tessera-worker: " << worker.status() << std::endl;
    return 1;
  }
  tessera::Worker* daemon = worker->get();
  tessera::DaemonRun run;
  run.stop = [daemon](int signal) {
    LOG(WARNING) << tessera::SignalName(signal) << ": stopping after this step";
    daemon->Stop(absl::StrCat("stopped by ", tessera::SignalName(signal)));
  };
  run.wait = [daemon] {
    absl::StatusOr<tessera::TrainerResult> result = daemon->Wait();
    if (!result.ok()) return result.status();
    LOG(INFO) << "done: " << result->steps << " steps, " << result->stop_reason;
    return absl::OkStatus();
  };
  run.signal_status_when_ok = true;  // it finished its step after the signal: the signal's exit status
  return tessera::RunUntilStopped("tessera-worker", run);
}
