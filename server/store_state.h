// What a server holds from the views it adopted, shared by the store (server/shard_store.h), the adoption of a
// new view (server/view_adoption.h) and replication (server/replication/): one lock, `mu`, guards it all. A
// request holds it shared while it finds its unit (then takes the unit's own lock); adopting a view holds it
// exclusively.
#ifndef TESSERA_SERVER_STORE_STATE_H_
#define TESSERA_SERVER_STORE_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/cluster.pb.h"
#include "server/job_config.h"
#include "server/tables/chunk.h"
#include "server/tables/dense_table.h"
#include "server/tables/sparse_table.h"

namespace tessera {

// A server of the view, as this one reaches and checks it.
struct Peer {
  std::string address;
  std::string replication_key;  // X25519 public key: the key its Replicate calls and this server's share
  uint64_t incarnation = 0;
};

// The answer to a request, an exchange or a caller waiting on backups for a unit that left this server, was
// demoted or was restored (view `epoch`): ask again where the view says.
absl::Status MovedAway(uint64_t epoch);

struct StoreState {
  explicit StoreState(int64_t row_memory_cap_bytes = 0) : row_memory(row_memory_cap_bytes) {}

  mutable absl::Mutex mu;
  int server_id ABSL_GUARDED_BY(mu) = -1;  // set by the first view
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  tessera::v1::ShardMap view ABSL_GUARDED_BY(mu);  // the last view adopted
  std::unique_ptr<const JobConfig> config ABSL_GUARDED_BY(mu);
  std::shared_ptr<const Roster> roster ABSL_GUARDED_BY(mu);
  std::map<int, Peer> peers ABSL_GUARDED_BY(mu);  // the view's servers, by id
  RowMemory row_memory;  // the rows' budget (thread-safe on its own)
  DenseTable dense ABSL_GUARDED_BY(mu);
  SparseTable sparse ABSL_GUARDED_BY(mu){&row_memory};

  // Every table, for what works on any kind.
  std::vector<Table*> tables() ABSL_SHARED_LOCKS_REQUIRED(mu) { return {&dense, &sparse}; }
  std::vector<const Table*> tables() const ABSL_SHARED_LOCKS_REQUIRED(mu) { return {&dense, &sparse}; }
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_STATE_H_
