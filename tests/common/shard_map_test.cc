#include "common/model/shard_map.h"

#include <algorithm>
#include <set>

#include "common/model/param_init.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

tessera::v1::ParameterSpec Param(const std::string& name, std::vector<int64_t> shape) {
  tessera::v1::ParameterSpec p;
  p.set_name(name);
  p.set_dtype(tessera::v1::DT_FLOAT32);
  for (int64_t d : shape) p.add_shape(d);
  return p;
}

tessera::v1::ShardMap MapWithServers(int n) {
  tessera::v1::ShardMap map;
  for (int i = 0; i < n; ++i) {
    auto* s = map.add_servers();
    s->set_id(i);
    s->set_address("127.0.0.1:" + std::to_string(1000 + i));
  }
  return map;
}

std::vector<tessera::v1::ParameterSpec> MlpParams() {
  return {Param("layer0/weight", {784, 256}), Param("layer0/bias", {256}), Param("layer1/weight", {256, 128}),
          Param("layer1/bias", {128}),        Param("layer2/weight", {128, 10}), Param("layer2/bias", {10})};
}

TEST(ShardMapTest, MlpOnThreeServersIsBalancedWithinTenPercent) {
  tessera::v1::ShardMap map = MapWithServers(3);
  ASSERT_THAT(PlaceParameters(MlpParams(), 64 * 1024, map), IsOk());
  std::map<int, int64_t> bytes = BytesPerServer(map);
  ASSERT_EQ(bytes.size(), 3u);
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& [id, b] : bytes) {
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  EXPECT_LE(static_cast<double>(hi - lo) / hi, 0.10) << "bytes per server: " << lo << " .. " << hi;
  EXPECT_EQ(map.epoch(), 1u);
}

// Every chunk has its backups on servers holding no other copy of it, and copies are spread evenly.
TEST(ShardMapTest, BackupsAreOnServersWithoutAnotherCopyAndBalanced) {
  tessera::v1::ShardMap map = MapWithServers(4);
  ASSERT_THAT(PlaceParameters(MlpParams(), 64 * 1024, map, /*backups=*/2), IsOk());
  std::map<int, int64_t> copies;
  for (const auto& c : map.chunks()) {
    ASSERT_EQ(c.backup_server_ids_size(), 2) << c.param() << "/" << c.index();
    std::set<int> holders = {c.server_id(), c.backup_server_ids(0), c.backup_server_ids(1)};
    EXPECT_EQ(holders.size(), 3u) << c.param() << "/" << c.index() << ": two copies on one server";
    for (int id : holders) copies[id] += c.length() * 4;
  }
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& [id, b] : copies) {
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  EXPECT_LE(static_cast<double>(hi - lo) / hi, 0.10) << "bytes of copies per server: " << lo << " .. " << hi;
  // Two servers cannot hold three copies: the chunks stay one backup short.
  tessera::v1::ShardMap two = MapWithServers(2);
  ASSERT_THAT(PlaceParameters(MlpParams(), 64 * 1024, two, /*backups=*/2), IsOk());
  for (const auto& c : two.chunks()) EXPECT_EQ(c.backup_server_ids_size(), 1);
}

// A lost primary's chunks go to their first backup; a chunk with no live copy left is placed anew.
TEST(ShardMapTest, MovingALostServersChunksPromotesTheirBackups) {
  tessera::v1::ShardMap map = MapWithServers(3);
  ASSERT_THAT(PlaceParameters({Param("a", {1000})}, 400, map, /*backups=*/1), IsOk());
  std::map<int, int> backup_of;
  for (const auto& c : map.chunks()) backup_of[c.index()] = c.backup_server_ids(0);
  map.mutable_servers()->erase(map.mutable_servers()->begin() + 1);  // server 1 is gone
  absl::StatusOr<ChunkMoves> moves = MoveChunks(1, map);
  ASSERT_THAT(moves, IsOk());
  EXPECT_TRUE(moves->moved.empty());
  ASSERT_FALSE(moves->promoted.empty());
  for (const auto& c : moves->promoted) EXPECT_EQ(c.server_id(), backup_of[c.index()]);
  for (const auto& c : map.chunks()) {
    EXPECT_NE(c.server_id(), 1);
    for (int b : c.backup_server_ids()) EXPECT_NE(b, 1);
  }
  // Now server 0 goes too: its chunks backed up on 2 are promoted, those whose backup was on 1 are placed anew.
  size_t on_zero = 0;
  for (const auto& c : map.chunks()) on_zero += c.server_id() == 0;
  map.mutable_servers()->erase(map.mutable_servers()->begin());
  absl::StatusOr<ChunkMoves> again = MoveChunks(0, map);
  ASSERT_THAT(again, IsOk());
  for (const auto& c : map.chunks()) EXPECT_EQ(c.server_id(), 2);
  EXPECT_EQ(again->moved.size() + again->promoted.size(), on_zero);
  for (const auto& c : again->moved) EXPECT_EQ(c.backup_server_ids_size(), 0);
}

TEST(ShardMapTest, ChunksRespectChunkBytesAndCoverEachParameterContiguously) {
  tessera::v1::ShardMap map = MapWithServers(2);
  ASSERT_THAT(PlaceParameters(MlpParams(), 64 * 1024, map), IsOk());
  ShardMapIndex index(map);
  for (const auto& p : MlpParams()) {
    absl::StatusOr<std::vector<const tessera::v1::ChunkPlacement*>> chunks = index.Chunks(p.name());
    ASSERT_THAT(chunks, IsOk());
    int64_t next = 0;
    for (const auto* c : *chunks) {
      EXPECT_EQ(c->offset(), next);
      EXPECT_LE(c->length() * 4, 64 * 1024);
      next += c->length();
    }
    EXPECT_EQ(next, p.shape(0) * (p.shape_size() > 1 ? p.shape(1) : 1));
  }
  // 784 x 256 x 4 bytes = 784 KiB: the first weight spans both servers.
  std::set<int> servers;
  absl::StatusOr<std::vector<const tessera::v1::ChunkPlacement*>> w0 = index.Chunks("layer0/weight");
  ASSERT_THAT(w0, IsOk());
  for (const auto* c : *w0) servers.insert(c->server_id());
  EXPECT_EQ(servers.size(), 2u);
}

TEST(ShardMapTest, LaterDeclarationsKeepPlacedChunksAndAdvanceTheEpoch) {
  tessera::v1::ShardMap map = MapWithServers(2);
  ASSERT_THAT(PlaceParameters({Param("a", {1000})}, 1024, map), IsOk());
  const tessera::v1::ShardMap before = map;
  ASSERT_THAT(PlaceParameters({Param("a", {1000})}, 1024, map), IsOk());
  EXPECT_EQ(map.epoch(), 1u) << "re-declaring the same parameter changes nothing";
  ASSERT_THAT(PlaceParameters({Param("b", {10})}, 1024, map), IsOk());
  EXPECT_EQ(map.epoch(), 2u);
  for (int i = 0; i < before.chunks_size(); ++i) {
    EXPECT_EQ(map.chunks(i).server_id(), before.chunks(i).server_id());
  }
}

TEST(ShardMapTest, RejectsConflictingAndMalformedDeclarations) {
  tessera::v1::ShardMap map = MapWithServers(1);
  ASSERT_THAT(PlaceParameters({Param("a", {10})}, 1024, map), IsOk());
  EXPECT_THAT(PlaceParameters({Param("a", {11})}, 1024, map),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already declared as shape [10]"));
  EXPECT_THAT(PlaceParameters({Param("z", {0})}, 1024, map), StatusIs(absl::StatusCode::kInvalidArgument, "positive"));
  EXPECT_THAT(ShardMapIndex(map).Param("nope"), StatusIs(absl::StatusCode::kNotFound, "nope"));
}

TEST(ParamInitTest, ChunkedInitEqualsWholeTensorInit) {
  tessera::v1::InitSpec init = GlorotUniform(100, 50, 7);
  std::vector<float> whole(5000), part(1234);
  FillInit(init, "w", 0, absl::MakeSpan(whole));
  FillInit(init, "w", 1000, absl::MakeSpan(part));
  for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], whole[1000 + i]);
  const float bound = init.scale();
  EXPECT_TRUE(std::all_of(whole.begin(), whole.end(), [&](float v) { return std::abs(v) <= bound; }));
  EXPECT_NE(whole[0], whole[1]);
}

}  // namespace
}  // namespace tessera
