#include "worker/data/dataset.h"

#include <zlib.h>

#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/base/status_macros.h"

namespace tessera {
namespace {

absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    std::string hint = absl::StartsWith(path, kFashionMnistDir)
                           ? absl::StrCat("; it is installed by Debian's ", kFashionMnistPackage,
                                          " package (apt-get install ", kFashionMnistPackage, ")")
                           : "; check the job's data paths";
    return absl::NotFoundError(absl::StrCat("data file ", path, " not found", hint));
  }
  gzFile file = gzopen(path.c_str(), "rb");  // reads plain files too
  if (file == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path));
  std::string data;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) data.append(buffer, n);
  const bool failed = n < 0;
  gzclose(file);
  if (failed) return absl::InvalidArgumentError(absl::StrCat(path, ": corrupt gzip data"));
  return data;
}

uint32_t BigEndian32(const std::string& data, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + offset);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path) {
  TESSERA_ASSIGN_OR_RETURN(std::string images, ReadMaybeGzip(images_path));
  TESSERA_ASSIGN_OR_RETURN(std::string labels, ReadMaybeGzip(labels_path));
  if (images.size() < 16 || BigEndian32(images, 0) != 2051) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": not an IDX image file (magic 2051)"));
  }
  if (labels.size() < 8 || BigEndian32(labels, 0) != 2049) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": not an IDX label file (magic 2049)"));
  }
  const int64_t count = BigEndian32(images, 4);
  const int64_t rows = BigEndian32(images, 8);
  const int64_t cols = BigEndian32(images, 12);
  if (BigEndian32(labels, 4) != count) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, " has ", BigEndian32(labels, 4), " labels but ",
                                                   images_path, " has ", count, " images"));
  }
  if (images.size() != static_cast<size_t>(16 + count * rows * cols) || labels.size() != static_cast<size_t>(8 + count)) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " or ", labels_path, " is truncated"));
  }
  Dataset data;
  data.features = static_cast<int>(rows * cols);
  data.x.resize(count * rows * cols);
  data.y.resize(count);
  int max_label = 0;
  for (int64_t i = 0; i < count * rows * cols; ++i) {
    data.x[i] = static_cast<float>(static_cast<unsigned char>(images[16 + i])) / 255.0f;
  }
  for (int64_t i = 0; i < count; ++i) {
    data.y[i] = static_cast<unsigned char>(labels[8 + i]);
    max_label = std::max(max_label, data.y[i]);
  }
  data.classes = std::max(10, max_label + 1);
  return data;
}

Dataset MakeSynthetic(int64_t examples, int features, int classes, uint64_t seed, bool train) {
  std::mt19937_64 centres_rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centres(static_cast<size_t>(classes) * features);
  for (float& c : centres) c = 0.3f * normal(centres_rng);  // overlapping classes: not trivially separable
  std::mt19937_64 rng(seed * 2 + (train ? 1 : 2));
  std::uniform_int_distribution<int> pick(0, classes - 1);
  Dataset data;
  data.features = features;
  data.classes = classes;
  data.x.resize(static_cast<size_t>(examples) * features);
  data.y.resize(examples);
  for (int64_t i = 0; i < examples; ++i) {
    const int label = pick(rng);
    data.y[i] = label;
    for (int f = 0; f < features; ++f) data.x[i * features + f] = centres[label * features + f] + normal(rng);
  }
  return data;
}

absl::StatusOr<Dataset> LoadSplit(const tessera::v1::DataSpec& spec, bool train, uint64_t seed) {
  if (spec.format() == tessera::v1::DataSpec::SYNTHETIC) {
    return MakeSynthetic(train ? spec.synthetic_train_examples() : spec.synthetic_test_examples(),
                         spec.synthetic_features(), spec.synthetic_classes(), seed, train);
  }
  return train ? LoadIdx(spec.train_images(), spec.train_labels()) : LoadIdx(spec.test_images(), spec.test_labels());
}

}  // namespace tessera
