#include "worker/param_file.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status WriteParamFile(const std::string& path, const NamedTensors& tensors) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    for (const auto& [name, values] : tensors) {
      const uint32_t name_size = static_cast<uint32_t>(name.size());
      const uint64_t count = values.size();
      out.write(reinterpret_cast<const char*>(&name_size), sizeof(name_size));
      out.write(name.data(), name.size());
      out.write(reinterpret_cast<const char*>(&count), sizeof(count));
      out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(count * sizeof(float)));
    }
    if (!out) return absl::DataLossError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::DataLossError(absl::StrCat("cannot rename to ", path));
  return absl::OkStatus();
}

absl::StatusOr<NamedTensors> ReadParamFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  NamedTensors tensors;
  uint32_t name_size = 0;
  while (in.read(reinterpret_cast<char*>(&name_size), sizeof(name_size))) {
    if (name_size > 4096) return absl::InvalidArgumentError(absl::StrCat(path, ": corrupt (name length)"));
    std::string name(name_size, '\0');
    uint64_t count = 0;
    in.read(name.data(), name_size);
    in.read(reinterpret_cast<char*>(&count), sizeof(count));
    if (!in || count > (1ULL << 32)) return absl::InvalidArgumentError(absl::StrCat(path, ": corrupt (count)"));
    std::vector<float> values(count);
    in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(float)));
    if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": truncated in '", name, "'"));
    tensors[name] = std::move(values);
  }
  return tensors;
}

absl::StatusOr<double> RelativeError(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return absl::InvalidArgumentError("different numbers of tensors");
  double diff = 0, norm = 0;
  for (const auto& [name, vb] : b) {
    auto it = a.find(name);
    if (it == a.end()) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' missing"));
    if (it->second.size() != vb.size()) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' size"));
    for (size_t i = 0; i < vb.size(); ++i) {
      const double d = static_cast<double>(it->second[i]) - vb[i];
      diff += d * d;
      norm += static_cast<double>(vb[i]) * vb[i];
    }
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

}  // namespace tessera
