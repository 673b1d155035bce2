// Deterministic parameter initialisation that does not depend on how a tensor is cut into chunks.
//
// Element i of a parameter is a pure function of (init.seed, parameter name, i), so a server can fill the chunk
// [offset, offset + n) it owns and get exactly the values a single process gets for the whole tensor.
#ifndef TESSERA_COMMON_MODEL_PARAM_INIT_H_
#define TESSERA_COMMON_MODEL_PARAM_INIT_H_

#include <cstdint>
#include <string_view>

#include "absl/types/span.h"
#include "proto/tensor.pb.h"

namespace tessera {

// Fills `out` with elements [offset, offset + out.size()) of parameter `name` initialised by `init`.
void FillInit(const tessera::v1::InitSpec& init, std::string_view name, int64_t offset, absl::Span<float> out);

// A uniform Glorot init for a [fan_in, fan_out] weight, seeded from `seed`.
tessera::v1::InitSpec GlorotUniform(int64_t fan_in, int64_t fan_out, uint64_t seed);

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_PARAM_INIT_H_
