// A server's requests for rows of embedding tables (ParameterSpec.embedding): what the dense path's Pull and Push
// (server/shard_store.h) are for chunks, for the hash slots of server/tables/sparse_table.h. The store owns one
// and hands it its state, buffers, counters and the shipper that answers a push once the backups hold it.
//
// Every id must be in a hash slot this server is primary of: NOT_FOUND otherwise, as for an unknown table; the
// epoch is checked as for chunks (server/request_checks.h). INVALID_ARGUMENT, changing nothing, for more than
// kMaxRowsPerRequest ids, a worker id outside the job, or (pushes) values of another length, non-finite values,
// or a bad seq, clock or batch size; UNAUTHENTICATED and FAILED_PRECONDITION as for a push of a chunk. A row never
// written reads its initial values.
#ifndef TESSERA_SERVER_ROW_REQUESTS_H_
#define TESSERA_SERVER_ROW_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/rpc/buffer_pool.h"
#include "proto/ps.pb.h"
#include "server/consistency/row_rounds.h"
#include "server/replication/replica_shipper.h"
#include "server/store_counters.h"
#include "server/store_state.h"

namespace tessera {

// The answer to a pull of rows: RowPullResponse.values, `bytes` of them in a pooled buffer, which the transports
// send as they are.
struct PulledRows {
  std::shared_ptr<const PooledBuffer> values;
  size_t bytes = 0;
};

// Thread-safe. The references must outlive it.
class RowRequests {
 public:
  RowRequests(StoreState& state, BufferPool& buffers, StoreCounters& counters, ReplicaShipper& shipper)
      : state_(state), buffers_(buffers), counters_(counters), shipper_(shipper) {}

  // `done` runs once answered: at once, or, in SYNC with backup workers, once the table's rounds before the pull's
  // clock are applied here (server/consistency/row_rounds.h).
  using PullDone = std::function<void(absl::StatusOr<PulledRows>)>;
  void Pull(std::shared_ptr<const tessera::v1::RowPullRequest> request, PullDone done) const;
  // Pull, waiting for its answer, as the message.
  [[nodiscard]] absl::StatusOr<tessera::v1::RowPullResponse> Pull(const tessera::v1::RowPullRequest& request) const;

  // Duplicate ids are summed first (common/base/row_batch.h). The job's consistency policy decides when the rows apply
  // (server/consistency/row_rounds.h): ASYNC and SSP on arrival; SYNC once per round, the batch-size-weighted mean
  // of the round's members, with the row's optimizer stepping once. RESOURCE_EXHAUSTED, changing nothing, when the
  // rows it would create do not fit the server's row memory. `done` runs once every backup of the slots holds the
  // update (SYNC with backup workers: once the push is collected in its round).
  using PushDone = std::function<void(absl::StatusOr<tessera::v1::RowPushResponse>)>;
  void Push(const tessera::v1::RowPushRequest& request, std::string_view member_key, PushDone done);

  // The applier the consistency policy hands row updates to, for requests found in view `epoch` on `server_id`
  // (also for the rounds of rows a new view or a round decision closes).
  RowApplier ApplierFor(int server_id, uint64_t epoch);
  // Answers what admitting rows or closing their rounds left: pushes (once the backups hold their update),
  // counters, and pulls that waited.
  void Finish(RowsTaken& taken);

 private:
  // The slots of a row request, each with the positions of its ids in the request.
  struct FoundRows {
    const RowTableSpec* spec = nullptr;
    const JobConfig* config = nullptr;
    std::shared_ptr<const Roster> roster;
    std::vector<std::pair<RowSlot*, std::vector<int64_t>>> slots;
    int server_id = -1;  // this server, and the view the slots were found in
    uint64_t epoch = 0;
  };
  // The slots of `ids` in `table` after checking the epoch and the worker id, or the error to answer with.
  absl::StatusOr<FoundRows> FindRows(uint64_t epoch, int worker, const std::string& table,
                                     absl::Span<const uint64_t> ids) const ABSL_LOCKS_EXCLUDED(state_.mu);
  // A row push's checks, its gradients checked finite and cut by slot, duplicates summed; the error to answer
  // with otherwise.
  absl::StatusOr<RowPush> CheckPush(const tessera::v1::RowPushRequest& request, std::string_view member_key,
                                    const FoundRows& found, const std::string& what) const;
  // Applies one update of rows (memory, eviction, the table's optimizer) to the slots `server_id` is primary of.
  RowUpdateResult Apply(const RowUpdate& update, int server_id, uint64_t epoch);

  StoreState& state_;
  BufferPool& buffers_;
  StoreCounters& counters_;
  ReplicaShipper& shipper_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_ROW_REQUESTS_H_
