// Parity of CudaBackend with CpuBackend: each operation, and a whole MLP step, on fresh random inputs every run
// (the seed is printed with any failure). Results are compared norm-wise, ||gpu - cpu|| / ||cpu||, against a
// bound that depends on the GEMM arithmetic: 1e-5 for FP32, 1e-3 for TF32, 1e-2 for BF16. Every test that needs
// a GPU skips, saying why, when CreateCudaBackend(0, ...) reports that none answers.
#include "worker/backend/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/backend/cpu_backend.h"
#include "worker/models/mlp.h"

namespace tessera {
namespace {

using Math = CudaBackendOptions::Math;

double Tolerance(Math math) {
  switch (math) {
    case Math::kFp32:
      return 1e-5;
    case Math::kTf32:
      return 1e-3;
    case Math::kBf16:
      return 1e-2;
  }
  return 0;
}

// cuda:0 with `math`, or null with `*why_not` set when no GPU answers (FAILED_PRECONDITION). A GPU that answers
// but will not start for another reason fails the test rather than skipping it.
std::unique_ptr<Backend> GpuOrNull(Math math, std::string* why_not) {
  CudaBackendOptions options;
  options.math = math;
  absl::StatusOr<std::unique_ptr<Backend>> gpu = CreateCudaBackend(0, options);
  if (gpu.ok()) return std::move(*gpu);
  EXPECT_TRUE(absl::IsFailedPrecondition(gpu.status())) << gpu.status();
  *why_not = std::string(gpu.status().message());
  return nullptr;
}

// Declares `std::unique_ptr<Backend> var` on cuda:0, or skips the test. Must open the test body: GTEST_SKIP
// returns from the function it is in.
#define TESSERA_GPU_OR_SKIP(var, math)                              \
  std::string var##_why_not;                                        \
  std::unique_ptr<Backend> var = GpuOrNull((math), &var##_why_not); \
  if (var == nullptr) GTEST_SKIP() << "no usable GPU: " << var##_why_not

#define TESSERA_EXPECT_INVALID_ARGUMENT(expr)                                                  \
  do {                                                                                         \
    const absl::Status status_ = (expr);                                                       \
    EXPECT_EQ(status_.code(), absl::StatusCode::kInvalidArgument) << #expr << ": " << status_; \
  } while (0)

// ||got - want|| / ||want||, accumulated in double. A NaN anywhere makes it NaN and a zero `want` makes it inf
// or NaN, so `EXPECT_LT(RelativeError(...), bound)` fails in either case.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

size_t CountNonFinite(const std::vector<float>& values) {
  return std::count_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(CountNonFinite(got), 0u) << what << ": non-finite values from the GPU";
  EXPECT_EQ(CountNonFinite(want), 0u) << what << ": non-finite values from the CPU";
  EXPECT_LT(RelativeError(got, want), bound) << what << ": ||gpu - cpu|| / ||cpu||";
}

absl::StatusOr<std::unique_ptr<Buffer>> Put(Backend& backend, const std::vector<float>& values) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, backend.Allocate(values.size()));
  TESSERA_RETURN_IF_ERROR(backend.Upload(values, *buffer));
  return buffer;
}

absl::StatusOr<std::vector<float>> Get(Backend& backend, const Buffer& buffer) {
  std::vector<float> values(buffer.size());
  TESSERA_RETURN_IF_ERROR(backend.Download(buffer, absl::MakeSpan(values)));
  return values;
}

// Runs `op` (Backend& -> StatusOr<std::vector<float>>) on both backends and compares the results.
template <typename Op>
void ExpectSameOnBoth(Backend& cpu, Backend& gpu, const Op& op, double bound, const std::string& what) {
  absl::StatusOr<std::vector<float>> want = op(cpu);
  absl::StatusOr<std::vector<float>> got = op(gpu);
  ASSERT_TRUE(want.ok()) << what << " on the CPU: " << want.status();
  ASSERT_TRUE(got.ok()) << what << " on the GPU: " << got.status();
  ExpectClose(*got, *want, bound, what);
}

// The fixture draws fresh random inputs for each test, seeded from std::random_device; every failure message
// carries the seed (to replay a draw, initialise seed_ with it).
class CudaBackendTest : public testing::Test {
 protected:
  // Uniform in [lo, hi), never exactly zero (a zero would hide a missing write or a wrong mask).
  std::vector<float> Uniform(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> values(n);
    for (float& v : values) {
      do {
        v = dist(engine_);
      } while (v == 0.0f);
    }
    return values;
  }

  std::vector<int32_t> Labels(size_t n, int classes) {
    std::uniform_int_distribution<int32_t> dist(0, classes - 1);
    std::vector<int32_t> labels(n);
    for (int32_t& label : labels) label = dist(engine_);
    return labels;
  }

  // All four transpose combinations on odd sizes (no dimension a multiple of a tile) with alpha and beta both
  // in play; then beta = 0 over a C full of NaN, which BLAS semantics say is never read (the MLP relies on it:
  // its GEMM outputs start as uninitialised memory).
  void CheckGemm(Backend& gpu, double bound) {
    struct Shape {
      int m, n, k;
    };
    for (const Shape& s : {Shape{67, 45, 129}, Shape{131, 263, 517}}) {
      const std::vector<float> a = Uniform(static_cast<size_t>(s.m) * s.k, -1, 1);
      const std::vector<float> b = Uniform(static_cast<size_t>(s.k) * s.n, -1, 1);
      const std::vector<float> c = Uniform(static_cast<size_t>(s.m) * s.n, -1, 1);
      const std::vector<float> nan_c(c.size(), std::numeric_limits<float>::quiet_NaN());
      for (int t = 0; t < 5; ++t) {
        const bool ta = (t & 1) != 0, tb = (t & 2) != 0, overwrite = t == 4;
        auto gemm = [&](Backend& backend) -> absl::StatusOr<std::vector<float>> {
          TESSERA_ASSIGN_OR_RETURN(auto da, Put(backend, a));
          TESSERA_ASSIGN_OR_RETURN(auto db, Put(backend, b));
          TESSERA_ASSIGN_OR_RETURN(auto dc, Put(backend, overwrite ? nan_c : c));
          TESSERA_RETURN_IF_ERROR(backend.Gemm(ta, tb, s.m, s.n, s.k, 0.75f, *da, *db, overwrite ? 0.0f : 0.5f, *dc));
          return Get(backend, *dc);
        };
        ExpectSameOnBoth(cpu_, gpu, gemm, bound,
                         absl::StrCat("Gemm ", ta ? "T" : "N", tb ? "T" : "N", overwrite ? " beta=0" : "", " ", s.m,
                                      "x", s.n, "x", s.k));
      }
    }
  }

  // Rows of A^T B a block at a time (GemmTransposedRows) into a C of NaN: every row of the product is written,
  // close to the CPU's whole product.
  void CheckGemmRows(Backend& gpu, double bound) {
    ASSERT_TRUE(gpu.supports_gemm_rows());
    const int m = 131, n = 263, k = 64;
    const std::vector<float> a = Uniform(static_cast<size_t>(k) * m, -1, 1);
    const std::vector<float> b = Uniform(static_cast<size_t>(k) * n, -1, 1);
    const std::vector<float> nan_c(static_cast<size_t>(m) * n, std::numeric_limits<float>::quiet_NaN());
    auto by_rows = [&](Backend& backend) -> absl::StatusOr<std::vector<float>> {
      TESSERA_ASSIGN_OR_RETURN(auto da, Put(backend, a));
      TESSERA_ASSIGN_OR_RETURN(auto db, Put(backend, b));
      TESSERA_ASSIGN_OR_RETURN(auto dc, Put(backend, nan_c));
      for (int row = 0; row < m; row += 17) {
        TESSERA_RETURN_IF_ERROR(backend.GemmTransposedRows(m, n, k, *da, *db, row, std::min(m, row + 17), *dc));
      }
      return Get(backend, *dc);
    };
    ExpectSameOnBoth(cpu_, gpu, by_rows, bound, "GemmTransposedRows in blocks of 17 rows");
    auto whole = gpu.Allocate(static_cast<size_t>(m) * n);
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(gpu.GemmTransposedRows(m, n, k, **whole, **whole, 5, 5, **whole).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(gpu.GemmTransposedRows(m, n, k, **whole, **whole, 0, m + 1, **whole).code(),
              absl::StatusCode::kInvalidArgument);
  }

  // A forward and backward pass of the MLP {784, 256, 128, 10} on a batch of 64, built once on each backend
  // with the same parameters and inputs: the loss, the hits and every gradient must agree.
  void CheckMlp(Backend& gpu, double bound) {
    const std::vector<int> sizes = {784, 256, 128, 10};
    const int batch = 64;
    const std::vector<float> x = Uniform(static_cast<size_t>(batch) * sizes[0], -1, 1);
    const std::vector<int32_t> labels = Labels(batch, sizes.back());
    const MlpCase mlp_case = MakeMlpCase(sizes, x, batch);
    ASSERT_GT(mlp_case.min_margin, 1e-3) << "test premise: hidden pre-activations keep away from the kink";

    Backend* backends[2] = {&cpu_, &gpu};
    std::unique_ptr<Mlp> models[2];
    LossSums sums[2];
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(backends[i], sizes, /*seed=*/1, batch);
      ASSERT_TRUE(mlp.ok()) << backends[i]->name() << ": " << mlp.status();
      for (int p = 0; p < (*mlp)->num_parameters(); ++p) {
        absl::Status set = (*mlp)->SetParameter(p, mlp_case.parameters[p]);
        ASSERT_TRUE(set.ok()) << backends[i]->name() << ": " << set;
      }
      absl::StatusOr<LossSums> step = (*mlp)->ForwardBackward(x, labels);
      ASSERT_TRUE(step.ok()) << backends[i]->name() << ": " << step.status();
      sums[i] = *step;
      models[i] = std::move(*mlp);
    }

    EXPECT_LT(std::abs(sums[1].loss - sums[0].loss) / std::abs(sums[0].loss), bound)
        << "loss: gpu " << sums[1].loss << ", cpu " << sums[0].loss;
    // An example whose two largest logits are closer than the arithmetic's error may be counted as a hit on
    // one backend and not the other; no other may.
    double scale = 0;
    for (double v : mlp_case.logits) scale = std::max(scale, std::abs(v));
    int64_t ambiguous = 0;
    const int classes = sizes.back();
    for (int r = 0; r < batch; ++r) {
      std::vector<double> row(mlp_case.logits.begin() + r * classes, mlp_case.logits.begin() + (r + 1) * classes);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<double>());
      if (row[0] - row[1] < 10 * bound * scale) ++ambiguous;
    }
    EXPECT_LE(std::abs(sums[1].correct - sums[0].correct), ambiguous)
        << "hits: gpu " << sums[1].correct << ", cpu " << sums[0].correct;

    for (int p = 0; p < models[0]->num_parameters(); ++p) {
      const std::string& name = models[0]->parameters()[p].name();
      std::vector<float> want(mlp_case.parameters[p].size()), got(want.size());
      absl::Status cpu_status = models[0]->GetGradient(p, absl::MakeSpan(want));
      absl::Status gpu_status = models[1]->GetGradient(p, absl::MakeSpan(got));
      ASSERT_TRUE(cpu_status.ok()) << name << ": " << cpu_status;
      ASSERT_TRUE(gpu_status.ok()) << name << ": " << gpu_status;
      ExpectClose(got, want, bound, absl::StrCat("gradient of ", name));
    }
  }

  CpuBackend cpu_;

 private:
  struct MlpCase {
    std::vector<std::vector<float>> parameters;  // weight0, bias0, weight1, ... in Mlp's order
    std::vector<double> logits;                  // [batch, classes], computed in double
    double min_margin = 0;                       // smallest |pre-activation| of a hidden unit
  };

  // Random parameters (Glorot-uniform weights) for which no hidden pre-activation on `x` is near 0.
  //
  // ReLU's derivative jumps at 0: a pre-activation within rounding distance of 0 can land on different sides on
  // the two backends, and then that unit's whole delta is masked on one and not on the other. One such example
  // moves the first layer's weight gradient by about 1%, far beyond the TF32 bound and possible even in FP32.
  // So each hidden unit's bias is put in the middle of the widest gap between the unit's sorted pre-activations
  // over the batch, leaving out the outer eighths so that both sides of the kink stay populated.
  MlpCase MakeMlpCase(const std::vector<int>& sizes, const std::vector<float>& x, int batch) {
    MlpCase out;
    out.min_margin = std::numeric_limits<double>::infinity();
    std::vector<double> h(x.begin(), x.end());
    const int layers = static_cast<int>(sizes.size()) - 1;
    for (int l = 0; l < layers; ++l) {
      const int in = sizes[l], width = sizes[l + 1];
      const float limit = std::sqrt(6.0f / static_cast<float>(in + width));
      std::vector<float> weight = Uniform(static_cast<size_t>(in) * width, -limit, limit);
      std::vector<double> z(static_cast<size_t>(batch) * width, 0.0);
      for (int r = 0; r < batch; ++r) {
        for (int p = 0; p < in; ++p) {
          const double hv = h[static_cast<size_t>(r) * in + p];
          for (int c = 0; c < width; ++c)
            z[static_cast<size_t>(r) * width + c] += hv * weight[static_cast<size_t>(p) * width + c];
        }
      }
      std::vector<float> bias;
      if (l + 1 == layers) {
        bias = Uniform(width, -0.1f, 0.1f);
      } else {
        bias.resize(width);
        for (int c = 0; c < width; ++c) {
          std::vector<double> column(batch);
          for (int r = 0; r < batch; ++r) column[r] = z[static_cast<size_t>(r) * width + c];
          std::sort(column.begin(), column.end());
          int widest = batch / 8;
          for (int i = batch / 8; i + 1 < batch - batch / 8; ++i) {
            if (column[i + 1] - column[i] > column[widest + 1] - column[widest]) widest = i;
          }
          bias[c] = static_cast<float>(-(column[widest] + column[widest + 1]) / 2);
          for (double v : column) out.min_margin = std::min(out.min_margin, std::abs(v + bias[c]));
        }
      }
      for (size_t i = 0; i < z.size(); ++i) {
        z[i] += bias[i % width];
        if (l + 1 < layers) z[i] = std::max(z[i], 0.0);
      }
      h = std::move(z);
      out.parameters.push_back(std::move(weight));
      out.parameters.push_back(std::move(bias));
    }
    out.logits = std::move(h);
    return out;
  }

  const uint32_t seed_ = std::random_device()();
  std::mt19937 engine_{seed_};
  testing::ScopedTrace trace_{__FILE__, __LINE__, absl::StrCat("random seed ", seed_)};
};

// ---------------------------------------------------------------------------------------------------------
// Device selection. These two need no GPU and run everywhere.

TEST_F(CudaBackendTest, CreateRejectsNegativeOrdinal) {
  EXPECT_EQ(CreateCudaBackend(-1, CudaBackendOptions()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, CreateReportsMissingDeviceAsFailedPrecondition) {
  // No machine has 4096 GPUs; a machine without a driver gives the same code. --device=auto relies on it.
  absl::StatusOr<std::unique_ptr<Backend>> gpu = CreateCudaBackend(4096, CudaBackendOptions());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition) << gpu.status();
  EXPECT_TRUE(absl::StrContains(gpu.status().message(), "cuda:4096")) << gpu.status();
}

TEST_F(CudaBackendTest, NameNamesTheDevice) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  EXPECT_TRUE(absl::StartsWith(gpu->name(), "cuda:0 (")) << gpu->name();
  EXPECT_TRUE(absl::EndsWith(gpu->name(), ")")) << gpu->name();
}

// A gradient-sized download started while more kernels are queued behind it arrives whole (the copy waits for
// the work before it, and only that).
TEST_F(CudaBackendTest, StartDownloadCopiesWhatWasComputedBeforeItWhileLaterWorkRuns) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  const size_t n = (size_t{3} << 20) + 5;  // several MiB, not a multiple of anything
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 1000) * 0.25f;
  auto buffer = gpu->Allocate(n);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(gpu->Upload(values, **buffer).ok());
  std::vector<float> out(n, -1.0f);
  auto download = gpu->StartDownload(**buffer, 0, absl::MakeSpan(out));
  ASSERT_TRUE(download.ok()) << download.status();
  // Work issued after the download (on other buffers, as backward's next layers are) runs meanwhile.
  auto other = gpu->Allocate(n);
  auto negative = gpu->Allocate(n);
  ASSERT_TRUE(other.ok() && negative.ok());
  ASSERT_TRUE(gpu->Upload(values, **other).ok());
  ASSERT_TRUE(gpu->Upload(std::vector<float>(n, -1.0f), **negative).ok());
  ASSERT_TRUE(gpu->ReluBackward(**other, **negative, n).ok());
  ASSERT_TRUE((*download)->Wait().ok());
  EXPECT_TRUE((*download)->Ready());
  EXPECT_EQ(out, values);
  std::vector<float> now(n);
  ASSERT_TRUE(gpu->Download(**other, absl::MakeSpan(now)).ok());
  EXPECT_EQ(now, std::vector<float>(n, 0.0f)) << "the later work ran";
}

// A download from an offset (a block of a weight gradient's rows) copies that part only.
TEST_F(CudaBackendTest, StartDownloadFromAnOffsetCopiesThatPart) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  auto buffer = gpu->Allocate(values.size());
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(gpu->Upload(values, **buffer).ok());
  std::vector<float> out(300, -1.0f);
  auto download = gpu->StartDownload(**buffer, 700, absl::MakeSpan(out));
  ASSERT_TRUE(download.ok()) << download.status();
  ASSERT_TRUE((*download)->Wait().ok());
  EXPECT_EQ(out, std::vector<float>(values.begin() + 700, values.end()));
  EXPECT_EQ(gpu->StartDownload(**buffer, 701, absl::MakeSpan(out)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, StartDownloadRejectsForeignAndShortBuffers) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  CpuBackend cpu;
  auto foreign = cpu.Allocate(4);
  ASSERT_TRUE(foreign.ok());
  std::vector<float> out(8);
  EXPECT_EQ(gpu->StartDownload(**foreign, 0, absl::MakeSpan(out).subspan(0, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto small = gpu->Allocate(4);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(gpu->StartDownload(**small, 0, absl::MakeSpan(out)).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------
// Operations

TEST_F(CudaBackendTest, GemmMatchesCpuFp32) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  CheckGemm(*gpu, Tolerance(Math::kFp32));
}

TEST_F(CudaBackendTest, GemmMatchesCpuTf32) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kTf32);
  CheckGemm(*gpu, Tolerance(Math::kTf32));
}

TEST_F(CudaBackendTest, GemmMatchesCpuBf16) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kBf16);
  CheckGemm(*gpu, Tolerance(Math::kBf16));
}

TEST_F(CudaBackendTest, GemmRowsMatchCpuFp32) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  CheckGemmRows(*gpu, Tolerance(Math::kFp32));
}

TEST_F(CudaBackendTest, GemmRowsMatchCpuBf16) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kBf16);
  CheckGemmRows(*gpu, Tolerance(Math::kBf16));
}

TEST_F(CudaBackendTest, BiasActivationMatchesCpu) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  const int rows = 37, cols = 131;
  const std::vector<float> z = Uniform(static_cast<size_t>(rows) * cols, -1, 1);
  const std::vector<float> bias = Uniform(cols, -0.5f, 0.5f);
  for (bool relu : {false, true}) {
    auto op = [&](Backend& backend) -> absl::StatusOr<std::vector<float>> {
      TESSERA_ASSIGN_OR_RETURN(auto dz, Put(backend, z));
      TESSERA_ASSIGN_OR_RETURN(auto dbias, Put(backend, bias));
      TESSERA_RETURN_IF_ERROR(backend.BiasActivation(*dz, *dbias, rows, cols, relu));
      return Get(backend, *dz);
    };
    ExpectSameOnBoth(cpu_, *gpu, op, Tolerance(Math::kFp32), relu ? "BiasActivation relu" : "BiasActivation");
  }
}

TEST_F(CudaBackendTest, ReluBackwardMatchesCpu) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  const size_t n = 4099;
  const std::vector<float> grad = Uniform(n, -1, 1);
  std::vector<float> activation = Uniform(n, -1, 1);
  for (float& v : activation) v = std::max(v, 0.0f);  // a ReLU's output: about half of it masks
  auto op = [&](Backend& backend) -> absl::StatusOr<std::vector<float>> {
    TESSERA_ASSIGN_OR_RETURN(auto dgrad, Put(backend, grad));
    TESSERA_ASSIGN_OR_RETURN(auto dact, Put(backend, activation));
    TESSERA_RETURN_IF_ERROR(backend.ReluBackward(*dgrad, *dact, n));
    return Get(backend, *dgrad);
  };
  ExpectSameOnBoth(cpu_, *gpu, op, Tolerance(Math::kFp32), "ReluBackward");
}

TEST_F(CudaBackendTest, ColumnSumMatchesCpu) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  const int rows = 1031, cols = 77;
  const std::vector<float> x = Uniform(static_cast<size_t>(rows) * cols, -1, 1);
  const std::vector<float> stale = Uniform(cols, -1, 1);
  auto op = [&](Backend& backend, int use_rows) -> absl::StatusOr<std::vector<float>> {
    TESSERA_ASSIGN_OR_RETURN(auto dx, Put(backend, x));
    TESSERA_ASSIGN_OR_RETURN(auto dout, Put(backend, stale));
    TESSERA_RETURN_IF_ERROR(backend.ColumnSum(*dx, use_rows, cols, *dout));
    return Get(backend, *dout);
  };
  ExpectSameOnBoth(
      cpu_, *gpu, [&](Backend& backend) { return op(backend, rows); }, Tolerance(Math::kFp32), "ColumnSum");
  // No rows: the sums are zero (and the old contents gone), as on the CPU.
  absl::StatusOr<std::vector<float>> empty = op(*gpu, 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, std::vector<float>(cols, 0.0f));
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyMatchesCpu) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  const double bound = Tolerance(Math::kFp32);
  // 10 classes (the MLP's) and 75 (more than a warp's 32 lanes, not a multiple of them).
  struct Shape {
    int rows, classes;
  };
  for (const Shape& shape : {Shape{129, 10}, Shape{67, 75}}) {
    const int rows = shape.rows, classes = shape.classes;
    const std::vector<float> logits = Uniform(static_cast<size_t>(rows) * classes, -4, 4);
    std::vector<int32_t> labels = Labels(rows, classes);
    for (int r = 0; r < rows; r += 3) {  // make a third of the examples hits, so that the count is exercised
      const float* row = logits.data() + static_cast<size_t>(r) * classes;
      labels[r] = static_cast<int32_t>(std::max_element(row, row + classes) - row);
    }
    const float grad_scale = 1.0f / rows;
    auto op = [&](Backend& backend, LossSums* sums) -> absl::StatusOr<std::vector<float>> {
      TESSERA_ASSIGN_OR_RETURN(auto dlogits, Put(backend, logits));
      TESSERA_ASSIGN_OR_RETURN(auto dgrad, backend.Allocate(logits.size()));
      TESSERA_ASSIGN_OR_RETURN(*sums, backend.SoftmaxCrossEntropy(*dlogits, labels, classes, grad_scale, dgrad.get()));
      // Without a gradient the sums are the same.
      TESSERA_ASSIGN_OR_RETURN(LossSums again, backend.SoftmaxCrossEntropy(*dlogits, labels, classes, 1, nullptr));
      if (again.loss != sums->loss || again.correct != sums->correct) {
        return absl::InternalError("SoftmaxCrossEntropy without a gradient gave other sums");
      }
      return Get(backend, *dgrad);
    };
    const std::string what = absl::StrCat("SoftmaxCrossEntropy ", rows, "x", classes);
    LossSums cpu_sums, gpu_sums;
    absl::StatusOr<std::vector<float>> want = op(cpu_, &cpu_sums);
    absl::StatusOr<std::vector<float>> got = op(*gpu, &gpu_sums);
    ASSERT_TRUE(want.ok()) << what << " on the CPU: " << want.status();
    ASSERT_TRUE(got.ok()) << what << " on the GPU: " << got.status();
    ExpectClose(*got, *want, bound, what + " gradient");
    EXPECT_LT(std::abs(gpu_sums.loss - cpu_sums.loss) / std::abs(cpu_sums.loss), bound)
        << what << " loss: gpu " << gpu_sums.loss << ", cpu " << cpu_sums.loss;
    // The same logits on both sides, so the arg-max (the first maximal index) must agree exactly.
    EXPECT_EQ(gpu_sums.correct, cpu_sums.correct) << what << " hits";
  }
}

// The GPU refuses what the CPU refuses, with the same code, before touching the device.
TEST_F(CudaBackendTest, RejectsWhatCpuRejects) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  for (Backend* backend : {static_cast<Backend*>(&cpu_), gpu.get()}) {
    SCOPED_TRACE(backend->name());
    absl::StatusOr<std::unique_ptr<Buffer>> small = backend->Allocate(6);
    absl::StatusOr<std::unique_ptr<Buffer>> large = backend->Allocate(12);
    ASSERT_TRUE(small.ok() && large.ok());
    Buffer& s = **small;
    Buffer& l = **large;
    std::vector<float> host(12, 1.0f);
    const std::vector<int32_t> bad_labels = {0, 3};
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->Upload(host, s));
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->Download(s, absl::MakeSpan(host)));
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->Gemm(false, false, 0, 2, 3, 1, s, s, 0, s));
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->Gemm(false, false, 3, 3, 3, 1, l, s, 0, l));  // B: 6 < 9
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->BiasActivation(s, s, 2, 4, true));            // Z: 6 < 8
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->ReluBackward(s, l, 7));                       // grad: 6 < 7
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->ColumnSum(s, 3, 4, l));                       // X: 6 < 12
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->ColumnSum(l, 1, 8, s));                       // out: 6 < 8
    TESSERA_EXPECT_INVALID_ARGUMENT(backend->SoftmaxCrossEntropy(l, bad_labels, 3, 1, &l).status());
  }
  // A buffer of another backend is refused, not dereferenced on the device.
  absl::StatusOr<std::unique_ptr<Buffer>> host_buffer = cpu_.Allocate(4);
  absl::StatusOr<std::unique_ptr<Buffer>> device_buffer = gpu->Allocate(4);
  ASSERT_TRUE(host_buffer.ok() && device_buffer.ok());
  TESSERA_EXPECT_INVALID_ARGUMENT(gpu->ReluBackward(**device_buffer, **host_buffer, 4));
  // And the device is still fine afterwards.
  std::vector<float> values = {1, -2, 3, -4}, back(4);
  EXPECT_TRUE(gpu->Upload(values, **device_buffer).ok());
  EXPECT_TRUE(gpu->Download(**device_buffer, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, values);
}

// ---------------------------------------------------------------------------------------------------------
// A whole training step

TEST_F(CudaBackendTest, MlpGradientsMatchCpuFp32) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kFp32);
  CheckMlp(*gpu, Tolerance(Math::kFp32));
}

TEST_F(CudaBackendTest, MlpGradientsMatchCpuTf32) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kTf32);
  CheckMlp(*gpu, Tolerance(Math::kTf32));
}

TEST_F(CudaBackendTest, MlpGradientsMatchCpuBf16) {
  TESSERA_GPU_OR_SKIP(gpu, Math::kBf16);
  CheckMlp(*gpu, Tolerance(Math::kBf16));
}

}  // namespace
}  // namespace tessera
