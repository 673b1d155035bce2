// Fuzzes a server's request handling: a ShardStore given a valid view, then a sequence of requests from the
// wire (tests/fuzz/fuzz_input.h): AssignShards, Push, PushPull, Pull, DecideRounds, Checkpoint snapshots and an
// embedding table's PullRows and PushRows, as
// ServerService hands them over, and Replicate calls to a second store that backs up the first's chunks, either
// unsigned or signed by the primary's key (so that forged numbers reach the checks behind the signature).
// Nothing may crash, and no value may become non-finite.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "server/replica_auth.h"
#include "server/request_conversions.h"
#include "server/shard_store.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_jobs.h"

namespace tessera::fuzz {
namespace {

enum Operation : uint8_t {
  kAssign, kPush, kPushPull, kPull, kDecideRounds, kSnapshot, kReplicate, kPullRows, kPushRows, kOperations
};

// The replication key of every server of the view (the primary, server 0, and the backup, server 1), made once.
const std::shared_ptr<const ReplicaKey>& PrimaryKey() {
  static const auto* key = new std::shared_ptr<const ReplicaKey>(ReplicaKey::Generate()->release());
  return *key;
}

// The backup store is the primary of nothing; a hand-over it would make reaches nobody.
class NoPeers final : public ReplicaSender {
 public:
  void Send(const ReplicaTarget&, std::shared_ptr<const tessera::v1::ReplicateRequest>,
            std::function<void(absl::StatusOr<int64_t>)> done) override {
    done(absl::UnavailableError("no peers in the fuzzer"));
  }
};

// FuzzView with server 1 backing up every chunk of server 0, whose replication key is PrimaryKey's.
tessera::v1::ShardMap ReplicatedView() {
  tessera::v1::ShardMap map = FuzzView(1);
  for (auto& server : *map.mutable_servers()) server.set_replication_key(PrimaryKey()->public_key());
  for (auto& chunk : *map.mutable_chunks()) chunk.add_backup_server_ids(1);
  return map;
}

void CheckFinite(ShardStore& store) {
  absl::StatusOr<tessera::v1::ShardCheckpoint> all = store.Snapshot(-1, absl::Now());
  if (!all.ok()) return;
  for (const auto& chunk : all->chunks()) {
    const size_t n = chunk.values().size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, chunk.values().data() + i * sizeof(float), sizeof(v));
      if (!std::isfinite(v)) __builtin_trap();
    }
  }
}

void Run(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const tessera::v1::JobSpec job = FuzzJob(data[0]);
  ShardStore store;
  if (!store.Assign(FuzzView(1), job, 0).ok()) __builtin_trap();
  tessera::v1::JobSpec replicated_job = job;
  replicated_job.mutable_replication()->set_backups(1);
  NoPeers no_peers;
  ShardStore backup(64 << 20, &no_peers, 0, PrimaryKey());
  if (absl::Status assigned = backup.Assign(ReplicatedView(), replicated_job, 1); !assigned.ok()) {
    fprintf(stderr, "the backup's view: %s\n", assigned.ToString().c_str());
    __builtin_trap();
  }
  RequestReader reader(data + 1, size - 1);
  uint8_t op = 0;
  std::string_view bytes;
  while (reader.Next(&op, &bytes)) {
    const bool with_key = (op & 0x80) != 0;  // the high bit: the request carries its worker's key
    switch ((op & 0x7f) % kOperations) {
      case kAssign: {
        tessera::v1::AssignShardsRequest r;
        if (r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
          (void)store.Assign(r.shard_map(), r.job(), r.server_id());
        }
        break;
      }
      case kPush:
      case kPushPull: {
        tessera::v1::PushRequest r;
        if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) break;
        absl::StatusOr<ChunkPush> push = ToChunkPush(r, with_key ? WorkerKey(r.worker_id()) : "");
        if (!push.ok()) break;
        // The values in whatever precision and layout the request claims (float32, 16-bit, top-k entries).
        SpanPayload payload(std::string_view(r.data()));
        payload.set_encoding(EncodingOf(r));
        if ((op & 0x7f) % kOperations == kPush) {
          (void)store.Push(*push, payload);
        } else {
          store.PushPull(*push, payload, std::make_shared<ExchangeWaiter>([](absl::StatusOr<ChunkValues>) {}));
        }
        break;
      }
      case kPull: {
        tessera::v1::PullRequest r;
        if (r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
          (void)store.Pull(ToChunkPull(r));
        }
        break;
      }
      case kDecideRounds: {
        tessera::v1::DecideRoundsRequest r;
        if (r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) (void)store.DecideRounds(r);
        break;
      }
      case kSnapshot:
        (void)store.Stats();
        CheckFinite(store);
        break;
      case kPullRows: {
        tessera::v1::RowPullRequest r;
        if (r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) (void)store.PullRows(r);
        break;
      }
      case kPushRows: {
        tessera::v1::RowPushRequest r;
        if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) break;
        store.PushRows(r, with_key ? WorkerKey(r.worker_id()) : "", [](absl::StatusOr<tessera::v1::RowPushResponse>) {});
        break;
      }
      case kReplicate: {
        tessera::v1::ReplicateRequest r;
        if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) break;
        // The high bit: with the primary's credential for this backup (server 1, incarnation 1).
        const std::string credential =
            with_key ? PrimaryKey()->Credential(PrimaryKey()->public_key(), 1, 1, r) : std::string();
        (void)backup.TakeReplica(r, credential);
        CheckFinite(backup);
        break;
      }
    }
  }
  CheckFinite(store);
  CheckFinite(backup);
  store.CancelWaiters(absl::CancelledError("end of input"));
  backup.CancelWaiters(absl::CancelledError("end of input"));
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::Run(data, size);
  return 0;
}
