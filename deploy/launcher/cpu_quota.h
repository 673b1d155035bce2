// CPU quotas: a process made slower the way a slower device is, without sleeping. A worker in a control group
// whose CPU time is capped (a quarter of one CPU, say) computes at that speed, and the CPU it cannot use goes to
// the other processes; a worker that sleeps instead hands its CPU to the others and makes the cluster no slower.
//
//   absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> group = CpuQuotaGroup::Create("worker-1");
//   (*group)->SetCpus(0.25);                        // a quarter of one CPU, from now on
//   child.join_cgroup_procs = (*group)->procs_file();  // the child joins before it execs (common/base/child_process.h)
//
// The group is made below this process's own, in cgroup v2 (cpu.max) where the unified hierarchy delegates the
// cpu controller to it, else in cgroup v1's cpu hierarchy (cpu.cfs_quota_us over cpu.cfs_period_us); it is named
// tessera-<pid of this process>-<name> and removed when the CpuQuotaGroup is destroyed (once its processes are
// gone). The quota may change while the processes run.
#ifndef TESSERA_DEPLOY_LAUNCHER_CPU_QUOTA_H_
#define TESSERA_DEPLOY_LAUNCHER_CPU_QUOTA_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

class CpuQuotaGroup {
 public:
  // The quota is enforced over periods of 10 ms (longer for quotas below 0.1 CPUs: the kernel's smallest quota is
  // 1 ms a period). Short periods spread a slow worker's throttling over its step, as a slower device would;
  // with the kernel's default 100 ms a step of 20 ms runs at full speed or stalls for 75 ms.
  static constexpr int kPeriodUs = 10000;
  static constexpr int kMinQuotaUs = 1000;
  static constexpr int kMaxPeriodUs = 1000000;  // so quotas go down to 0.001 CPUs
  static constexpr double kMinCpus = static_cast<double>(kMinQuotaUs) / kMaxPeriodUs;

  // Makes the group. FAILED_PRECONDITION when no CPU controller can be written here, naming each place tried and
  // why it failed (e.g. cgroup v2 without its cpu controller, cgroup v1 not writable without root).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> Create(const std::string& name);
  // OK when a group can be made here (one is made and removed); else why not, as Create says it.
  [[nodiscard]] static absl::Status Available();
  // Removes the empty groups earlier launchers left behind (tessera-<pid>-*, whose pid is gone).
  static void RemoveLeftovers();

  CpuQuotaGroup(const CpuQuotaGroup&) = delete;
  CpuQuotaGroup& operator=(const CpuQuotaGroup&) = delete;
  ~CpuQuotaGroup();  // removes the group, waiting up to 2 s for its processes to be gone

  // The processes of the group get at most `cpus` CPUs' worth of time (0.25: a quarter of one CPU; 2: two CPUs);
  // 0: no limit. INVALID_ARGUMENT below kMinCpus (other than 0) or not finite.
  [[nodiscard]] absl::Status SetCpus(double cpus);
  double cpus() const { return cpus_; }

  // The file a process writes a pid to (or "0", itself) to join the group.
  std::string procs_file() const { return path_ + "/cgroup.procs"; }
  // "cgroup v1 <path>" or "cgroup v2 <path>".
  std::string Describe() const;

 private:
  CpuQuotaGroup(int version, std::string path) : version_(version), path_(std::move(path)) {}

  const int version_;
  const std::string path_;
  double cpus_ = 0;
};

// "1,0.25": one CPU count per worker (0 or "none": no quota). INVALID_ARGUMENT naming the bad entry.
[[nodiscard]] absl::StatusOr<std::vector<double>> ParseCpuQuotas(absl::string_view text);

// A change of the workers' quotas during a run: `after_seconds` after the workers started, worker i gets
// cpus[i % cpus.size()].
struct CpuQuotaChange {
  double after_seconds = 0;
  std::vector<double> cpus;
};
// "30:1,0.25" or "30:1,0.25;60:1,1" (changes in increasing time). INVALID_ARGUMENT naming the bad part.
[[nodiscard]] absl::StatusOr<std::vector<CpuQuotaChange>> ParseCpuQuotaChanges(absl::string_view text);

}  // namespace tessera

#endif  // TESSERA_DEPLOY_LAUNCHER_CPU_QUOTA_H_
