// What a request from the wire may carry. Every size, count and string a daemon receives is checked against
// these before anything is allocated from it; SECURITY.md lists them.
#ifndef TESSERA_COMMON_MODEL_WIRE_LIMITS_H_
#define TESSERA_COMMON_MODEL_WIRE_LIMITS_H_

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "google/protobuf/message.h"

namespace tessera {

// Names: parameters, jobs, hosts, devices, stop reasons.
inline constexpr size_t kMaxNameBytes = 256;
// HOST:PORT addresses and file paths.
inline constexpr size_t kMaxAddressBytes = 1024;
// A server's UCX worker address in base64 (it names every transport and device of the host: a few hundred bytes
// on one NIC, more with several RDMA devices).
inline constexpr size_t kMaxFabricAddressBytes = 16384;
inline constexpr size_t kMaxPathBytes = 4096;
// Error messages a member sends (a worker's failure).
inline constexpr size_t kMaxErrorBytes = 4096;
// One parameter: at most 8 dimensions and 2^32 elements (16 GiB of float32).
inline constexpr int kMaxDimensions = 8;
inline constexpr int64_t kMaxParameterElements = int64_t{1} << 32;
// One job: at most 4096 parameters and 2^20 chunks.
inline constexpr int kMaxParameters = 4096;
// What one job may ask every worker to allocate: the widest layer, the whole model (float32 elements of all
// parameters: 4 GiB per copy, and a worker holds several), one step's activations (batch x width summed over
// the layers), the global batch, and a synthetic data set (examples x features).
inline constexpr int64_t kMaxLayerWidth = int64_t{1} << 20;
inline constexpr int64_t kMaxModelElements = int64_t{1} << 30;
inline constexpr int64_t kMaxActivationElements = int64_t{1} << 29;
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 20;
inline constexpr int64_t kMaxDatasetElements = int64_t{1} << 30;
inline constexpr int64_t kMaxChunks = int64_t{1} << 20;
// Clocks (steps) and shard-map epochs far beyond any job's; a larger one is a forgery or a bug.
inline constexpr int64_t kMaxClock = int64_t{1} << 40;
// Ids in one request for rows of an embedding table.
inline constexpr int64_t kMaxRowsPerRequest = int64_t{1} << 21;
inline constexpr uint64_t kMaxEpoch = uint64_t{1} << 40;
// A member slot's incarnations (one per registration of a process for it): a larger one is a forgery. A slot
// that reached it takes no one more (nothing wraps).
inline constexpr uint64_t kMaxIncarnation = uint64_t{1} << 40;
// A chunk's version and its counts of updates and assignments, and a worker's push sequence numbers: at most one
// per push, so far beyond any job's (2^48 pushes). A larger one is a forgery; nothing near it can overflow.
inline constexpr int64_t kMaxUpdateCount = int64_t{1} << 48;
// A push's learning-rate factor (PushRequest.lr_factor): a schedule's multiple of the job's rate.
inline constexpr float kMaxLrFactor = 1e6f;
// The longest any call may ask to wait (a clock gate, a checkpoint at a version).
inline constexpr absl::Duration kMaxWait = absl::Hours(1);
// Checkpoint files one AssignShards may name (one per server).
inline constexpr int kMaxRestoreFiles = 4096;

// The element count of `shape`, or INVALID_ARGUMENT naming `what` when a dimension is not positive, there are
// too many dimensions, or the product exceeds kMaxParameterElements (checked without overflowing).
[[nodiscard]] absl::StatusOr<int64_t> CheckedElements(absl::Span<const int64_t> shape, absl::string_view what);

// INVALID_ARGUMENT naming `field` when `value` is longer than `limit` bytes.
[[nodiscard]] absl::Status CheckLength(absl::string_view field, absl::string_view value, size_t limit);

// INVALID_ARGUMENT naming the field when any enum field of `message` (nested messages included) holds a value
// its enum does not define (proto3 keeps unknown numbers; Tessera refuses them).
[[nodiscard]] absl::Status CheckKnownEnums(const google::protobuf::Message& message);

// A wait the caller asked for in milliseconds: 0 means `fallback`; anything beyond kMaxWait is kMaxWait.
absl::Duration BoundedWait(uint64_t milliseconds, absl::Duration fallback);

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_WIRE_LIMITS_H_
