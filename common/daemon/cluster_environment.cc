#include "common/daemon/cluster_environment.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tessera {
namespace {

absl::Status ReadInt(const std::function<const char*(const char*)>& getenv, const char* name,
                     std::optional<int>* out) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') return absl::OkStatus();
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", text, "': expected a number >= 0"));
  }
  *out = value;
  return absl::OkStatus();
}

std::string Get(const std::function<const char*(const char*)>& getenv, const char* name) {
  const char* text = getenv(name);
  return text == nullptr ? "" : text;
}

}  // namespace

absl::StatusOr<std::string> FirstHostOfNodeList(const std::string& nodelist) {
  // Up to the first comma outside brackets.
  int depth = 0;
  size_t end = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string first = nodelist.substr(0, end);
  const size_t open = first.find('[');
  if (open == std::string::npos) {
    if (first.empty() || first.find(']') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read the node list '", nodelist, "'"));
    }
    return first;
  }
  const size_t close = first.find(']', open);
  if (close == std::string::npos || close == open + 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the node list '", nodelist, "'"));
  }
  // The first range or number in the brackets, zero padding kept: "07-09,12" -> "07".
  const std::string inside = first.substr(open + 1, close - open - 1);
  const size_t stop = inside.find_first_of(",-");
  const std::string number = inside.substr(0, stop);
  if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the node list '", nodelist, "'"));
  }
  return absl::StrCat(first.substr(0, open), number, first.substr(close + 1));
}

std::optional<int> ClusterEnvironment::Rank(bool use_pod_ordinal, std::string* source) const {
  if (slurm_rank) {
    *source = absl::StrCat("SLURM_PROCID=", *slurm_rank);
    return slurm_rank;
  }
  if (job_completion_index) {
    *source = absl::StrCat("JOB_COMPLETION_INDEX=", *job_completion_index);
    return job_completion_index;
  }
  if (use_pod_ordinal && pod_ordinal) {
    *source = absl::StrCat("the ordinal of POD_NAME=", pod_name);
    return pod_ordinal;
  }
  return std::nullopt;
}

absl::StatusOr<ClusterEnvironment> ReadClusterEnvironment(const std::function<const char*(const char*)>& getenv) {
  ClusterEnvironment env;
  // Only a job step's tasks have ranks: the batch script itself (no SLURM_STEP_ID) is nobody's rank 0.
  if (!Get(getenv, "SLURM_STEP_ID").empty()) {
    for (auto [name, out] : {std::pair{"SLURM_PROCID", &env.slurm_rank}, std::pair{"SLURM_NTASKS", &env.slurm_size},
                             std::pair{"SLURM_LOCALID", &env.slurm_local_rank}}) {
      if (absl::Status s = ReadInt(getenv, name, out); !s.ok()) return s;
    }
  }
  for (const char* name : {"SLURM_JOB_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST"}) {
    const std::string nodes = Get(getenv, name);
    if (nodes.empty()) continue;
    absl::StatusOr<std::string> first = FirstHostOfNodeList(nodes);
    if (!first.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", first.status().message()));
    env.slurm_first_host = *first;
    break;
  }
  env.slurm_node_name = Get(getenv, "SLURMD_NODENAME");
  if (absl::Status s = ReadInt(getenv, "JOB_COMPLETION_INDEX", &env.job_completion_index); !s.ok()) return s;
  env.pod_name = Get(getenv, "POD_NAME");
  env.pod_ip = Get(getenv, "POD_IP");
  if (const size_t dash = env.pod_name.rfind('-'); dash != std::string::npos) {
    int ordinal = 0;
    if (absl::SimpleAtoi(env.pod_name.substr(dash + 1), &ordinal) && ordinal >= 0) env.pod_ordinal = ordinal;
  }
  return env;
}

std::string ClusterEnvironment::AdvertiseHost(const std::string& listen_host) const {
  // A specific address is what peers must dial; only a wildcard leaves the name open.
  if (listen_host != "0.0.0.0" && listen_host != "::" && listen_host != "[::]") return listen_host;
  if (!pod_ip.empty()) return pod_ip;
  if (!slurm_node_name.empty()) return slurm_node_name;
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') return name;
  return listen_host;
}

absl::StatusOr<std::string> SchedulerAddress(const std::string& flag, int port, const ClusterEnvironment& env) {
  if (!flag.empty()) return flag;
  if (!env.slurm_first_host.empty()) return absl::StrCat(env.slurm_first_host, ":", port);
  return absl::InvalidArgumentError(
      "--scheduler=HOST:PORT is required (or TESSERA_SCHEDULER; under Slurm the first host of SLURM_JOB_NODELIST "
      "with --scheduler_port)");
}

absl::StatusOr<WorkerJoin> ResolveWorkerJoin(const std::string& scheduler, int scheduler_port, int rank,
                                             int rank_offset, const ClusterEnvironment& env) {
  WorkerJoin join;
  TESSERA_ASSIGN_OR_RETURN(join.scheduler_address, SchedulerAddress(scheduler, scheduler_port, env));
  join.rank = rank;
  if (rank < 0) {
    if (std::optional<int> from_env = env.Rank(/*use_pod_ordinal=*/false, &join.rank_source)) {
      join.rank = rank_offset + *from_env;
    }
  }
  return join;
}

}  // namespace tessera
