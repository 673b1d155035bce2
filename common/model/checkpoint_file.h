// One checkpoint file: a header, then a protobuf message (proto/checkpoint.proto).
//
//   "TSRACKPT"                 8 bytes, magic
//   format version             u32 (kCheckpointFormatVersion)
//   epoch                      u64, the cluster view's epoch at the checkpoint
//   clock                      i64, the checkpoint's clock
//   payload length             u64
//   payload CRC-32C            u32
//   job name length, job name  u32, bytes
//   header CRC-32C             u32, over everything above
//   payload                    the serialised message
// Integers little-endian. Written to PATH.tmp, fsynced, renamed to PATH, and the folder fsynced, so a reader
// sees a whole file or none.
#ifndef TESSERA_COMMON_MODEL_CHECKPOINT_FILE_H_
#define TESSERA_COMMON_MODEL_CHECKPOINT_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace tessera {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

struct CheckpointHeader {
  std::string job;
  uint64_t epoch = 0;
  int64_t clock = 0;
};

// Writes `message` under `header` to `path` (see above). An error names the file and the step that failed.
[[nodiscard]] absl::Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                                               const google::protobuf::Message& message);

// The file's bytes: header, then `payload` (a serialised message).
std::string EncodeCheckpoint(const CheckpointHeader& header, std::string_view payload);

// DecodeCheckpoint for the bytes of `path`, which names the file in errors.
[[nodiscard]] absl::StatusOr<CheckpointHeader> DecodeCheckpoint(std::string_view bytes, const std::string& path,
                                                                google::protobuf::Message* message);

// Reads `path` into `message` and returns its header. DATA_LOSS naming the file and the check that failed
// (magic, format version, header CRC, length, payload CRC, parse); NOT_FOUND when it does not exist.
[[nodiscard]] absl::StatusOr<CheckpointHeader> ReadCheckpointFile(const std::string& path,
                                                                  google::protobuf::Message* message);

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_CHECKPOINT_FILE_H_
