// gemm_bench: the achieved TFLOP/s of the worker's GEMMs through CudaBackend::Gemm in each of its arithmetics
// (FP32, TF32, BF16), beside the best cuBLAS itself reaches on the same shapes.
//
//   build/bin/gemm_bench
//
// The shapes are the three GEMMs per layer of an MLP step (forward Y = X W, weight gradient dW = X^T dY, input
// gradient dX = dY W^T) for 784-256-128-10 at batch 64 (the small default model) and 784-4096-4096-10 at batch
// 1024 (a GEMM-bound one). Each figure is the best of three timings, each of enough back-to-back calls to last
// about kTimingMs, measured with CUDA events on the stream the work runs on. "cuBLAS best" tries
// cublasGemmEx with CUBLAS_GEMM_DEFAULT and CUBLAS_GEMM_DEFAULT_TENSOR_OP and the algorithms that cublasLt's
// heuristic proposes (up to kLtAlgorithms, with a kWorkspaceBytes workspace), and keeps the fastest. Its BF16
// operands are converted beforehand, so the gap to the backend's BF16 column is the backend's conversion pass
// plus its per-call overhead; TF32 likewise (the backend rounds its operands to TF32 on every call).
//
// Without a usable GPU it prints "no usable GPU: <reason>" and exits 0, so it can run anywhere.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda_backend.h"

namespace tessera {
namespace {

constexpr double kTimingMs = 10;
constexpr int kTrials = 3;
constexpr int kLtAlgorithms = 8;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

absl::Status Check(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(error), " (", cudaGetErrorName(error), ")"));
}
absl::Status Check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cublasGetStatusString(status)));
}
#define BENCH_CHECK(call) TESSERA_RETURN_IF_ERROR(Check((call), #call))

struct Shape {
  std::string model;
  int layer;
  const char* pass;
  bool ta, tb;
  int m, n, k;
  double flops() const { return 2.0 * m * n * k; }
};

std::vector<Shape> WorkerShapes() {
  struct Model {
    std::vector<int> sizes;
    int batch;
  };
  std::vector<Shape> shapes;
  for (const Model& model : {Model{{784, 256, 128, 10}, 64}, Model{{784, 4096, 4096, 10}, 1024}}) {
    std::string name;
    for (int s : model.sizes) absl::StrAppend(&name, name.empty() ? "" : "-", s);
    absl::StrAppend(&name, " @", model.batch);
    const int b = model.batch;
    for (size_t l = 0; l + 1 < model.sizes.size(); ++l) {
      const int in = model.sizes[l], out = model.sizes[l + 1];
      shapes.push_back({name, static_cast<int>(l), "fwd", false, false, b, out, in});  // Y = X W
      shapes.push_back({name, static_cast<int>(l), "dW", true, false, in, out, b});    // dW = X^T dY
      shapes.push_back({name, static_cast<int>(l), "dX", false, true, b, in, out});    // dX = dY W^T
    }
  }
  return shapes;
}

// The best time per call, in ms, of `enqueue` (which issues one GEMM on `stream`).
absl::StatusOr<double> TimeBestMs(cudaStream_t stream, const std::function<absl::Status()>& enqueue) {
  cudaEvent_t start = nullptr, stop = nullptr;
  BENCH_CHECK(cudaEventCreate(&start));
  absl::Cleanup destroy_start = [start] { cudaEventDestroy(start); };
  BENCH_CHECK(cudaEventCreate(&stop));
  absl::Cleanup destroy_stop = [stop] { cudaEventDestroy(stop); };
  auto timed = [&](int reps) -> absl::StatusOr<double> {
    BENCH_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; ++i) TESSERA_RETURN_IF_ERROR(enqueue());
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms);
  };
  TESSERA_RETURN_IF_ERROR(timed(3).status());  // warm-up: clocks, caches, lazy kernel loading
  int reps = 1;
  double ms = 0;
  while (true) {  // grow the repetitions until a timing lasts long enough to size them
    TESSERA_ASSIGN_OR_RETURN(ms, timed(reps));
    if (ms >= 1.0 || reps >= (1 << 16)) break;
    reps *= 4;
  }
  reps = std::max(1, static_cast<int>(std::ceil(reps * kTimingMs / std::max(ms, 1e-3))));
  double best = INFINITY;
  for (int trial = 0; trial < kTrials; ++trial) {
    TESSERA_ASSIGN_OR_RETURN(ms, timed(reps));
    best = std::min(best, ms / reps);
  }
  return best;
}

uint16_t ToBf16(float x) {  // round to nearest even; inputs here are finite
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Device copies of one shape's operands, in float32 and in bfloat16. Freed by ~DeviceOperands.
struct DeviceOperands {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  void* a16 = nullptr;
  void* b16 = nullptr;
  ~DeviceOperands() {
    for (void* p : {a, b, c, a16, b16}) cudaFree(p);
  }
};

struct Precision {
  const char* name;
  CudaBackendOptions::Math math;
  cublasComputeType_t compute;
  cudaDataType_t operand_type;
};
constexpr Precision kPrecisions[] = {
    {"fp32", CudaBackendOptions::Math::kFp32, CUBLAS_COMPUTE_32F, CUDA_R_32F},
    {"tf32", CudaBackendOptions::Math::kTf32, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F},
    {"bf16", CudaBackendOptions::Math::kBf16, CUBLAS_COMPUTE_32F, CUDA_R_16BF},
};

// cuBLAS directly, for the reference columns. Not thread-safe.
class CublasReference {
 public:
  absl::Status Init() {
    BENCH_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    BENCH_CHECK(cublasCreate(&handle_));
    BENCH_CHECK(cublasSetStream(handle_, stream_));
    BENCH_CHECK(cublasLtCreate(&lt_));
    BENCH_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    return absl::OkStatus();
  }
  ~CublasReference() {
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // The best ms per call over the candidate algorithms for row-major C = op(A) op(B), computed (as in the
  // backend) as the column-major C^T = op(B)^T op(A)^T.
  absl::StatusOr<double> BestMs(const Shape& s, const Precision& p, const DeviceOperands& d) {
    const void* a = p.operand_type == CUDA_R_16BF ? d.a16 : d.a;
    const void* b = p.operand_type == CUDA_R_16BF ? d.b16 : d.b;
    const cublasOperation_t op_a = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const float alpha = 1, beta = 0;
    double best = INFINITY;
    auto consider = [&](const std::function<absl::Status()>& enqueue) {
      if (!enqueue().ok()) return;  // this algorithm does not take this problem
      absl::StatusOr<double> ms = TimeBestMs(stream_, enqueue);
      if (ms.ok()) best = std::min(best, *ms);
    };
    for (cublasGemmAlgo_t algo : {CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT_TENSOR_OP}) {
      consider([&] {
        return Check(cublasGemmEx(handle_, op_b, op_a, s.n, s.m, s.k, &alpha, b, p.operand_type, ldb, a, p.operand_type,
                                  lda, &beta, d.c, CUDA_R_32F, s.n, p.compute, algo),
                     "cublasGemmEx");
      });
    }

    cublasLtMatmulDesc_t desc = nullptr;
    BENCH_CHECK(cublasLtMatmulDescCreate(&desc, p.compute, CUDA_R_32F));
    absl::Cleanup destroy_desc = [desc] { cublasLtMatmulDescDestroy(desc); };
    BENCH_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
    BENCH_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
    cublasLtMatrixLayout_t layout_b = nullptr, layout_a = nullptr, layout_c = nullptr;  // as stored
    BENCH_CHECK(cublasLtMatrixLayoutCreate(&layout_b, p.operand_type, s.tb ? s.k : s.n, s.tb ? s.n : s.k, ldb));
    absl::Cleanup destroy_b = [layout_b] { cublasLtMatrixLayoutDestroy(layout_b); };
    BENCH_CHECK(cublasLtMatrixLayoutCreate(&layout_a, p.operand_type, s.ta ? s.m : s.k, s.ta ? s.k : s.m, lda));
    absl::Cleanup destroy_a = [layout_a] { cublasLtMatrixLayoutDestroy(layout_a); };
    BENCH_CHECK(cublasLtMatrixLayoutCreate(&layout_c, CUDA_R_32F, s.n, s.m, s.n));
    absl::Cleanup destroy_c = [layout_c] { cublasLtMatrixLayoutDestroy(layout_c); };
    cublasLtMatmulPreference_t preference = nullptr;
    BENCH_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    absl::Cleanup destroy_preference = [preference] { cublasLtMatmulPreferenceDestroy(preference); };
    BENCH_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &kWorkspaceBytes, sizeof(kWorkspaceBytes)));
    cublasLtMatmulHeuristicResult_t results[kLtAlgorithms];
    int found = 0;
    BENCH_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, desc, layout_b, layout_a, layout_c, layout_c, preference,
                                               kLtAlgorithms, results, &found));
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      consider([&] {
        return Check(cublasLtMatmul(lt_, desc, &alpha, b, layout_b, a, layout_a, &beta, d.c, layout_c, d.c, layout_c,
                                    &results[i].algo, workspace_, kWorkspaceBytes, stream_),
                     "cublasLtMatmul");
      });
    }
    if (!std::isfinite(best)) return absl::InternalError("no cuBLAS algorithm ran");
    return best;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
};

absl::Status Run() {
  std::unique_ptr<Backend> backends[3];
  for (int i = 0; i < 3; ++i) {
    CudaBackendOptions options;
    options.math = kPrecisions[i].math;
    TESSERA_ASSIGN_OR_RETURN(backends[i], CreateCudaBackend(0, options));
  }
  CublasReference cublas;
  TESSERA_RETURN_IF_ERROR(cublas.Init());

  std::printf("GEMM throughput on %s, TFLOP/s: best of %d timings of ~%.0f ms each\n", backends[0]->name().c_str(),
              kTrials, kTimingMs);
  std::printf("%-22s %5s %4s %6s %6s %6s | %-7s %7s %7s %7s | %-7s %7s %7s %7s\n", "model @batch", "layer", "gemm", "m",
              "n", "k", "backend", "fp32", "tf32", "bf16", "cuBLAS", "fp32", "tf32", "bf16");
  std::mt19937 engine(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (const Shape& s : WorkerShapes()) {
    const size_t na = static_cast<size_t>(s.m) * s.k, nb = static_cast<size_t>(s.k) * s.n;
    const size_t nc = static_cast<size_t>(s.m) * s.n;
    std::vector<float> a(na), b(nb), c(nc, 0.0f);
    for (float& v : a) v = uniform(engine);
    for (float& v : b) v = uniform(engine);

    double tflops[2][3];
    for (int i = 0; i < 3; ++i) {  // through the backend, on its own stream
      Backend& backend = *backends[i];
      TESSERA_ASSIGN_OR_RETURN(auto da, backend.Allocate(na));
      TESSERA_ASSIGN_OR_RETURN(auto db, backend.Allocate(nb));
      TESSERA_ASSIGN_OR_RETURN(auto dc, backend.Allocate(nc));
      TESSERA_RETURN_IF_ERROR(backend.Upload(a, *da));
      TESSERA_RETURN_IF_ERROR(backend.Upload(b, *db));
      TESSERA_RETURN_IF_ERROR(backend.Upload(c, *dc));
      TESSERA_ASSIGN_OR_RETURN(double ms, TimeBestMs(CudaBackendStream(backend), [&] {
                                 return backend.Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, *da, *db, 0.0f, *dc);
                               }));
      tflops[0][i] = s.flops() / (ms * 1e9);
    }

    DeviceOperands d;  // cuBLAS directly
    BENCH_CHECK(cudaMalloc(&d.a, na * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&d.b, nb * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&d.c, nc * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&d.a16, na * sizeof(uint16_t)));
    BENCH_CHECK(cudaMalloc(&d.b16, nb * sizeof(uint16_t)));
    std::vector<uint16_t> a16(na), b16(nb);
    std::transform(a.begin(), a.end(), a16.begin(), ToBf16);
    std::transform(b.begin(), b.end(), b16.begin(), ToBf16);
    BENCH_CHECK(cudaMemcpy(d.a, a.data(), na * sizeof(float), cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(d.b, b.data(), nb * sizeof(float), cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(d.a16, a16.data(), na * sizeof(uint16_t), cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(d.b16, b16.data(), nb * sizeof(uint16_t), cudaMemcpyHostToDevice));
    for (int i = 0; i < 3; ++i) {
      TESSERA_ASSIGN_OR_RETURN(double ms, cublas.BestMs(s, kPrecisions[i], d));
      tflops[1][i] = s.flops() / (ms * 1e9);
    }

    std::printf("%-22s %5d %4s %6d %6d %6d | %-7s %7.2f %7.2f %7.2f | %-7s %7.2f %7.2f %7.2f\n", s.model.c_str(),
                s.layer, s.pass, s.m, s.n, s.k, "", tflops[0][0], tflops[0][1], tflops[0][2], "", tflops[1][0],
                tflops[1][1], tflops[1][2]);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera

int main() {
  // Probe first, so that a machine without a GPU gets one clear line and success.
  absl::StatusOr<std::unique_ptr<tessera::Backend>> probe =
      tessera::CreateCudaBackend(0, tessera::CudaBackendOptions());
  if (!probe.ok()) {
    std::printf("no usable GPU: %s\n", std::string(probe.status().message()).c_str());
    return absl::IsFailedPrecondition(probe.status()) ? 0 : 1;
  }
  probe->reset();
  const absl::Status status = tessera::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "gemm_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
