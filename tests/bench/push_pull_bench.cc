// Push and pull throughput of one worker against 2 in-process servers over loopback gRPC, for several
// chunk_bytes, beside memcpy of the same bytes in the same run. A benchmark: it prints figures, asserts nothing.
//
//   build/bin/push_pull_bench [MiB=16] [repeats=10]
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "tests/cluster/mini_cluster.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const int mib = argc > 1 ? std::atoi(argv[1]) : 16;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 10;
  const size_t n = static_cast<size_t>(mib) * (1 << 20) / sizeof(float);
  const double bytes = static_cast<double>(n * sizeof(float));

  std::vector<float> a(n, 1.0f), b(n);
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) std::memcpy(b.data(), a.data(), bytes);
  const double memcpy_gbs = bytes * repeats / Seconds(start) / 1e9;

  std::cout << absl::StrFormat("%d MiB tensor, 2 servers, 1 worker, %d repeats; memcpy %.2f GB/s\n", mib, repeats,
                               memcpy_gbs);
  std::cout << "| chunk_bytes | chunks | pull GB/s | push GB/s | pull / memcpy |\n|---|---|---|---|---|\n";
  for (int64_t chunk : {16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}) {
    tessera::v1::JobSpec job =
        tessera::testing::TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1);
    job.set_chunk_bytes(chunk);
    job.mutable_optimizer()->set_learning_rate(1e-6f);
    auto cluster = tessera::testing::MiniCluster::Start(job);
    if (!cluster.ok()) {
      std::cerr << cluster.status() << std::endl;
      return 1;
    }
    auto client = (*cluster)->ConnectClient();
    tessera::v1::ParameterSpec p;
    p.set_name("w");
    p.set_dtype(tessera::v1::DT_FLOAT32);
    p.add_shape(static_cast<int64_t>(n));
    if (!client.ok() || !(*client)->Declare({p}).ok()) {
      std::cerr << "cannot set up the cluster" << std::endl;
      return 1;
    }
    auto& c = **client;
    if (!c.Pull({"w"}, {absl::MakeSpan(b)}).ok()) return 1;  // warm-up: connections, allocations
    start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      if (!c.Pull({"w"}, {absl::MakeSpan(b)}).ok()) return 1;
    }
    const double pull_gbs = bytes * repeats / Seconds(start) / 1e9;
    start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      if (!c.Push({"w"}, {absl::MakeConstSpan(a)}, 1).ok()) return 1;
    }
    const double push_gbs = bytes * repeats / Seconds(start) / 1e9;
    std::cout << absl::StrFormat("| %d | %d | %.2f | %.2f | %.3f |\n", chunk, c.shard_map()->chunks_size(), pull_gbs,
                                 push_gbs, pull_gbs / memcpy_gbs);
  }
  return 0;
}
