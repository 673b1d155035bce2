// The requests a server's store takes for one chunk, as domain structs (the service decodes them from the wire).
#ifndef TESSERA_SERVER_CHUNK_REQUESTS_H_
#define TESSERA_SERVER_CHUNK_REQUESTS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/model/wire_format.h"

namespace tessera {

// Which chunk, and under which shard-map epoch the sender addresses it.
struct ChunkAddress {
  uint64_t epoch = 0;
  std::string_view param;  // must outlive the call it is passed to
  int index = 0;
};

struct ChunkPull {
  ChunkAddress address;
  int64_t have_version = -1;  // the version the caller holds; its bytes are not sent again. -1: none
  int worker_id = 0;          // the caller's rank
  WirePrecision precision = tessera::v1::WireSpec::FP32;  // of the values answered
};

struct ChunkPush {
  ChunkAddress address;
  int worker_id = 0;
  uint64_t incarnation = 0;         // the sender's; a replaced incarnation's pushes are refused
  uint64_t seq = 0;                 // per worker, strictly increasing; a repeated seq is applied once
  int64_t clock = 0;                // the step the gradient belongs to
  int64_t read_clock_version = 0;   // clock_version of the values the gradient was computed on
  int batch_size = 0;               // weight in the sync mean
  bool assign = false;              // overwrite the values instead of applying a gradient
  float lr_factor = 1.0f;           // the worker's schedule's factor on the learning rate (PushRequest.lr_factor)
  bool skip = false;                // the worker skips this step (PushRequest.skip)
  bool norm_only = false;           // SYNC clipping: the gradient joins the chunk's norm round (PushRequest)
  std::string member_key;           // the worker's, from its registration (checked against the view's digest)
};

struct PushOutcome {
  int64_t version = 0;
  bool duplicate = false;
  bool late = false;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CHUNK_REQUESTS_H_
