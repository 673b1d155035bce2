// The jobs and views the request fuzzers start from: small, valid, one per consistency mode, so that a seed's
// requests reach the logic of each.
#ifndef TESSERA_TESTS_FUZZ_FUZZ_JOBS_H_
#define TESSERA_TESTS_FUZZ_FUZZ_JOBS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/rpc/security.h"
#include "proto/cluster.pb.h"

namespace tessera::fuzz {

inline constexpr int kServers = 2;
inline constexpr int kWorkers = 3;

// Mode by `selector`: SYNC, ASYNC, SSP(2), SYNC with a backup worker and a balanced split.
inline tessera::v1::JobSpec FuzzJob(uint8_t selector) {
  tessera::v1::JobSpec job;
  job.set_name("fuzz");
  job.mutable_model()->mutable_mlp()->add_hidden_sizes(4);
  job.mutable_data()->set_format(tessera::v1::DataSpec::SYNTHETIC);
  job.mutable_optimizer()->set_momentum(0.5f);
  job.set_batch_size(4);
  job.set_chunk_bytes(64);
  job.mutable_stop()->set_max_steps(1000);
  job.mutable_cluster()->set_num_servers(kServers);
  job.mutable_cluster()->set_num_workers(kWorkers);
  auto* c = job.mutable_consistency();
  switch (selector % 4) {
    case 0:
      c->set_mode(tessera::v1::ConsistencySpec::SYNC);
      break;
    case 1:
      c->set_mode(tessera::v1::ConsistencySpec::ASYNC);
      break;
    case 2:
      c->set_mode(tessera::v1::ConsistencySpec::SSP);
      c->set_staleness(2);
      break;
    default:
      c->set_mode(tessera::v1::ConsistencySpec::SYNC);
      c->set_backup_workers(1);
      c->set_balance(tessera::v1::ConsistencySpec::THROUGHPUT);
      break;
  }
  ApplyJobDefaults(job);
  return job;
}

// The member key the fuzzers give worker `w`.
inline std::string WorkerKey(int w) { return absl::StrCat("fuzz-worker-key-", w); }

// A view of one parameter "w" of 40 floats in chunks of 16 on server 0 (all of them), every worker in it
// with WorkerKey's digest.
inline tessera::v1::ShardMap FuzzView(uint64_t epoch) {
  tessera::v1::ShardMap map;
  map.set_epoch(epoch);
  for (int s = 0; s < kServers; ++s) {
    auto* server = map.add_servers();
    server->set_id(s);
    server->set_address(absl::StrCat("127.0.0.1:", 7000 + s));
    server->set_incarnation(1);
  }
  auto* p = map.add_params();
  p->set_name("w");
  p->set_dtype(tessera::v1::DT_FLOAT32);
  p->add_shape(40);
  p->mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p->mutable_init()->set_scale(0.5f);
  for (int i = 0; i < 3; ++i) {
    auto* c = map.add_chunks();
    c->set_param("w");
    c->set_index(i);
    c->set_offset(16 * i);
    c->set_length(i < 2 ? 16 : 8);
    c->set_server_id(0);
  }
  // An embedding table "emb": rows of 4, 4 hash slots on server 0, admitted at their second gradient, expiring
  // after 3 clocks without one, lazy Adam (per-row step counts).
  auto* e = map.add_params();
  e->set_name("emb");
  e->set_dtype(tessera::v1::DT_FLOAT32);
  e->add_shape(4);
  e->mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  e->mutable_init()->set_scale(0.5f);
  e->mutable_embedding()->set_slots(4);
  e->mutable_embedding()->set_admit_after(2);
  e->mutable_embedding()->set_expire_after_steps(3);
  e->mutable_embedding()->mutable_optimizer()->set_kind(tessera::v1::RowOptimizerSpec::LAZY_ADAM);
  for (int i = 0; i < 4; ++i) {
    auto* c = map.add_chunks();
    c->set_param("emb");
    c->set_index(i);
    c->set_length(4);
    c->set_server_id(0);
  }
  for (int w = 0; w < kWorkers; ++w) {
    auto* slot = map.add_workers();
    slot->set_id(w);
    slot->set_incarnation(1);
    slot->set_active(true);
    slot->set_key_digest(KeyDigest(WorkerKey(w)));
  }
  return map;
}

}  // namespace tessera::fuzz

#endif  // TESSERA_TESTS_FUZZ_FUZZ_JOBS_H_
