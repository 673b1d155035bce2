// What a cluster manager tells a process through its environment, and the defaults Tessera's daemons take from it
// when their flags leave them open.
//
//   Slurm (inside a job step, i.e. SLURM_STEP_ID is set): SLURM_PROCID is the task's rank in its step,
//   SLURM_NTASKS the step's size, SLURM_LOCALID its rank on its node, SLURM_JOB_NODELIST the job's hosts
//   (compressed, "node[01-04],gpu7"): the scheduler runs on the first of them; in a heterogeneous job, on the
//   first of component 0's (SLURM_JOB_NODELIST_HET_GROUP_0: a step of component 1 sees only its own nodes in
//   SLURM_JOB_NODELIST). SLURMD_NODENAME is the node a task runs on.
//   Kubernetes: POD_NAME and POD_IP, which Tessera's manifests set from the downward API; a StatefulSet pod's
//   name ends in its ordinal ("tessera-server-2"); an Indexed Job sets JOB_COMPLETION_INDEX.
#ifndef TESSERA_COMMON_DAEMON_CLUSTER_ENVIRONMENT_H_
#define TESSERA_COMMON_DAEMON_CLUSTER_ENVIRONMENT_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace tessera {

struct ClusterEnvironment {
  std::optional<int> slurm_rank;        // SLURM_PROCID, in a job step
  std::optional<int> slurm_size;        // SLURM_NTASKS, in a job step
  std::optional<int> slurm_local_rank;  // SLURM_LOCALID, in a job step
  std::string slurm_first_host;         // the first host of the job's (component 0's) node list
  std::string slurm_node_name;          // SLURMD_NODENAME
  std::optional<int> job_completion_index;  // JOB_COMPLETION_INDEX (Kubernetes Indexed Job)
  std::string pod_name;                 // POD_NAME
  std::string pod_ip;                   // POD_IP
  std::optional<int> pod_ordinal;       // the trailing "-N" of POD_NAME (StatefulSet)

  // The rank a process of a job step or an indexed pod has: SLURM_PROCID, else JOB_COMPLETION_INDEX, else the
  // pod's ordinal (when `use_pod_ordinal`); `source` says which ("SLURM_PROCID=3").
  std::optional<int> Rank(bool use_pod_ordinal, std::string* source) const;

  // The name peers should dial for a daemon listening on `listen_host` when no --advertise_host is given:
  // `listen_host` itself, unless it is a wildcard (0.0.0.0, ::); then the pod's IP, else the Slurm node's name,
  // else the machine's host name.
  std::string AdvertiseHost(const std::string& listen_host) const;
};

// Reads the variables above through `getenv` (the process's environment by default). A variable that is set but
// malformed (SLURM_PROCID=x, a node list that cannot be read) is INVALID_ARGUMENT naming it.
absl::StatusOr<ClusterEnvironment> ReadClusterEnvironment(
    const std::function<const char*(const char*)>& getenv = [](const char* name) { return std::getenv(name); });

// The first host of a Slurm host list: "gpu[07-09,12],cpu1" -> "gpu07", "n1,n2" -> "n1", "node" -> "node".
absl::StatusOr<std::string> FirstHostOfNodeList(const std::string& nodelist);

// The scheduler's address for a server or worker: `flag` when given; otherwise, under Slurm, the first host of
// the job's node list with `port`; otherwise INVALID_ARGUMENT asking for --scheduler.
absl::StatusOr<std::string> SchedulerAddress(const std::string& flag, int port, const ClusterEnvironment& env);

// Where a worker joins: the scheduler's address (SchedulerAddress) and the rank to ask for: `rank` when given
// (>= 0); otherwise, for a process of a job step or an indexed pod, `rank_offset` + its rank there (`rank_source`
// says from which variable); otherwise -1 (any free rank). The C++ worker and the Python package take their
// settings here, so a script joins the way tessera-worker does.
struct WorkerJoin {
  std::string scheduler_address;
  int rank = -1;
  std::string rank_source;     // e.g. "SLURM_PROCID=3"; empty when the rank was given or is left open
};
absl::StatusOr<WorkerJoin> ResolveWorkerJoin(const std::string& scheduler, int scheduler_port, int rank,
                                             int rank_offset, const ClusterEnvironment& env);

}  // namespace tessera

#endif  // TESSERA_COMMON_DAEMON_CLUSTER_ENVIRONMENT_H_
