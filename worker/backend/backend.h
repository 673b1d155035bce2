// The compute a worker needs, behind one interface: GEMM, bias and activation, reductions, softmax
// cross-entropy and copies. CpuBackend (OpenBLAS) and CudaBackend (cuBLAS plus kernels) implement it.
//
// Matrices are row-major float32 in Buffers the backend allocated (host memory for the CPU, device memory for
// CUDA); a Buffer goes only to the backend that allocated it. Sizes must be positive (INVALID_ARGUMENT
// otherwise). Calls are issued in order; a Download returns once the values are on the host. Gemm with
// beta == 0 never reads C. Every failure is a
// Status (a CUDA error names the call and the error), never a crash.
//
//   TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("auto"));
//   TESSERA_ASSIGN_OR_RETURN(auto a, backend->Allocate(m * k));
//   TESSERA_RETURN_IF_ERROR(backend->Upload(host_a, *a));
//   TESSERA_RETURN_IF_ERROR(backend->Gemm(false, false, m, n, k, 1.0f, *a, *b, 0.0f, *c));
#ifndef TESSERA_WORKER_BACKEND_BACKEND_H_
#define TESSERA_WORKER_BACKEND_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera {

// A float32 array owned by a backend. Not thread-safe.
class Buffer {
 public:
  virtual ~Buffer() = default;
  // Device or host address, depending on the backend; only that backend dereferences it.
  virtual float* data() = 0;
  virtual const float* data() const = 0;
  virtual size_t size() const = 0;  // elements
};

// Host memory the caller owns, seen as a Buffer: for backends whose buffers are host memory
// (Backend::host_memory) only. The memory must outlive the buffer's use.
class HostSpanBuffer final : public Buffer {
 public:
  explicit HostSpanBuffer(absl::Span<float> memory) : memory_(memory) {}
  float* data() override { return memory_.data(); }
  const float* data() const override { return memory_.data(); }
  size_t size() const override { return memory_.size(); }

 private:
  const absl::Span<float> memory_;
};

// Sums over a batch from SoftmaxCrossEntropy.
struct LossSums {
  double loss = 0;      // sum of per-example cross-entropy
  int64_t correct = 0;  // examples whose arg-max logit is the label
};

// A device-to-host copy in flight (Backend::StartDownload). Not thread-safe; used by the backend's thread.
class PendingDownload {
 public:
  virtual ~PendingDownload() = default;
  // True when Wait() would not block. Never blocks.
  virtual bool Ready() = 0;
  // Blocks until the destination holds the values; the error of the copy (or of the work it waited for).
  [[nodiscard]] virtual absl::Status Wait() = 0;
};

// Thread-compatible: one backend serves one training loop.
class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)", ...
  virtual std::string name() const = 0;

  // A buffer of `n` floats (contents unspecified). RESOURCE_EXHAUSTED when memory runs out.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t n) = 0;
  // Copies host values into dst[0, src.size()); INVALID_ARGUMENT when they do not fit.
  [[nodiscard]] virtual absl::Status Upload(absl::Span<const float> src, Buffer& dst) = 0;
  // Copies src[0, dst.size()) to the host and waits for it; INVALID_ARGUMENT when src is smaller.
  [[nodiscard]] virtual absl::Status Download(const Buffer& src, absl::Span<float> dst) = 0;
  // Starts copying src[offset, offset + dst.size()) to the host, after the work issued before it, without holding
  // back the work issued after it; `dst` holds the values once the returned download's Wait() returned OK. That
  // part of `src` must not be written until then. INVALID_ARGUMENT when `src` is smaller. The default copies at
  // once (Download) and returns a finished download; the CUDA backend copies on a stream of its own through
  // pinned memory, so a layer's gradient, or a block of its rows, travels while backward goes on.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<PendingDownload>> StartDownload(const Buffer& src,
                                                                                       size_t offset,
                                                                                       absl::Span<float> dst);

  // True when a Buffer's data() is host memory this process may read (the CPU backend): the host can then use
  // a buffer's values in place instead of downloading a copy.
  virtual bool host_memory() const { return false; }
  // Rows [row_begin, row_end) of C[m x n] = A^T B, A being [k x m] and B [k x n], written to the same rows of C
  // and nothing else (a layer's weight gradient a block of rows at a time, so that each block can leave as it is
  // done). On the CPU each row comes out bit for bit as Gemm(true, false, m, n, k, 1, A, B, 0, C) computes it;
  // on a GPU it equals it to within the math mode's rounding (cuBLAS may choose another kernel for another
  // shape). The default is UNIMPLEMENTED (supports_gemm_rows() false): the caller computes the whole product.
  virtual bool supports_gemm_rows() const { return false; }
  [[nodiscard]] virtual absl::Status GemmTransposedRows(int m, int n, int k, const Buffer& a, const Buffer& b,
                                                        int row_begin, int row_end, Buffer& c);

  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; op(A) is m x k, op(B) is k x n.
  [[nodiscard]] virtual absl::Status Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                                          const Buffer& a, const Buffer& b, float beta, Buffer& c) = 0;
  // Z[rows x cols] += bias (per column), then ReLU when `relu`.
  [[nodiscard]] virtual absl::Status BiasActivation(Buffer& z, const Buffer& bias, int rows, int cols,
                                                    bool relu) = 0;
  // dH[i] = 0 where H[i] <= 0 (H is the ReLU's output).
  [[nodiscard]] virtual absl::Status ReluBackward(Buffer& grad, const Buffer& activation, size_t n) = 0;
  // out[cols] = sum over rows of X[rows x cols].
  [[nodiscard]] virtual absl::Status ColumnSum(const Buffer& x, int rows, int cols, Buffer& out) = 0;
  // For logits[rows x classes] and host `labels`: the summed loss and hits, and, when `grad` is not null,
  // grad = (softmax(logits) - onehot(labels)) * grad_scale. INVALID_ARGUMENT for a label out of range.
  [[nodiscard]] virtual absl::StatusOr<LossSums> SoftmaxCrossEntropy(const Buffer& logits,
                                                                     absl::Span<const int32_t> labels, int classes,
                                                                     float grad_scale, Buffer* grad) = 0;
};

// What CreateBackend configures beyond the device.
struct BackendOptions {
  int cpu_threads = 1;  // CPU: BLAS threads (process-wide); 0 leaves the process's setting as it is
  enum class Math { kFp32, kTf32, kBf16 };
  Math math = Math::kFp32;  // CUDA: GEMM precision (the CPU always computes in float32)
  // "auto" takes GPU local_index modulo the GPUs this process sees: a node's workers (SLURM_LOCALID 0, 1, ...)
  // spread over its GPUs when each sees them all, and take their own when each sees one.
  int local_index = 0;
};

// A device name, as --device takes it: "auto", "cpu" or "cuda:N" (N >= 0). Its GPU number for cuda:N, -1 for
// auto and cpu; INVALID_ARGUMENT naming the flag and the name otherwise.
absl::StatusOr<int> ParseDevice(const std::string& device);

// Picks a backend for `device`: "cpu", "cuda:N", or "auto" (GPU local_index modulo the visible GPUs when that one
// answers, else the CPU, with one log line saying why). INVALID_ARGUMENT for anything else; FAILED_PRECONDITION for "cuda:N" when that GPU
// cannot be used (or this build has no CUDA), with the reason.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& device,
                                                                     const BackendOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_WORKER_BACKEND_BACKEND_H_
