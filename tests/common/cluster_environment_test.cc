#include "common/daemon/cluster_environment.h"

#include <map>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

absl::StatusOr<ClusterEnvironment> Read(const std::map<std::string, std::string>& variables) {
  return ReadClusterEnvironment([&variables](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  });
}

TEST(ClusterEnvironmentTest, FirstHostOfCompressedSlurmNodeLists) {
  EXPECT_EQ(*FirstHostOfNodeList("n1"), "n1");
  EXPECT_EQ(*FirstHostOfNodeList("n1,n2"), "n1");
  EXPECT_EQ(*FirstHostOfNodeList("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(*FirstHostOfNodeList("node[3,5-6]"), "node3");
  EXPECT_EQ(*FirstHostOfNodeList("rack[2-3]-node"), "rack2-node");
  EXPECT_EQ(*FirstHostOfNodeList("a-1.example,b"), "a-1.example");
  for (const char* bad : {"", "n[", "n[]", "n[x-y]", "n]"}) {
    EXPECT_THAT(FirstHostOfNodeList(bad), StatusIs(absl::StatusCode::kInvalidArgument, "")) << bad;
  }
}

TEST(ClusterEnvironmentTest, ASlurmStepGivesRankSizeLocalRankAndTheSchedulerHost) {
  auto env = Read({{"SLURM_STEP_ID", "2"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                   {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  ASSERT_THAT(env, IsOk());
  std::string source;
  EXPECT_EQ(env->Rank(/*use_pod_ordinal=*/false, &source), 3);
  EXPECT_EQ(source, "SLURM_PROCID=3");
  EXPECT_EQ(env->slurm_size, 4);
  EXPECT_EQ(env->slurm_local_rank, 1);
  EXPECT_EQ(*SchedulerAddress("", 7070, *env), "gpu07:7070");
  EXPECT_EQ(*SchedulerAddress("other:1", 7070, *env), "other:1");  // the flag wins
}

TEST(ClusterEnvironmentTest, AHeterogeneousJobsSchedulerIsOnComponentZerosFirstNode) {
  // A step of component 1 sees only its own nodes in SLURM_JOB_NODELIST.
  auto env = Read({{"SLURM_STEP_ID", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_JOB_NODELIST", "b[3-4]"},
                   {"SLURM_JOB_NODELIST_HET_GROUP_0", "a[1-2]"}, {"SLURMD_NODENAME", "b3"}});
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(*SchedulerAddress("", 7070, *env), "a1:7070");
  EXPECT_EQ(env->AdvertiseHost("0.0.0.0"), "b3");
}

TEST(ClusterEnvironmentTest, AdvertisedHostPrefersThePodThenTheNodeThenTheMachine) {
  auto pod = Read({{"POD_IP", "10.1.2.3"}, {"SLURMD_NODENAME", "n1"}});
  EXPECT_EQ(pod->AdvertiseHost("0.0.0.0"), "10.1.2.3");
  EXPECT_EQ(pod->AdvertiseHost("127.0.0.1"), "127.0.0.1");  // a specific address is what peers must dial
  auto plain = Read({});
  EXPECT_EQ(plain->AdvertiseHost("127.0.0.1"), "127.0.0.1");
  EXPECT_NE(plain->AdvertiseHost("0.0.0.0"), "0.0.0.0");
  EXPECT_FALSE(plain->AdvertiseHost("::").empty());
}

TEST(ClusterEnvironmentTest, TheBatchScriptItselfHasNoRank) {
  auto env = Read({{"SLURM_PROCID", "0"}, {"SLURM_JOB_NODELIST", "n1"}});
  ASSERT_THAT(env, IsOk());
  std::string source;
  EXPECT_FALSE(env->Rank(false, &source).has_value());
  EXPECT_EQ(*SchedulerAddress("", 9, *env), "n1:9");
}

TEST(ClusterEnvironmentTest, KubernetesIndexedJobsAndStatefulSets) {
  std::string source;
  auto job = Read({{"JOB_COMPLETION_INDEX", "5"}, {"POD_NAME", "tessera-worker-5-abcde"}, {"POD_IP", "10.1.2.3"}});
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->Rank(false, &source), 5);
  EXPECT_EQ(source, "JOB_COMPLETION_INDEX=5");
  auto set = Read({{"POD_NAME", "tessera-server-2"}, {"POD_IP", "10.1.2.4"}});
  ASSERT_THAT(set, IsOk());
  EXPECT_FALSE(set->Rank(/*use_pod_ordinal=*/false, &source).has_value());
  EXPECT_EQ(set->Rank(/*use_pod_ordinal=*/true, &source), 2);
  EXPECT_EQ(set->pod_ip, "10.1.2.4");
  EXPECT_THAT(SchedulerAddress("", 7070, *set), StatusIs(absl::StatusCode::kInvalidArgument, "--scheduler"));
}

TEST(ClusterEnvironmentTest, MalformedVariablesAreNamed) {
  EXPECT_THAT(Read({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "x"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "SLURM_PROCID='x'"));
  EXPECT_THAT(Read({{"JOB_COMPLETION_INDEX", "-1"}}), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(Read({{"SLURM_JOB_NODELIST", "n["}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "SLURM_JOB_NODELIST"));
}

}  // namespace
}  // namespace tessera
