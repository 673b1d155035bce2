#include "worker/backend/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t n) : values_(n) {}
  float* data() override { return values_.data(); }
  const float* data() const override { return values_.data(); }
  size_t size() const override { return values_.size(); }

 private:
  std::vector<float> values_;
};

absl::Status CheckShape(int rows, int cols, const char* what) {
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": sizes must be positive, got ", rows, " x ", cols));
  }
  return absl::OkStatus();
}

absl::Status CheckSize(const Buffer& b, size_t need, const char* what) {
  if (b.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": buffer holds ", b.size(), " floats, need ", need));
  }
  return absl::OkStatus();
}

// Sizes of a GEMM of op(A) [m x k] and op(B) [k x n] into C [m x n], and buffers that hold them.
absl::Status CheckGemm(int m, int n, int k, const Buffer& a, const Buffer& b, const Buffer& c) {
  if (m <= 0 || n <= 0 || k <= 0) return absl::InvalidArgumentError(absl::StrCat("Gemm: bad sizes ", m, "x", n, "x", k));
  if (absl::Status s = CheckSize(a, static_cast<size_t>(m) * k, "Gemm A"); !s.ok()) return s;
  if (absl::Status s = CheckSize(b, static_cast<size_t>(k) * n, "Gemm B"); !s.ok()) return s;
  return CheckSize(c, static_cast<size_t>(m) * n, "Gemm C");
}

}  // namespace

CpuBackend::CpuBackend(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}

absl::StatusOr<std::unique_ptr<Buffer>> CpuBackend::Allocate(size_t n) {
  try {
    return std::unique_ptr<Buffer>(std::make_unique<HostBuffer>(n));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", n, " floats (", (n * sizeof(float)) >> 20, " MiB) of host memory"));
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", n, " floats: larger than any vector"));
  }
}

absl::Status CpuBackend::Upload(absl::Span<const float> src, Buffer& dst) {
  if (absl::Status s = CheckSize(dst, src.size(), "Upload"); !s.ok()) return s;
  if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuBackend::Download(const Buffer& src, absl::Span<float> dst) {
  if (absl::Status s = CheckSize(src, dst.size(), "Download"); !s.ok()) return s;
  if (!dst.empty()) std::memcpy(dst.data(), src.data(), dst.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuBackend::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const Buffer& a,
                              const Buffer& b, float beta, Buffer& c) {
  if (absl::Status s = CheckGemm(m, n, k, a, b, c); !s.ok()) return s;
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a.data(), transpose_a ? m : k, b.data(), transpose_b ? k : n, beta, c.data(), n);
  return absl::OkStatus();
}

absl::Status CpuBackend::GemmTransposedRows(int m, int n, int k, const Buffer& a, const Buffer& b, int row_begin,
                                            int row_end, Buffer& c) {
  if (absl::Status s = CheckGemm(m, n, k, a, b, c); !s.ok()) return s;
  if (row_begin < 0 || row_end > m || row_begin >= row_end) {
    return absl::InvalidArgumentError(absl::StrCat("GemmTransposedRows: rows [", row_begin, ", ", row_end, ") of ", m));
  }
  // Columns [row_begin, row_end) of A (row length m) against all of B: OpenBLAS sums each element over k in the
  // same order whatever the block, so the rows equal the whole product's.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, row_end - row_begin, n, k, 1.0f, a.data() + row_begin, m,
              b.data(), n, 0.0f, c.data() + static_cast<size_t>(row_begin) * n, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::BiasActivation(Buffer& z, const Buffer& bias, int rows, int cols, bool relu) {
  if (absl::Status s = CheckShape(rows, cols, "BiasActivation"); !s.ok()) return s;
  if (absl::Status s = CheckSize(z, static_cast<size_t>(rows) * cols, "BiasActivation"); !s.ok()) return s;
  if (absl::Status s = CheckSize(bias, cols, "BiasActivation bias"); !s.ok()) return s;
  float* data = z.data();
  const float* b = bias.data();
  for (int r = 0; r < rows; ++r) {
    float* row = data + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const float v = row[c] + b[c];
      row[c] = relu ? std::max(v, 0.0f) : v;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ReluBackward(Buffer& grad, const Buffer& activation, size_t n) {
  if (absl::Status s = CheckSize(grad, n, "ReluBackward"); !s.ok()) return s;
  if (absl::Status s = CheckSize(activation, n, "ReluBackward activation"); !s.ok()) return s;
  float* g = grad.data();
  const float* h = activation.data();
  for (size_t i = 0; i < n; ++i) {
    if (h[i] <= 0.0f) g[i] = 0.0f;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ColumnSum(const Buffer& x, int rows, int cols, Buffer& out) {
  if (absl::Status s = CheckShape(rows, cols, "ColumnSum"); !s.ok()) return s;
  if (absl::Status s = CheckSize(x, static_cast<size_t>(rows) * cols, "ColumnSum"); !s.ok()) return s;
  if (absl::Status s = CheckSize(out, cols, "ColumnSum out"); !s.ok()) return s;
  float* o = out.data();
  std::fill(o, o + cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) o[c] += row[c];
  }
  return absl::OkStatus();
}

absl::StatusOr<LossSums> CpuBackend::SoftmaxCrossEntropy(const Buffer& logits, absl::Span<const int32_t> labels,
                                                         int classes, float grad_scale, Buffer* grad) {
  const size_t rows = labels.size();
  if (classes <= 0) return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: classes must be positive"));
  if (absl::Status s = CheckSize(logits, rows * classes, "SoftmaxCrossEntropy"); !s.ok()) return s;
  if (grad != nullptr) {
    if (absl::Status s = CheckSize(*grad, rows * classes, "SoftmaxCrossEntropy grad"); !s.ok()) return s;
  }
  LossSums sums;
  for (size_t r = 0; r < rows; ++r) {
    const int32_t label = labels[r];
    if (label < 0 || label >= classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", label, " of example ", r, " is outside 0..", classes - 1));
    }
    const float* z = logits.data() + r * classes;
    const float max = *std::max_element(z, z + classes);
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - max));
    const double log_sum = std::log(sum);
    sums.loss += log_sum - static_cast<double>(z[label] - max);
    if (std::max_element(z, z + classes) - z == label) ++sums.correct;
    if (grad != nullptr) {
      float* g = grad->data() + r * classes;
      for (int c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - max) - log_sum);
        g[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
  return sums;
}

}  // namespace tessera
