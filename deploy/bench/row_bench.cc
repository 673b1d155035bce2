// Section s of tessera-bench: rows of embedding tables (ParameterSpec.embedding) between this process (a
// PsClient) and 1 and 2 real tessera-server processes over loopback, for each of --transports (gRPC, and UCX with
// trusted_network), at dim 16 and 64:
//   - rows pulled per second per server (PullRows of --row_batch distinct ids, every row created before by a
//     push, so each pull reads stored rows, none computed from the initialiser), and rows pushed per second per
//     server with their update (PushRows, row-wise AdaGrad), each the median of --row_repeats calls, against a
//     plain in-process hash map (absl::flat_hash_map from id to row) looking up the same rows and copying them
//     out, and applying the same update;
//   - bytes on the wire per row pushed (the servers' push_bytes over the rows), against the row's own values;
//   - the server's memory per row: its RSS growth while it creates --memory_rows rows of dim 16 with row-wise
//     AdaGrad, and the table's own count (TableStats.memory_bytes), against the row's values and state; in a job
//     without delta checkpoints and in one with them (where each row keeps a 4-byte version).
#include "deploy/bench/row_bench.h"

#include <grpcpp/grpcpp.h>

#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "gflags/gflags.h"
#include "proto/ps.grpc.pb.h"
#include "server/tables/row_optimizer.h"

DEFINE_int32(row_batch, 65536, "s: distinct ids per timed PullRows or PushRows");
DEFINE_int32(row_repeats, 7, "s: timed calls per measurement (the median is reported)");
DEFINE_int64(memory_rows, 8000000, "s: rows created for the memory-per-row measurement");

namespace tessera::bench {
namespace {

tessera::v1::ParameterSpec RowTableOf(int64_t dim) {
  tessera::v1::ParameterSpec p;
  p.set_name("rows");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(dim);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(0.01f);
  p.mutable_embedding()->mutable_optimizer()->set_kind(tessera::v1::RowOptimizerSpec::ROWWISE_ADAGRAD);
  p.mutable_embedding()->mutable_optimizer()->set_learning_rate(0.01f);
  return p;
}

// The servers' statistics of the table, summed.
struct Stats {
  int64_t push_bytes = 0;
  int64_t rows = 0;
  int64_t memory_bytes = 0;
  int64_t bytes = 0;
};

absl::StatusOr<Stats> ServerStats(const PsClient& client) {
  Stats total;
  for (const auto& server : client.shard_map()->servers()) {
    auto stub = tessera::v1::ParameterServer::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    tessera::v1::ServerStats stats;
    grpc::Status s = stub->GetStats(&context, tessera::v1::ServerStatsRequest(), &stats);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("stats of server ", server.id(), ": ", s.error_message()));
    total.push_bytes += stats.push_bytes();
    for (const auto& t : stats.tables()) {
      total.rows += t.rows();
      total.memory_bytes += t.memory_bytes();
      total.bytes += t.bytes();
    }
  }
  return total;
}

// The reference: the same rows in one absl::flat_hash_map of this process; rows per second of a lookup that
// copies each row out, and of the same row-wise AdaGrad update applied in place.
struct LocalRates {
  double pull = NAN;
  double push = NAN;
};

LocalRates MeasureLocal(const std::vector<uint64_t>& ids, int64_t dim) {
  RowOptimizerSpec spec;
  spec.kind = RowOptimizerSpec::Kind::kRowwiseAdagrad;
  const RowOptimizer optimizer(spec);
  const int64_t stride = dim + optimizer.StateFloats(dim);
  absl::flat_hash_map<uint64_t, std::vector<float>> rows;
  for (uint64_t id : ids) rows[id].assign(stride, 0.01f);
  std::vector<float> out(ids.size() * dim), grads(ids.size() * dim, 0.001f);
  std::vector<double> pulls, pushes;
  for (int r = 0; r < FLAGS_row_repeats; ++r) {
    auto start = Clock::now();
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<float>& row = rows.find(ids[i])->second;
      std::copy(row.begin(), row.begin() + dim, out.begin() + i * dim);
    }
    pulls.push_back(ids.size() / SecondsSince(start));
    start = Clock::now();
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<float>& row = rows.find(ids[i])->second;
      optimizer.Apply(absl::MakeSpan(row.data(), dim), absl::MakeSpan(row.data() + dim, stride - dim),
                      absl::MakeConstSpan(grads.data() + i * dim, dim), 1);
    }
    pushes.push_back(ids.size() / SecondsSince(start));
  }
  return {Median(pulls), Median(pushes)};
}

std::string RowsPerSecond(double rate) { return std::isfinite(rate) ? absl::StrFormat("%.2fM rows/s", rate / 1e6) : "n/a"; }

void RateRows(const Context& ctx, Table& table) {
  absl::StatusOr<std::vector<tessera::v1::Transport>> transports = Transports();
  if (!transports.ok()) {
    table.Failed("s", "rows pulled and pushed", transports.status());
    return;
  }
  std::vector<uint64_t> ids(FLAGS_row_batch);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i + 1) * 0x9E3779B97F4A7C15ULL;  // spread over every slot
  for (int64_t dim : {16, 64}) {
    const LocalRates local = MeasureLocal(ids, dim);
    for (tessera::v1::Transport transport : *transports) {
      for (int servers : {1, 2}) {
        const std::string label = absl::StrFormat("dim %d, %d server%s, %d distinct ids per call, %s", dim, servers,
                                                  servers == 1 ? "" : "s", FLAGS_row_batch, TransportLabel(transport));
        Progress("s: rows, " + label);
        JobSpec job = TransferJob("bench-rows", servers, 1 << 20, 0);
        SetTransport(transport, job);
        absl::StatusOr<std::unique_ptr<Cluster>> cluster =
            StartCluster(ctx, absl::StrCat("rows-", dim, "-", servers, "-", TransportLabel(transport)), job, 0, {});
        absl::StatusOr<std::unique_ptr<PsClient>> client =
            cluster.ok() ? ConnectClient(**cluster) : absl::StatusOr<std::unique_ptr<PsClient>>(cluster.status());
        absl::Status status = client.ok() ? (*client)->Declare({RowTableOf(dim)}) : client.status();
        std::vector<float> grads(ids.size() * dim, 0.001f), out(ids.size() * dim);
        // Untimed: every row is created first, so the timed pulls read stored rows.
        if (status.ok()) status = (*client)->PushRows("rows", ids, grads, 1).status();
        std::vector<double> pulls, pushes;
        for (int r = 0; status.ok() && r < FLAGS_row_repeats; ++r) {
          auto start = Clock::now();
          status = (*client)->PullRows("rows", ids, absl::MakeSpan(out));
          pulls.push_back(ids.size() / SecondsSince(start) / servers);
          if (!status.ok()) break;
          start = Clock::now();
          status = (*client)->PushRows("rows", ids, grads, 1).status();
          pushes.push_back(ids.size() / SecondsSince(start) / servers);
        }
        absl::StatusOr<Stats> stats = status.ok() ? ServerStats(**client) : absl::StatusOr<Stats>(status);
        if (!stats.ok()) {
          table.Failed("s", "rows pulled and pushed, " + label, stats.status());
          continue;
        }
        const double pull = Median(pulls), push = Median(pushes);
        // One client process drives every server: with 2 servers on 2 cores the client, not a server, is the limit.
        table.Add({"s", "rows pulled per second per server, " + label, RowsPerSecond(pull),
                   "in-process hash-map lookup of the same rows: " + RowsPerSecond(local.pull), Ratio(pull, local.pull),
                   dim == 16 ? ">= 1M rows/s" : "", "stored rows (created by an untimed push first)"});
        table.Add({"s", "rows pushed per second per server with their update (row-wise AdaGrad), " + label,
                   RowsPerSecond(push), "in-process lookup + the same update: " + RowsPerSecond(local.push),
                   Ratio(push, local.push), dim == 16 ? ">= 1M rows/s" : "", ""});
        const int64_t pushed_rows = static_cast<int64_t>(ids.size()) * (1 + static_cast<int64_t>(pushes.size()));
        const double per_row = static_cast<double>(stats->push_bytes) / pushed_rows;
        table.Add({"s", "bytes on the wire per row pushed, " + label, absl::StrFormat("%.1f B", per_row),
                   absl::StrFormat("the row's values: %d B", dim * 4), Ratio(per_row, dim * 4.0), "",
                   "gradient and id, as the servers count their payload"});
        (*client)->Done().IgnoreError();
      }
    }
  }
}

// `delta_checkpoints`: the job writes delta checkpoints (checkpoint.full_every), so each row keeps its version.
void MemoryRows(const Context& ctx, Table& table, bool delta_checkpoints) {
  constexpr int64_t kDim = 16;
  const std::string what =
      absl::StrFormat("server memory per row, %d rows of dim %d, row-wise AdaGrad, 1 server, %s", FLAGS_memory_rows,
                      kDim, delta_checkpoints ? "with delta checkpoints (rows keep versions)" : "no delta checkpoints");
  Progress("s: " + what);
  JobSpec job = TransferJob("bench-row-memory", 1, 1 << 20, 0);
  if (delta_checkpoints) job.mutable_checkpoint()->set_full_every(5);
  absl::StatusOr<std::unique_ptr<Cluster>> cluster =
      StartCluster(ctx, delta_checkpoints ? "rows-memory-delta" : "rows-memory", job, 0, {});
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      cluster.ok() ? ConnectClient(**cluster) : absl::StatusOr<std::unique_ptr<PsClient>>(cluster.status());
  absl::Status status = client.ok() ? (*client)->Declare({RowTableOf(kDim)}) : client.status();
  int64_t before = -1;
  if (status.ok()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    before = ProcStatusBytes((*cluster)->servers[0]->pid(), "VmRSS");
  }
  const int64_t batch = 1 << 16;
  std::vector<uint64_t> ids(batch);
  std::vector<float> grads(batch * kDim, 0.001f);
  for (int64_t done = 0; status.ok() && done < FLAGS_memory_rows; done += batch) {
    for (int64_t i = 0; i < batch; ++i) ids[i] = static_cast<uint64_t>(done + i + 1) * 0x9E3779B97F4A7C15ULL;
    status = (*client)->PushRows("rows", ids, grads, 1).status();
  }
  absl::StatusOr<Stats> stats = status.ok() ? ServerStats(**client) : absl::StatusOr<Stats>(status);
  if (!stats.ok()) {
    table.Failed("s", what, stats.status());
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t after = ProcStatusBytes((*cluster)->servers[0]->pid(), "VmRSS");
  const double held = static_cast<double>(stats->bytes) / stats->rows;  // values and state
  const double rss_per_row = static_cast<double>(after - before) / stats->rows;
  const double counted = static_cast<double>(stats->memory_bytes) / stats->rows;
  table.Add({"s", what + " (RSS growth)", absl::StrFormat("%.1f B", rss_per_row),
             absl::StrFormat("values + state: %.0f B", held), Ratio(rss_per_row, held), "<= 1.5x",
             absl::StrFormat("%d rows; the table's own count: %.1f B per row (%s)", stats->rows, counted,
                             Ratio(counted, held))});
  (*client)->Done().IgnoreError();
}

}  // namespace

void RowSection(const Context& ctx, Table& table) {
  RateRows(ctx, table);
  MemoryRows(ctx, table, /*delta_checkpoints=*/false);
  MemoryRows(ctx, table, /*delta_checkpoints=*/true);
}

}  // namespace tessera::bench
