#include "server/server.h"

#include "absl/strings/str_cat.h"
#include "common/daemon/metrics_page.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace tessera {

Server::Server(const ServerOptions& options) : options_(options) {}

namespace {
void AddTableMetrics(const tessera::v1::ServerStats& stats, const std::pair<std::string, std::string>& server,
                     MetricsPage& page);
}  // namespace

std::string ServerMetricsText(const tessera::v1::ServerStats& stats, int server_id) {
  const MetricLabels server = {{"server", server_id >= 0 ? absl::StrCat(server_id) : ""}};
  struct Single {
    const char* name;
    MetricsPage::Type type;
    const char* help;
    int64_t value;
  };
  const Single singles[] = {
      {"tessera_server_chunks", MetricsPage::kGauge, "Parameter chunks this server holds.", stats.chunks()},
      {"tessera_server_parameter_bytes", MetricsPage::kGauge, "Bytes of parameter values this server holds.",
       stats.bytes()},
      {"tessera_server_optimizer_state_bytes", MetricsPage::kGauge,
       "Bytes of optimizer state (momentum, Adam moments) beside the values.", stats.optimizer_bytes()},
      {"tessera_server_updates_applied_total", MetricsPage::kCounter, "Chunk updates applied.",
       stats.updates_applied()},
      {"tessera_server_pushes_total", MetricsPage::kCounter, "Gradient pushes received.", stats.pushes()},
      {"tessera_server_duplicate_pushes_total", MetricsPage::kCounter,
       "Pushes received again (a retry) and not applied twice.", stats.duplicate_pushes()},
      {"tessera_server_late_pushes_total", MetricsPage::kCounter, "Pushes for a round that had closed (dropped).",
       stats.late_pushes()},
      {"tessera_server_push_bytes_total", MetricsPage::kCounter, "Bytes of values pushed to this server.",
       stats.push_bytes()},
      {"tessera_server_backup_chunks", MetricsPage::kGauge, "Chunks this server holds a backup copy of.",
       stats.backup_chunks()},
      {"tessera_server_replica_bytes_sent_total", MetricsPage::kCounter,
       "Bytes of chunk state this server handed to the backups of its chunks.", stats.replica_bytes_sent()},
      {"tessera_server_replica_bytes_received_total", MetricsPage::kCounter,
       "Bytes of chunk state this server took as a backup.", stats.replica_bytes_received()},
  };
  MetricsPage page;
  for (const Single& m : singles) page.Family(m.name, m.type, m.help).Sample(static_cast<double>(m.value), server);
  page.Family("tessera_server_update_staleness_clocks", MetricsPage::kHistogram,
              "Staleness of each applied update: the pushing worker's clock minus the clock of the parameters it "
              "read.")
      .StalenessSeries(stats.staleness(), server);
  AddTableMetrics(stats, server[0], page);
  for (int w = 0; w < stats.worker_staleness_size(); ++w) {
    if (w == 0) {
      page.Family("tessera_server_worker_update_staleness_clocks", MetricsPage::kHistogram,
                  "Staleness of the updates of each worker.");
    }
    page.StalenessSeries(stats.worker_staleness(w), {server[0], {"worker", absl::StrCat(w)}});
  }
  return page.text();
}

namespace {

// The embedding tables' metrics, by table.
void AddTableMetrics(const tessera::v1::ServerStats& stats, const std::pair<std::string, std::string>& server,
                     MetricsPage& page) {
  const struct {
    const char* name;
    MetricsPage::Type type;
    const char* help;
    int64_t (tessera::v1::TableStats::*value)() const;
  } table_metrics[] = {
      {"tessera_server_table_rows", MetricsPage::kGauge, "Rows of an embedding table this server holds.",
       &tessera::v1::TableStats::rows},
      {"tessera_server_table_bytes", MetricsPage::kGauge, "Bytes of the rows' values and optimizer state.",
       &tessera::v1::TableStats::bytes},
      {"tessera_server_table_memory_bytes", MetricsPage::kGauge,
       "Memory the rows take, index and bookkeeping included.", &tessera::v1::TableStats::memory_bytes},
      {"tessera_server_table_rows_pulled_total", MetricsPage::kCounter, "Rows read.",
       &tessera::v1::TableStats::rows_pulled},
      {"tessera_server_table_rows_updated_total", MetricsPage::kCounter, "Row updates applied.",
       &tessera::v1::TableStats::rows_updated},
      {"tessera_server_table_rows_created_total", MetricsPage::kCounter, "Rows created by a first gradient.",
       &tessera::v1::TableStats::rows_created},
      {"tessera_server_table_rows_expired_total", MetricsPage::kCounter,
       "Rows removed after expire_after_steps clocks without a gradient.", &tessera::v1::TableStats::rows_expired},
      {"tessera_server_table_rows_evicted_total", MetricsPage::kCounter,
       "Rows removed to make room when the row memory was full (evict_when_full).",
       &tessera::v1::TableStats::rows_evicted},
      {"tessera_server_table_admission_refusals_total", MetricsPage::kCounter,
       "Gradients of ids not admitted yet (dropped).", &tessera::v1::TableStats::admission_refusals},
      {"tessera_server_table_pending_ids", MetricsPage::kGauge, "Ids counted for admission, not admitted yet.",
       &tessera::v1::TableStats::pending_ids},
  };
  for (const auto& m : table_metrics) {
    if (stats.tables_size() == 0) break;
    page.Family(m.name, m.type, m.help);
    for (const auto& t : stats.tables()) {
      page.Sample(static_cast<double>((t.*m.value)()), {server, {"table", t.table()}});
    }
  }
  for (int t = 0; t < stats.tables_size(); ++t) {
    if (t == 0) {
      page.Family("tessera_server_table_update_staleness_clocks", MetricsPage::kHistogram,
                  "Staleness of each slot update of an embedding table: the clocks the slot's newest update was "
                  "ahead of it.");
    }
    page.StalenessSeries(stats.tables(t).staleness(), {server, {"table", stats.tables(t).table()}});
  }
}

}  // namespace

Server::~Server() {
  if (heartbeater_) heartbeater_->Stop();
  grpc_.Shutdown(absl::Seconds(1));
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateServerOptions(options));
  std::unique_ptr<Server> server(new Server(options));
  Server* self = server.get();
  // Authenticates hand-overs between this server and its peers; the public half goes to the scheduler and into
  // the view.
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const ReplicaKey> key, ReplicaKey::Generate());
  server->replicas_ = std::make_unique<GrpcReplicaSender>(options.security, absl::Seconds(5), key);
  server->store_ = std::make_unique<ShardStore>(64 << 20, server->replicas_.get(),
                                                static_cast<int64_t>(options.max_row_memory_mb * (1 << 20)), key);
  server->updates_ = std::make_unique<ThreadPool>(options.update_threads);
  // Only the scheduler learns this key (from the registration below): control calls without it are refused.
  const std::string control_key = NewSecret();
  server->service_ = std::make_unique<ServerService>(server->store_.get(), server->updates_.get(),
                                                     options.inline_update_bytes, [self] { self->Stop(); },
                                                     options.security, control_key);
  TESSERA_ASSIGN_OR_RETURN(StartedServer started, StartGrpcServer(options.listen_host, options.port,
                                                                  {server->service_.get()}, *options.security));
  server->grpc_ = std::move(started);
  const std::string host = options.advertise_host.empty() ? options.listen_host : options.advertise_host;
  server->address_ = absl::StrCat(host, ":", server->grpc_.port);

  TESSERA_RETURN_IF_ERROR(server->StartEndpoints());
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::RegisterResponse registered,
                           server->Register(control_key, key->public_key()));
  server->StartHeartbeats(registered);
  return server;
}

absl::Status Server::StartEndpoints() {
  const ServerOptions& options = options_;
  if (options.http_port >= 0) {
    const ShardStore* store = store_.get();
    TESSERA_ASSIGN_OR_RETURN(
        http_, HttpEndpoint::Start(options.listen_host, options.http_port, *options.security,
                                   {{"/metrics", {"text/plain; version=0.0.4", [store, this] {
                                       return ServerMetricsText(store->Stats(), id());
                                     }}}}));
  }
  if (options.fabric) {
    absl::StatusOr<std::unique_ptr<FabricService>> fabric =
        FabricService::Start(store_.get(), updates_.get(), options.inline_update_bytes, options.security,
                             FabricOptions{options.fabric_spin_us, options.fabric_tcp});
    if (fabric.ok()) {
      fabric_ = *std::move(fabric);
    } else {
      LOG(WARNING) << "no UCX (jobs with transport UCX cannot use this server): " << fabric.status();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<tessera::v1::RegisterResponse> Server::Register(const std::string& control_key,
                                                               const std::string& replication_key) {
  const ServerOptions& options = options_;
  scheduler_ = std::make_unique<SchedulerClient>(options.scheduler_address, options.security);
  // A backup that does not take this server's hand-overs is reported at once (its loss is acted on before the
  // heartbeat timeout).
  store_->set_on_unreachable([this](int backup, uint64_t incarnation, const absl::Status& why) {
    if (absl::Status told = scheduler_->ReportServer(tessera::v1::SERVER, id(), backup, incarnation, why); !told.ok()) {
      LOG(WARNING) << "telling the scheduler that backup server " << backup << " does not answer: " << told;
    }
  });
  tessera::v1::RegisterRequest request;
  request.set_role(tessera::v1::SERVER);
  request.set_address(address_);
  if (fabric_) request.set_fabric_address(fabric_->address());
  request.set_control_key(control_key);
  request.set_replication_key(replication_key);
  if (options.id >= 0) request.set_requested_id(options.id);
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::RegisterResponse registered,
                           scheduler_->Register(request, absl::Seconds(options.connect_timeout_s)));
  id_ = registered.id();
  // A restarted scheduler takes the job's view back from its servers.
  scheduler_->EnableReturn([store = store_.get()](tessera::v1::MemberReturn& back) { *back.mutable_view() = store->view(); });
  if (fabric_ && registered.job().transport() != tessera::v1::UCX) {
    fabric_.reset();  // no unencrypted port stays open for a gRPC job
  }
  LOG(INFO) << "server " << id_ << " serving at " << address_ << " for job '" << registered.job().name()
            << "' of scheduler " << options.scheduler_address
            << (fabric_ ? (options.fabric_tcp ? "; UCX (with TCP)" : "; UCX (no TCP port)") : "")
            << (http_ ? absl::StrCat("; metrics at ", options.security->tls() ? "https" : "http", "://",
                                     options.listen_host, ":", http_->port(), "/metrics")
                      : "");
  return registered;
}

void Server::StartHeartbeats(const tessera::v1::RegisterResponse& registered) {
  heartbeater_ = scheduler_->StartHeartbeats(
      tessera::v1::SERVER, id(), registered.incarnation(), absl::Milliseconds(registered.heartbeat_interval_ms()),
      [this] { Stop(); },
      [this](const absl::Status& why) {
        Stop(absl::UnavailableError(
            absl::StrCat("lost the scheduler at ", options_.scheduler_address, ": ", why.message())));
      },
      // The scheduler's timeout when it says (every member gives up on it as it gives up on them).
      absl::Milliseconds(registered.heartbeat_timeout_ms() > 0 ? registered.heartbeat_timeout_ms()
                                                               : options_.heartbeat_timeout_ms));
}

absl::Status Server::Wait() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::optional<absl::Status>* reason) { return reason->has_value(); }, &stop_reason_));
  }
  if (heartbeater_) heartbeater_->Stop();
  store_->CancelWaiters(absl::UnavailableError(absl::StrCat("server ", id(), " is shutting down")));
  grpc_.Shutdown(absl::Seconds(2));
  absl::MutexLock lock(&mu_);
  return *stop_reason_;
}

void Server::Stop(absl::Status reason) {
  absl::MutexLock lock(&mu_);
  if (!stop_reason_) stop_reason_ = std::move(reason);
}

}  // namespace tessera
