// The CPU backend: OpenBLAS for GEMM, plain loops for the rest.
#ifndef TESSERA_WORKER_BACKEND_CPU_BACKEND_H_
#define TESSERA_WORKER_BACKEND_CPU_BACKEND_H_

#include "worker/backend/backend.h"

namespace tessera {

// Thread-compatible.
class CpuBackend final : public Backend {
 public:
  // `threads` is OpenBLAS's thread count, which is process-wide. The default of 1 suits a worker that shares
  // its cores with servers and other workers: more BLAS threads than free cores spin and slow everyone down.
  explicit CpuBackend(int threads = 1);
  std::string name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t n) override;
  absl::Status Upload(absl::Span<const float> src, Buffer& dst) override;
  absl::Status Download(const Buffer& src, absl::Span<float> dst) override;
  bool host_memory() const override { return true; }
  bool supports_gemm_rows() const override { return true; }
  absl::Status GemmTransposedRows(int m, int n, int k, const Buffer& a, const Buffer& b, int row_begin, int row_end,
                                  Buffer& c) override;
  absl::Status Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const Buffer& a,
                    const Buffer& b, float beta, Buffer& c) override;
  absl::Status BiasActivation(Buffer& z, const Buffer& bias, int rows, int cols, bool relu) override;
  absl::Status ReluBackward(Buffer& grad, const Buffer& activation, size_t n) override;
  absl::Status ColumnSum(const Buffer& x, int rows, int cols, Buffer& out) override;
  absl::StatusOr<LossSums> SoftmaxCrossEntropy(const Buffer& logits, absl::Span<const int32_t> labels, int classes,
                                               float grad_scale, Buffer* grad) override;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_BACKEND_CPU_BACKEND_H_
