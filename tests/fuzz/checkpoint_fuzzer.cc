// Fuzzes the checkpoint reader: bytes as a checkpoint file (first input byte odd), or as the payload of a file
// with a correct header and CRCs (even), so that mutations reach the message parser and the restore past the
// checksums. A ShardCheckpoint that parses is restored into a ShardStore. Nothing may crash.
#include "common/model/checkpoint_file.h"
#include "proto/checkpoint.pb.h"
#include "server/shard_store.h"
#include "tests/fuzz/fuzz_jobs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string bytes;
  if (data[0] % 2 == 1) {
    bytes = std::string(rest);
  } else {
    tessera::CheckpointHeader header;
    header.job = "fuzz";
    header.epoch = 1;
    bytes = tessera::EncodeCheckpoint(header, rest);
  }
  tessera::v1::ShardCheckpoint shard;
  if (!tessera::DecodeCheckpoint(bytes, "fuzz.shard", &shard).ok()) return 0;
  // Restore it: every chunk of the view from the file, all of them again as a rollback.
  const tessera::v1::JobSpec job = tessera::fuzz::FuzzJob(data[0] / 2);
  std::vector<tessera::v1::ShardCheckpoint> files = {shard};
  tessera::ShardStore store;
  if (store.Assign(tessera::fuzz::FuzzView(1), job, 0, &files).ok()) {
    (void)store.Assign(tessera::fuzz::FuzzView(2), job, 0, &files, /*restore_all=*/true);
  }
  return 0;
}
