#include "common/model/shard_map.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/base/tensor_codec.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "google/protobuf/util/message_differencer.h"

namespace tessera {

using tessera::v1::ChunkPlacement;
using tessera::v1::ParameterSpec;
using tessera::v1::ShardMap;

namespace {
// Largest first onto the least-loaded server (ties: lowest id) keeps servers within one chunk of each other.
void AssignToLeastLoaded(std::vector<ChunkPlacement*> chunks, std::map<int, int64_t> load) {
  std::stable_sort(chunks.begin(), chunks.end(),
                   [](const ChunkPlacement* a, const ChunkPlacement* b) { return a->length() > b->length(); });
  for (ChunkPlacement* c : chunks) {
    auto least = std::min_element(load.begin(), load.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    c->set_server_id(least->first);
    least->second += c->length() * 4;
  }
}
}  // namespace

int EmbeddingSlots(const ParameterSpec& spec) {
  return spec.embedding().slots() > 0 ? spec.embedding().slots() : kDefaultEmbeddingSlots;
}

int EmbeddingSlot(uint64_t id, int slots) {
  // A mix of the id's bits first: ids drawn in runs or with a common stride still spread over the slots.
  uint64_t x = id + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<int>(x % static_cast<uint64_t>(slots));
}

absl::Status CheckEmbeddingSpec(const ParameterSpec& spec) {
  const tessera::v1::EmbeddingSpec& e = spec.embedding();
  const std::string what = absl::StrCat("embedding table '", spec.name().substr(0, kMaxNameBytes), "'");
  if (spec.shape_size() != 1 || spec.shape(0) < 1 || spec.shape(0) > kMaxLayerWidth) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape must be [dim] with dim in 1 .. ", kMaxLayerWidth));
  }
  if (e.slots() < 0 || e.slots() > kMaxEmbeddingSlots) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": slots ", e.slots(), " is not within 1 .. ",
                                                   kMaxEmbeddingSlots, " (0: ", kDefaultEmbeddingSlots, ")"));
  }
  if (e.admit_after() < 0 || e.expire_after_steps() < 0 || e.expire_after_steps() > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": admit_after ", e.admit_after(), " and expire_after_steps ",
                                                   e.expire_after_steps(), " may not be negative"));
  }
  const tessera::v1::RowOptimizerSpec& o = e.optimizer();
  for (auto [name, value] : {std::pair<const char*, float>{"learning_rate", o.learning_rate()},
                             {"epsilon", o.epsilon()},
                             {"initial_accumulator", o.initial_accumulator()},
                             {"ftrl_beta", o.ftrl_beta()},
                             {"l1", o.l1()},
                             {"l2", o.l2()},
                             {"beta1", o.beta1()},
                             {"beta2", o.beta2()}}) {
    const bool beta = name[0] == 'b';
    if (!std::isfinite(value) || value < 0 || (beta && value >= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": optimizer.", name, " ", value, " must be ",
                                                     beta ? "in [0, 1)" : "finite and not negative"));
    }
  }
  return absl::OkStatus();
}

std::map<int, int64_t> BytesPerServer(const ShardMap& map) {
  std::map<int, int64_t> bytes;
  for (const auto& server : map.servers()) bytes[server.id()] = 0;
  for (const auto& chunk : map.chunks()) bytes[chunk.server_id()] += chunk.length() * 4;
  return bytes;
}

std::vector<ChunkPlacement> FillBackups(int backups, ShardMap& map) {
  // Bytes of every copy (primary or backup) per live server.
  std::map<int, int64_t> copies;
  for (const auto& server : map.servers()) copies[server.id()] = 0;
  for (const auto& c : map.chunks()) {
    if (auto it = copies.find(c.server_id()); it != copies.end()) it->second += c.length() * 4;
    for (int b : c.backup_server_ids()) {
      if (auto it = copies.find(b); it != copies.end()) it->second += c.length() * 4;
    }
  }
  std::vector<ChunkPlacement*> short_of;
  for (ChunkPlacement& c : *map.mutable_chunks()) {
    if (c.backup_server_ids_size() < backups) short_of.push_back(&c);
  }
  // Largest first, as primaries are placed.
  std::stable_sort(short_of.begin(), short_of.end(),
                   [](const ChunkPlacement* a, const ChunkPlacement* b) { return a->length() > b->length(); });
  std::vector<ChunkPlacement> given;
  for (ChunkPlacement* c : short_of) {
    bool any = false;
    while (c->backup_server_ids_size() < backups) {
      auto holds = [&](int id) {
        return id == c->server_id() ||
               std::find(c->backup_server_ids().begin(), c->backup_server_ids().end(), id) !=
                   c->backup_server_ids().end();
      };
      auto least = copies.end();
      for (auto it = copies.begin(); it != copies.end(); ++it) {
        if (!holds(it->first) && (least == copies.end() || it->second < least->second)) least = it;
      }
      if (least == copies.end()) break;  // every live server holds a copy already
      c->add_backup_server_ids(least->first);
      least->second += c->length() * 4;
      any = true;
    }
    if (any) given.push_back(*c);
  }
  return given;
}

namespace {

// Each parameter's name, kind and shape; its element count into `elements` and, for an embedding table, its slot
// count into `slots`.
absl::Status CheckParameters(const tessera::v1::ShardMap& map, std::map<std::string_view, int64_t>& elements,
                             std::map<std::string_view, int>& slots) {
  for (const auto& p : map.params()) {
    TESSERA_RETURN_IF_ERROR(CheckLength("parameter name", p.name(), kMaxNameBytes));
    TESSERA_RETURN_IF_ERROR(CheckKnownEnums(p));
    if (p.dtype() != tessera::v1::DT_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name(), "': only float32 is supported"));
    }
    TESSERA_ASSIGN_OR_RETURN(elements[p.name()], CheckedElements(p.shape(), absl::StrCat("parameter '", p.name(), "'")));
    if (p.has_embedding()) {
      TESSERA_RETURN_IF_ERROR(CheckEmbeddingSpec(p));
      slots[p.name()] = EmbeddingSlots(p);
    }
  }
  return absl::OkStatus();
}

// Each chunk (or embedding slot) within its parameter and the job's chunk size, its copies on distinct servers of
// the job.
absl::Status CheckChunks(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                         const std::map<std::string_view, int64_t>& elements,
                         const std::map<std::string_view, int>& slots) {
  const int64_t max_length = std::max<int64_t>(1, job.chunk_bytes() / 4);
  const int num_servers = job.cluster().num_servers();
  for (const auto& c : map.chunks()) {
    auto it = elements.find(c.param());
    if (it == elements.end()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map places chunk ", c.param().substr(0, kMaxNameBytes),
                                                     "/", c.index(), " but declares no such parameter"));
    }
    if (auto table = slots.find(c.param()); table != slots.end() &&
        (c.index() < 0 || c.index() >= table->second || c.offset() != 0 || c.length() != it->second)) {
      return absl::InvalidArgumentError(absl::StrCat("shard map slot ", c.param(), "/", c.index(), " (offset ",
                                                     c.offset(), ", length ", c.length(), ") is not one of the ",
                                                     table->second, " slots of its embedding table"));
    }
    if (c.index() < 0 || c.length() <= 0 || c.length() > max_length || c.offset() < 0 ||
        c.offset() > it->second - c.length()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map chunk ", c.param(), "/", c.index(), " (offset ",
                                                     c.offset(), ", length ", c.length(), ") is not within the ",
                                                     it->second, " elements of its parameter in chunks of at most ",
                                                     max_length));
    }
    std::set<int> holders = {c.server_id()};
    for (int b : c.backup_server_ids()) {
      if (!holders.insert(b).second) {
        return absl::InvalidArgumentError(absl::StrCat("shard map chunk ", c.param(), "/", c.index(),
                                                       " has two copies on server ", b));
      }
    }
    if (*holders.begin() < 0 || *holders.rbegin() >= num_servers) {
      return absl::InvalidArgumentError(absl::StrCat("shard map chunk ", c.param(), "/", c.index(),
                                                     " has a copy on a server outside the job's ", num_servers));
    }
  }
  return absl::OkStatus();
}

// The servers and workers listed: ids within the job and listed once, keys, incarnations and addresses within
// bounds.
absl::Status CheckMembers(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job) {
  const int num_servers = job.cluster().num_servers();
  const int num_workers = job.cluster().num_workers();
  std::set<int> servers, workers;
  for (const auto& s : map.servers()) {
    if (s.id() < 0 || s.id() >= num_servers || !servers.insert(s.id()).second) {
      return absl::InvalidArgumentError(absl::StrCat("shard map lists server ", s.id(), " twice or outside the job"));
    }
    if (!s.key_digest().empty() && s.key_digest().size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat("server ", s.id(), ": a key digest is 32 bytes"));
    }
    if (!s.replication_key().empty() && s.replication_key().size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat("server ", s.id(), ": a replication key is 32 bytes"));
    }
    if (s.incarnation() > kMaxIncarnation) {
      return absl::InvalidArgumentError(absl::StrCat("server ", s.id(), " incarnation ", s.incarnation(),
                                                     " is beyond ", kMaxIncarnation));
    }
    TESSERA_RETURN_IF_ERROR(CheckLength("server address", s.address(), kMaxAddressBytes));
    TESSERA_RETURN_IF_ERROR(CheckLength("server fabric address", s.fabric_address(), kMaxFabricAddressBytes));
  }
  for (const auto& w : map.workers()) {
    if (w.id() < 0 || w.id() >= num_workers || !workers.insert(w.id()).second) {
      return absl::InvalidArgumentError(absl::StrCat("shard map lists worker ", w.id(), " twice or outside the job"));
    }
    if (!w.key_digest().empty() && w.key_digest().size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", w.id(), ": a key digest is 32 bytes"));
    }
    if (w.incarnation() > kMaxIncarnation || w.joined_clock() < 0 || w.joined_clock() > kMaxClock) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", w.id(), " incarnation ", w.incarnation(),
                                                     " joined at clock ", w.joined_clock(), ": at most ",
                                                     kMaxIncarnation, " and 0 .. ", kMaxClock));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateShardMap(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job) {
  TESSERA_RETURN_IF_ERROR(ValidateJobSpec(job));
  if (map.epoch() > kMaxEpoch) {
    return absl::InvalidArgumentError(absl::StrCat("shard map epoch ", map.epoch(), " is beyond ", kMaxEpoch));
  }
  if (map.params_size() > kMaxParameters || map.chunks_size() > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat("shard map with ", map.params_size(), " parameters and ",
                                                   map.chunks_size(), " chunks; at most ", kMaxParameters, " and ",
                                                   kMaxChunks));
  }
  std::map<std::string_view, int64_t> elements;
  std::map<std::string_view, int> slots;  // embedding tables
  TESSERA_RETURN_IF_ERROR(CheckParameters(map, elements, slots));
  TESSERA_RETURN_IF_ERROR(CheckChunks(map, job, elements, slots));
  TESSERA_RETURN_IF_ERROR(CheckMembers(map, job));
  TESSERA_RETURN_IF_ERROR(CheckLength("run id", map.run_id(), kMaxNameBytes));
  // Each rollback advances the epoch, so there are never more of them than epochs.
  if (map.rollback_generation() > kMaxEpoch || map.rollback_clock() < 0 || map.rollback_clock() > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrCat("shard map rollback ", map.rollback_generation(), " to clock ",
                                                   map.rollback_clock(), ": at most ", kMaxEpoch, " and 0 .. ",
                                                   kMaxClock));
  }
  return absl::OkStatus();
}

namespace {

// The parameters of `params` not declared in `map` yet, each checked (name, kind, shape, an embedding table's
// row within a chunk; one declared again must be declared as before), and the chunks they will take.
struct Fresh {
  std::vector<const ParameterSpec*> params;
  int64_t chunks = 0;
};
absl::StatusOr<Fresh> FreshParameters(const std::vector<ParameterSpec>& params, int64_t chunk_bytes,
                                      const ShardMap& map) {
  const int64_t max_elems = std::max<int64_t>(1, chunk_bytes / 4);
  Fresh fresh;
  for (const ParameterSpec& p : params) {
    if (p.name().empty()) return absl::InvalidArgumentError("parameter with an empty name");
    TESSERA_RETURN_IF_ERROR(CheckLength("parameter name", p.name(), kMaxNameBytes));
    if (p.dtype() != tessera::v1::DT_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name(), "': only float32 is supported"));
    }
    TESSERA_ASSIGN_OR_RETURN(const int64_t n, CheckedElements(p.shape(), absl::StrCat("parameter '", p.name(), "'")));
    auto existing = std::find_if(map.params().begin(), map.params().end(),
                                 [&](const ParameterSpec& q) { return q.name() == p.name(); });
    if (existing != map.params().end()) {
      if (!google::protobuf::util::MessageDifferencer::Equals(*existing, p)) {
        return absl::FailedPreconditionError(absl::StrCat("parameter '", p.name(), "' is already declared as shape ",
                                                          ShapeString(existing->shape()), "; now declared as ",
                                                          ShapeString(p.shape()), " (or with another init or kind)"));
      }
      continue;
    }
    if (std::any_of(fresh.params.begin(), fresh.params.end(),
                    [&](const ParameterSpec* q) { return q->name() == p.name(); })) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name(), "' declared twice in one call"));
    }
    if (p.has_embedding()) {
      TESSERA_RETURN_IF_ERROR(CheckEmbeddingSpec(p));
      if (p.shape(0) > max_elems) {
        return absl::InvalidArgumentError(absl::StrCat("embedding table '", p.name(), "': a row of ", p.shape(0),
                                                       " values is more than chunk_bytes (", chunk_bytes, ")"));
      }
    }
    fresh.params.push_back(&p);
    fresh.chunks += p.has_embedding() ? EmbeddingSlots(p) : (n + max_elems - 1) / max_elems;
  }
  return fresh;
}

// `p`'s chunks of at most `max_elems` values (their servers not chosen yet) into `chunks`, or, for an embedding
// table, its slots round the `servers` into `slots`.
void CutIntoChunks(const ParameterSpec& p, int64_t max_elems, const std::vector<int>& servers,
                   std::vector<ChunkPlacement>& chunks, std::vector<ChunkPlacement>& slots) {
  if (p.has_embedding()) {
    for (int s = 0; s < EmbeddingSlots(p); ++s) {
      ChunkPlacement c;
      c.set_param(p.name());
      c.set_index(s);
      c.set_offset(0);
      c.set_length(p.shape(0));
      c.set_server_id(servers[s % servers.size()]);
      slots.push_back(std::move(c));
    }
    return;
  }
  const int64_t n = NumElements(p.shape());
  const int64_t count = (n + max_elems - 1) / max_elems;
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t length = n / count + (i < n % count ? 1 : 0);
    ChunkPlacement c;
    c.set_param(p.name());
    c.set_index(static_cast<int>(i));
    c.set_offset(offset);
    c.set_length(length);
    chunks.push_back(c);
    offset += length;
  }
}

}  // namespace

absl::Status PlaceParameters(const std::vector<ParameterSpec>& params, int64_t chunk_bytes, ShardMap& map,
                             int backups) {
  if (map.servers_size() == 0) return absl::FailedPreconditionError("cannot place parameters: no servers");
  if (chunk_bytes < 4) return absl::InvalidArgumentError(absl::StrCat("chunk_bytes must be >= 4, got ", chunk_bytes));
  if (params.size() + map.params_size() > static_cast<size_t>(kMaxParameters)) {
    return absl::InvalidArgumentError(absl::StrCat("a job may declare at most ", kMaxParameters, " parameters; ",
                                                   params.size(), " more asked for"));
  }
  TESSERA_ASSIGN_OR_RETURN(const Fresh fresh, FreshParameters(params, chunk_bytes, map));
  const int64_t max_elems = std::max<int64_t>(1, chunk_bytes / 4);
  if (fresh.params.empty()) return absl::OkStatus();
  // Counted before any placement is made: a declaration too large for the job allocates nothing.
  if (fresh.chunks + map.chunks_size() > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat("the declared parameters make ", fresh.chunks + map.chunks_size(),
                                                   " chunks of at most ", max_elems * 4, " bytes; a job may have ",
                                                   kMaxChunks));
  }

  std::vector<ChunkPlacement> chunks;
  std::vector<ChunkPlacement> slots;  // of embedding tables: round the servers
  std::vector<int> servers;
  for (const auto& server : map.servers()) servers.push_back(server.id());
  std::sort(servers.begin(), servers.end());
  for (const ParameterSpec* p : fresh.params) {
    *map.add_params() = *p;
    CutIntoChunks(*p, max_elems, servers, chunks, slots);
  }
  std::vector<ChunkPlacement*> unplaced;
  for (ChunkPlacement& c : chunks) unplaced.push_back(&c);
  AssignToLeastLoaded(unplaced, BytesPerServer(map));
  for (ChunkPlacement& c : chunks) *map.add_chunks() = std::move(c);
  for (ChunkPlacement& c : slots) *map.add_chunks() = std::move(c);
  if (backups > 0) FillBackups(backups, map);
  map.set_epoch(map.epoch() + 1);
  return absl::OkStatus();
}

absl::StatusOr<ChunkMoves> MoveChunks(int from_server, ShardMap& map) {
  std::set<int> live;
  for (const auto& server : map.servers()) {
    if (server.id() != from_server) live.insert(server.id());
  }
  ChunkMoves moves;
  std::vector<ChunkPlacement*> moving;
  for (ChunkPlacement& c : *map.mutable_chunks()) {
    // Backups on servers that are gone are no copies any more.
    auto* backups = c.mutable_backup_server_ids();
    backups->erase(std::remove_if(backups->begin(), backups->end(), [&](int id) { return live.count(id) == 0; }),
                   backups->end());
    if (c.server_id() != from_server) continue;
    if (!backups->empty()) {
      c.set_server_id(backups->Get(0));
      backups->erase(backups->begin());
      moves.promoted.push_back(c);
    } else {
      moving.push_back(&c);
    }
  }
  if (!moving.empty()) {
    std::map<int, int64_t> load = BytesPerServer(map);
    load.erase(from_server);
    if (load.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("server ", from_server, "'s ", moving.size(), " chunks have no server left to move to"));
    }
    // Chunks of the lost server count in BytesPerServer only under its id, which is gone from `load`.
    AssignToLeastLoaded(moving, std::move(load));
    for (const ChunkPlacement* c : moving) moves.moved.push_back(*c);
  }
  map.set_epoch(map.epoch() + 1);
  return moves;
}

ShardMapIndex::ShardMapIndex(ShardMap map) : map_(std::move(map)) {
  for (int i = 0; i < map_.params_size(); ++i) param_index_[map_.params(i).name()] = i;
  for (int i = 0; i < map_.chunks_size(); ++i) chunks_by_param_[map_.chunks(i).param()].push_back(i);
  for (auto& [name, list] : chunks_by_param_) {
    std::sort(list.begin(), list.end(),
              [this](int a, int b) { return map_.chunks(a).offset() < map_.chunks(b).offset(); });
  }
}

absl::StatusOr<const ParameterSpec*> ShardMapIndex::Param(const std::string& name) const {
  absl::StatusOr<int> position = ParamPosition(name);
  if (!position.ok()) return position.status();
  return &map_.params(*position);
}

absl::StatusOr<int> ShardMapIndex::ParamPosition(const std::string& name) const {
  auto it = param_index_.find(name);
  if (it == param_index_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown parameter '", name, "' (shard map epoch ", map_.epoch(), ")"));
  }
  return static_cast<int>(it->second);
}

absl::StatusOr<std::vector<const ChunkPlacement*>> ShardMapIndex::Chunks(const std::string& name) const {
  auto it = chunks_by_param_.find(name);
  if (it == chunks_by_param_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown parameter '", name, "' (shard map epoch ", map_.epoch(), ")"));
  }
  std::vector<const ChunkPlacement*> out;
  for (int i : it->second) out.push_back(&map_.chunks(i));
  return out;
}

absl::StatusOr<std::string> ShardMapIndex::ServerAddress(int server_id) const {
  absl::StatusOr<const tessera::v1::ServerInfo*> server = Server(server_id);
  if (!server.ok()) return server.status();
  return (*server)->address();
}

absl::StatusOr<const tessera::v1::ServerInfo*> ShardMapIndex::Server(int server_id) const {
  for (const auto& s : map_.servers()) {
    if (s.id() == server_id) return &s;
  }
  return absl::NotFoundError(absl::StrCat("no server ", server_id, " in shard map epoch ", map_.epoch()));
}

}  // namespace tessera
