// What the job fixes for every unit a server holds: set by the server's first view, constant afterwards.
#ifndef TESSERA_SERVER_JOB_CONFIG_H_
#define TESSERA_SERVER_JOB_CONFIG_H_

#include <memory>

#include "common/model/update_rule.h"
#include "proto/job.pb.h"
#include "server/consistency/policy.h"
#include "server/tables/table.h"

namespace tessera {

struct JobConfig final : UnitSettings {
  explicit JobConfig(const tessera::v1::JobSpec& job)
      : job(job), rule(AppliedOptimizer(job)), policy(ConsistencyPolicy::ForJob(job.consistency(), rule)) {}
  const tessera::v1::JobSpec job;
  const UpdateRule rule;
  const std::unique_ptr<ConsistencyPolicy> policy;  // uses `rule`

  // What the tables create units with (server/tables/table.h).
  const tessera::v1::JobSpec& job_spec() const override { return job; }
  int state_slots() const override { return rule.state_slots(); }
  void PrepareChunkLocked(Chunk& chunk, int workers) const override { policy->PrepareChunkLocked(chunk, workers); }
};

}  // namespace tessera

#endif  // TESSERA_SERVER_JOB_CONFIG_H_
