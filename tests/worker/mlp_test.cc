#include "worker/models/mlp.h"

#include <cstring>
#include <random>

#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/backend/cpu_backend.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

// Finite differences (in float, so loose) against the analytic gradient, on a small network.
TEST(MlpTest, GradientsMatchFiniteDifferences) {
  CpuBackend backend;
  absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(&backend, {5, 7, 3}, /*seed=*/3, 8);
  ASSERT_THAT(mlp, IsOk());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> x(4 * 5);
  for (float& v : x) v = normal(rng);
  const std::vector<int32_t> y = {0, 2, 1, 2};
  ASSERT_THAT((*mlp)->ForwardBackward(x, y), IsOk());
  for (int p = 0; p < (*mlp)->num_parameters(); ++p) {
    const size_t n = (*mlp)->parameters()[p].shape(0) *
                     ((*mlp)->parameters()[p].shape_size() > 1 ? (*mlp)->parameters()[p].shape(1) : 1);
    std::vector<float> values(n), grad(n);
    ASSERT_THAT((*mlp)->GetParameter(p, absl::MakeSpan(values)), IsOk());
    ASSERT_THAT((*mlp)->GetGradient(p, absl::MakeSpan(grad)), IsOk());
    for (size_t i = 0; i < n; i += 3) {
      const float eps = 1e-2f;
      const float saved = values[i];
      values[i] = saved + eps;
      ASSERT_THAT((*mlp)->SetParameter(p, values), IsOk());
      const double plus = (*mlp)->Evaluate(x, y)->loss / 4;
      values[i] = saved - eps;
      ASSERT_THAT((*mlp)->SetParameter(p, values), IsOk());
      const double minus = (*mlp)->Evaluate(x, y)->loss / 4;
      values[i] = saved;
      ASSERT_THAT((*mlp)->SetParameter(p, values), IsOk());
      EXPECT_NEAR(grad[i], (plus - minus) / (2 * eps), 2e-3) << (*mlp)->parameters()[p].name() << "[" << i << "]";
    }
  }
}

TEST(MlpTest, ParametersAreNamedPerLayerWithGlorotWeightsAndZeroBiases) {
  CpuBackend backend;
  auto mlp = Mlp::Create(&backend, {784, 256, 128, 10}, 1, 64);
  ASSERT_THAT(mlp, IsOk());
  ASSERT_EQ((*mlp)->num_parameters(), 6);
  EXPECT_EQ((*mlp)->parameters()[0].name(), "layer0/weight");
  EXPECT_EQ((*mlp)->parameters()[5].name(), "layer2/bias");
  EXPECT_EQ((*mlp)->parameters()[0].init().kind(), tessera::v1::InitSpec::UNIFORM);
  EXPECT_EQ((*mlp)->parameters()[1].init().kind(), tessera::v1::InitSpec::ZEROS);
}

TEST(MlpTest, RejectsOversizedBatchesAndBadLabels) {
  CpuBackend backend;
  auto mlp = Mlp::Create(&backend, {2, 3}, 1, 2);
  ASSERT_THAT(mlp, IsOk());
  EXPECT_THAT((*mlp)->ForwardBackward(std::vector<float>(6), std::vector<int32_t>{0, 1, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "batch of 3"));
  EXPECT_THAT((*mlp)->ForwardBackward(std::vector<float>(2), std::vector<int32_t>{7}),
              StatusIs(absl::StatusCode::kInvalidArgument, "label 7"));
}

TEST(MlpTest, BackwardAnnouncesEachLayersFinalGradientsLastLayerFirst) {
  CpuBackend backend;
  auto mlp = Mlp::Create(&backend, {6, 5, 4, 3}, /*seed=*/2, 4);
  ASSERT_TRUE(mlp.ok());
  std::vector<float> x(4 * 6);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  std::vector<int32_t> y = {0, 1, 2, 1};
  std::vector<int> order;
  std::vector<std::vector<float>> announced((*mlp)->num_parameters());
  auto ready = [&](int layer) -> absl::Status {
    order.push_back(layer);
    for (int i : {2 * layer, 2 * layer + 1}) {
      announced[i].resize(NumElements((*mlp)->parameters()[i].shape()));
      TESSERA_RETURN_IF_ERROR((*mlp)->GetGradient(i, absl::MakeSpan(announced[i])));
    }
    return absl::OkStatus();
  };
  ASSERT_TRUE((*mlp)->ForwardBackward(x, y, ready).ok());
  EXPECT_EQ(order, (std::vector<int>{2, 1, 0}));
  for (int i = 0; i < (*mlp)->num_parameters(); ++i) {
    std::vector<float> final_grad(announced[i].size());
    ASSERT_TRUE((*mlp)->GetGradient(i, absl::MakeSpan(final_grad)).ok());
    EXPECT_EQ(announced[i], final_grad) << "parameter " << i << " changed after it was announced";
  }
  // A started download of a gradient holds the same values once waited for (the CPU copies at once).
  std::vector<float> started(announced[0].size());
  auto download = (*mlp)->StartGradientDownload(0, 0, absl::MakeSpan(started));
  ASSERT_TRUE(download.ok());
  EXPECT_TRUE((*download)->Ready());
  ASSERT_TRUE((*download)->Wait().ok());
  EXPECT_EQ(started, announced[0]);
  EXPECT_EQ((*mlp)->StartGradientDownload(99, 0, absl::MakeSpan(started)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A part of it from an offset (a block of rows on a GPU), and nothing beyond its end.
  std::vector<float> part(announced[0].size() - 5);
  auto part_download = (*mlp)->StartGradientDownload(0, 5, absl::MakeSpan(part).first(part.size() - 2));
  ASSERT_TRUE(part_download.ok() && (*part_download)->Wait().ok());
  EXPECT_EQ(std::vector<float>(part.begin(), part.end() - 2),
            std::vector<float>(announced[0].begin() + 5, announced[0].end() - 2));
  EXPECT_EQ((*mlp)->StartGradientDownload(0, 6, absl::MakeSpan(part)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An error from the callback stops backward and is returned.
  EXPECT_EQ((*mlp)->ForwardBackward(x, y, [](int) { return absl::AbortedError("stop"); }).status().code(),
            absl::StatusCode::kAborted);
}

// With gradient blocks, backward computes each weight gradient a block of rows at a time and announces each
// block but the last before the layer: the gradients are the same bit for bit as the whole layer's, and an
// announced block does not change afterwards.
TEST(MlpTest, WeightGradientsInBlocksEqualTheWholeLayersBitForBitAndAreAnnouncedInOrder) {
  CpuBackend backend;
  const std::vector<int> sizes = {37, 29, 16, 3};
  auto whole = Mlp::Create(&backend, sizes, /*seed=*/5, 8);
  auto blocked = Mlp::Create(&backend, sizes, /*seed=*/5, 8);
  ASSERT_TRUE(whole.ok() && blocked.ok());
  (*blocked)->set_gradient_block(100);  // 3 rows of layer 0 (29 columns), 6 of layer 1 (16), all of layer 2
  EXPECT_EQ((*blocked)->WeightGradientBlocks(0).size(), 13u);  // 37 rows in blocks of 3
  EXPECT_EQ((*blocked)->WeightGradientBlocks(0).back(), 37u * 29);
  EXPECT_EQ((*blocked)->WeightGradientBlocks(2), (std::vector<size_t>{16 * 3}));
  EXPECT_EQ((*whole)->WeightGradientBlocks(0), (std::vector<size_t>{37 * 29}));
  std::vector<float> x(8 * 37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.05f * static_cast<float>(i % 11) - 0.2f;
  std::vector<int32_t> y = {0, 1, 2, 1, 0, 2, 2, 1};
  std::vector<std::pair<int, size_t>> parts;
  std::vector<int> layers;
  std::vector<std::vector<float>> announced;
  auto part = [&](int index, size_t values) -> absl::Status {
    if (!layers.empty() && layers.back() == index / 2) return absl::InternalError("a part after its layer");
    parts.emplace_back(index, values);
    announced.emplace_back((*blocked)->HostGradient(index).begin(),
                           (*blocked)->HostGradient(index).begin() + values);
    return absl::OkStatus();
  };
  ASSERT_TRUE((*whole)->ForwardBackward(x, y).ok());
  ASSERT_TRUE((*blocked)->ForwardBackward(x, y, [&](int l) { layers.push_back(l); return absl::OkStatus(); },
                                          nullptr, part).ok());
  EXPECT_EQ(parts.size(), 12u + 4u);  // every block of layers 0 (13) and 1 (5) but their last
  for (size_t k = 1; k < parts.size(); ++k) {
    if (parts[k].first == parts[k - 1].first) EXPECT_GT(parts[k].second, parts[k - 1].second);
  }
  for (int i = 0; i < (*whole)->num_parameters(); ++i) {
    std::vector<float> a(NumElements((*whole)->parameters()[i].shape())), b(a.size());
    ASSERT_TRUE((*whole)->GetGradient(i, absl::MakeSpan(a)).ok());
    ASSERT_TRUE((*blocked)->GetGradient(i, absl::MakeSpan(b)).ok());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "parameter " << i;
    const absl::Span<const float> host = (*blocked)->HostGradient(i);
    EXPECT_TRUE(std::equal(host.begin(), host.end(), b.begin())) << "the host view is the gradient";
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    const absl::Span<const float> final_grad = (*blocked)->HostGradient(parts[k].first);
    EXPECT_TRUE(std::equal(announced[k].begin(), announced[k].end(), final_grad.begin()))
        << "block " << k << " changed after it was announced";
  }
}

// A bound parameter is read where it lies: the model computes with what the memory holds when forward reads
// it, the same as with those values copied in; a size that does not fit is refused.
TEST(MlpTest, ABoundParameterIsReadInPlaceAsIfItsValuesWereCopiedIn) {
  CpuBackend backend;
  auto copied = Mlp::Create(&backend, {5, 4, 3}, /*seed=*/3, 2);
  auto bound = Mlp::Create(&backend, {5, 4, 3}, /*seed=*/3, 2);
  ASSERT_TRUE(copied.ok() && bound.ok());
  std::vector<float> weight(5 * 4, 0.0f);
  ASSERT_TRUE((*bound)->BindParameter(0, absl::MakeSpan(weight)).ok());
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.01f * static_cast<float>(i) - 0.1f;  // after binding
  ASSERT_TRUE((*copied)->SetParameter(0, weight).ok());
  const std::vector<float> x = {0.5f, -0.2f, 0.1f, 0.9f, -0.4f, 0.3f, 0.2f, -0.7f, 0.6f, 0.0f};
  const std::vector<int32_t> y = {2, 0};
  ASSERT_TRUE((*copied)->ForwardBackward(x, y).ok());
  ASSERT_TRUE((*bound)->ForwardBackward(x, y).ok());
  for (int i = 0; i < (*copied)->num_parameters(); ++i) {
    std::vector<float> a(NumElements((*copied)->parameters()[i].shape())), b(a.size());
    ASSERT_TRUE((*copied)->GetGradient(i, absl::MakeSpan(a)).ok());
    ASSERT_TRUE((*bound)->GetGradient(i, absl::MakeSpan(b)).ok());
    EXPECT_EQ(a, b) << "parameter " << i;
  }
  std::vector<float> short_memory(3);
  EXPECT_EQ((*bound)->BindParameter(0, absl::MakeSpan(short_memory)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*bound)->BindParameter(9, absl::MakeSpan(weight)).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
