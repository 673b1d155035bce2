// CPU quotas for the launcher's workers (deploy/launcher/cpu_quota.h): the flags' parsing, and a real control group
// capping a busy process (skipped, with the reason, where no CPU controller is writable).
#include "deploy/launcher/cpu_quota.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "common/base/child_process.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(CpuQuotaTest, QuotasAreCpusPerWorker) {
  absl::StatusOr<std::vector<double>> quotas = ParseCpuQuotas("1,0.25, none,0");
  ASSERT_TRUE(quotas.ok()) << quotas.status();
  EXPECT_EQ(*quotas, (std::vector<double>{1, 0.25, 0, 0}));
  for (const char* bad : {"", "1,", "fast", "-1", "0.0001", "nan", "inf"}) {
    absl::StatusOr<std::vector<double>> parsed = ParseCpuQuotas(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CpuQuotaTest, ChangesComeInIncreasingTime) {
  absl::StatusOr<std::vector<CpuQuotaChange>> changes = ParseCpuQuotaChanges("20:1,0.25; 40.5:1");
  ASSERT_TRUE(changes.ok()) << changes.status();
  ASSERT_EQ(changes->size(), 2u);
  EXPECT_EQ((*changes)[0].after_seconds, 20);
  EXPECT_EQ((*changes)[0].cpus, (std::vector<double>{1, 0.25}));
  EXPECT_EQ((*changes)[1].after_seconds, 40.5);
  for (const char* bad : {"20", "x:1", "-1:1", "20:1;10:1", "20:1;20:2", "20:zero"}) {
    EXPECT_EQ(ParseCpuQuotaChanges(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(ParseCpuQuotaChanges("")->empty());
}

// A process that spins for 1.5 s of wall time in a group at 0.2 CPUs gets about 0.3 s of CPU: the quota holds from
// its first instruction (it joins before exec). The group is gone once the CpuQuotaGroup is.
TEST(CpuQuotaTest, AGroupCapsItsProcessesCpuTime) {
  if (absl::Status s = CpuQuotaGroup::Available(); !s.ok()) GTEST_SKIP() << s.message();
  absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> group = CpuQuotaGroup::Create("test");
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_TRUE((*group)->SetCpus(0.2).ok());
  const std::string procs = (*group)->procs_file();
  ChildOptions child;
  child.argv = {"/bin/sh", "-c", "while :; do :; done"};
  child.join_cgroup_procs = procs;
  absl::StatusOr<pid_t> pid = StartChild(child);
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  kill(*pid, SIGKILL);
  int status = 0;
  struct rusage usage {};
  ASSERT_EQ(wait4(*pid, &status, 0, &usage), *pid);
  const double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                     usage.ru_stime.tv_usec / 1e6;
  EXPECT_GT(cpu, 0.15) << "it ran";
  EXPECT_LT(cpu, 0.45) << "0.2 CPUs for 1.5 s is 0.3 s of CPU";
  const std::string dir = procs.substr(0, procs.rfind('/'));
  group->reset();
  EXPECT_NE(access(dir.c_str(), F_OK), 0) << dir << " is left";
}

TEST(CpuQuotaTest, AQuotaBelowTheKernelsSmallestIsRefused) {
  if (absl::Status s = CpuQuotaGroup::Available(); !s.ok()) GTEST_SKIP() << s.message();
  absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> group = CpuQuotaGroup::Create("small");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->SetCpus(0.0001).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*group)->SetCpus(0.001).ok()) << "a 1 s period";
  EXPECT_TRUE((*group)->SetCpus(0).ok()) << "no quota";
}

}  // namespace
}  // namespace tessera
