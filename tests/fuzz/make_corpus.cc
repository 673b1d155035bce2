// Writes the fuzzers' seed corpus (tests/fuzz/corpus/TARGET/*) from valid messages:
//   make_corpus tests/fuzz/corpus
// Run again when the request messages change; the seeds are kept in the repository.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/model/checkpoint_file.h"
#include "common/model/job_spec.h"
#include "common/base/tensor_codec.h"
#include "proto/checkpoint.pb.h"
#include "proto/ps.pb.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_jobs.h"

namespace tessera::fuzz {
namespace {

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

tessera::v1::PushRequest Push(int worker, uint64_t seq, int64_t clock, int index, int length) {
  tessera::v1::PushRequest r;
  r.set_epoch(1);
  r.set_worker_id(worker);
  r.set_incarnation(1);
  r.set_seq(seq);
  r.set_clock(clock);
  r.set_read_clock_version(clock);
  r.set_batch_size(4);
  r.mutable_key()->set_param("w");
  r.mutable_key()->set_index(index);
  EncodeFloats(std::vector<float>(length, 0.25f * (worker + 1)), r.mutable_data());
  return r;
}

void ShardStoreSeeds(const std::string& dir) {
  for (uint8_t mode = 0; mode < 4; ++mode) {
    std::string seed(1, static_cast<char>(mode));
    // A round of every worker on chunk 0, with keys; an exchange; a pull; a new view; a round decision.
    for (int w = 0; w < kWorkers; ++w) AppendRequest(0x80 | 1, Push(w, 1, 0, 0, 16).SerializeAsString(), &seed);
    AppendRequest(0x80 | 2, Push(0, 2, mode == 1 ? 1 : 0, 1, 16).SerializeAsString(), &seed);
    tessera::v1::PullRequest pull;
    pull.set_epoch(1);
    pull.mutable_key()->set_param("w");
    pull.set_have_version(-1);
    AppendRequest(3, pull.SerializeAsString(), &seed);
    tessera::v1::AssignShardsRequest assign;
    *assign.mutable_shard_map() = FuzzView(2);
    *assign.mutable_job() = FuzzJob(mode);
    AppendRequest(0, assign.SerializeAsString(), &seed);
    tessera::v1::DecideRoundsRequest decide;
    auto* round = decide.add_rounds();
    round->set_round(0);
    round->add_workers(0);
    round->add_workers(1);
    AppendRequest(4, decide.SerializeAsString(), &seed);
    AppendRequest(5, "", &seed);
    // An embedding table: the same ids pushed twice (admitted at the second), with a repeat, then read.
    tessera::v1::RowPushRequest rows;
    rows.set_epoch(2);
    rows.set_seq(10);
    rows.set_batch_size(4);
    rows.set_table("emb");
    for (uint64_t id : {3, 7, 3}) rows.add_ids(id);
    rows.set_grads(std::string(3 * 4 * sizeof(float), '\0'));
    AppendRequest(0x80 | 8, rows.SerializeAsString(), &seed);
    rows.set_seq(11);
    rows.set_clock(4);
    AppendRequest(0x80 | 8, rows.SerializeAsString(), &seed);
    tessera::v1::RowPullRequest read;
    read.set_epoch(2);
    read.set_table("emb");
    for (uint64_t id : {3, 7, 11}) read.add_ids(id);
    AppendRequest(7, read.SerializeAsString(), &seed);
    AppendRequest(5, "", &seed);
    Write(dir, "requests-mode" + std::to_string(mode), seed);
  }
}

void SchedulerSeeds(const std::string& dir) {
  for (uint8_t mode = 0; mode < 4; ++mode) {
    std::string seed(1, static_cast<char>(mode));
    for (int s = 0; s < kServers; ++s) {
      tessera::v1::RegisterRequest r;
      r.set_role(tessera::v1::SERVER);
      r.set_address("127.0.0.1:" + std::to_string(7000 + s));
      r.set_control_key("control-key");
      AppendRequest(0, r.SerializeAsString(), &seed);
    }
    for (int w = 0; w < kWorkers; ++w) {
      tessera::v1::RegisterRequest r;
      r.set_role(tessera::v1::WORKER);
      r.set_hostname("node");
      r.set_device("cpu");
      r.set_requested_id(w);
      AppendRequest(0, r.SerializeAsString(), &seed);
    }
    tessera::v1::DeclareRequest declare;
    *declare.add_params() = FuzzView(1).params(0);
    AppendRequest(2, declare.SerializeAsString(), &seed);
    AppendRequest(3, "", &seed);
    for (int w = 0; w < kWorkers; ++w) {
      tessera::v1::HeartbeatRequest beat;
      beat.set_role(tessera::v1::WORKER);
      beat.set_id(w);
      AppendRequest(1, beat.SerializeAsString(), &seed);
      tessera::v1::AdvanceClockRequest clock;
      clock.set_worker_id(w);
      clock.set_clock(1);
      clock.set_wait_timeout_ms(10);
      clock.set_step_samples(4);
      clock.set_step_busy_seconds(0.01);
      AppendRequest(4, clock.SerializeAsString(), &seed);
    }
    tessera::v1::ReportRequest report;
    report.set_worker_id(0);
    report.set_clock(1);
    report.set_has_eval(true);
    report.set_test_accuracy(0.5);
    report.set_device("cpu");
    AppendRequest(5, report.SerializeAsString(), &seed);
    AppendRequest(8, std::string(1, '\x0b'), &seed);
    tessera::v1::DoneRequest done;
    done.set_worker_id(2);
    AppendRequest(6, done.SerializeAsString(), &seed);
    Write(dir, "requests-mode" + std::to_string(mode), seed);
  }
}

void CheckpointSeeds(const std::string& dir) {
  tessera::v1::ShardCheckpoint shard;
  shard.set_server_id(0);
  const tessera::v1::ShardMap view = FuzzView(1);
  for (const auto& c : view.chunks()) {
    auto* state = shard.add_chunks();
    state->set_param(c.param());
    state->set_index(c.index());
    EncodeFloats(std::vector<float>(c.length(), 0.5f), state->mutable_values());
    EncodeFloats(std::vector<float>(c.length(), 0.0f), state->mutable_optimizer_state());
    state->set_version(3);
    for (int w = 0; w < kWorkers; ++w) state->add_applied_clocks(3);
  }
  for (int w = 0; w < kWorkers; ++w) shard.add_worker_incarnations(1);
  const std::string payload = shard.SerializeAsString();
  Write(dir, "payload", std::string(1, '\0') + payload);
  CheckpointHeader header;
  header.job = "fuzz";
  header.epoch = 1;
  header.clock = 3;
  Write(dir, "file", std::string(1, '\1') + EncodeCheckpoint(header, payload));
}

void JobSeeds(const std::string& dir) {
  for (uint8_t mode = 0; mode < 4; ++mode) {
    Write(dir, "job-mode" + std::to_string(mode), JobSpecToText(FuzzJob(mode)));
  }
  for (const auto& entry : std::filesystem::directory_iterator("deploy/jobs")) {
    std::ifstream in(entry.path());
    std::string text((std::istreambuf_iterator<char>(in)), {});
    Write(dir, entry.path().filename().string(), text);
  }
}

}  // namespace
}  // namespace tessera::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_corpus DIR (run from the repository root)" << std::endl;
    return 2;
  }
  const std::string root = argv[1];
  tessera::fuzz::JobSeeds(root + "/job_spec_fuzzer");
  tessera::fuzz::ShardStoreSeeds(root + "/shard_store_fuzzer");
  tessera::fuzz::SchedulerSeeds(root + "/scheduler_fuzzer");
  tessera::fuzz::CheckpointSeeds(root + "/checkpoint_fuzzer");
  return 0;
}
