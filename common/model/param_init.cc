#include "common/model/param_init.h"

#include <cmath>

namespace tessera {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t HashName(std::string_view name) {  // FNV-1a: stable across builds and hosts
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

void FillInit(const tessera::v1::InitSpec& init, std::string_view name, int64_t offset, absl::Span<float> out) {
  if (init.kind() == tessera::v1::InitSpec::ZEROS) {
    for (float& v : out) v = 0.0f;
    return;
  }
  const uint64_t base = SplitMix64(init.seed() ^ HashName(name));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t bits = SplitMix64(base + static_cast<uint64_t>(offset) + i);
    const double u = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    out[i] = static_cast<float>((2.0 * u - 1.0) * init.scale());
  }
}

tessera::v1::InitSpec GlorotUniform(int64_t fan_in, int64_t fan_out, uint64_t seed) {
  tessera::v1::InitSpec init;
  init.set_kind(tessera::v1::InitSpec::UNIFORM);
  init.set_scale(static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out))));
  init.set_seed(seed);
  return init;
}

}  // namespace tessera
