// CudaBackend: cuBLAS for GEMM, small kernels for the elementwise work and the reductions. See cuda_backend.h for
// the contract. Everything runs on one non-blocking stream per backend, so work from other libraries on the
// legacy default stream neither waits for nor delays ours.
#include "worker/backend/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tessera {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Errors

// A CUDA error as a Status naming the call. Out-of-memory is RESOURCE_EXHAUSTED; errors that mean "this GPU
// cannot be used here" are FAILED_PRECONDITION; anything else (a faulting kernel, a lost device) is INTERNAL.
absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  // The runtime also keeps the error as the thread's "last error"; clear it so that the launch check after the
  // next kernel does not report it a second time. (Sticky errors stay: every later call fails, as it should.)
  (void)cudaGetLastError();
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorString(error), " (", cudaGetErrorName(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(call, ": ", cublasGetStatusString(status), " (", cublasGetStatusName(status), ")");
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

#define TESSERA_CUDA_RETURN_IF_ERROR(call) TESSERA_RETURN_IF_ERROR(CudaStatus((call), #call))
#define TESSERA_CUBLAS_RETURN_IF_ERROR(call) TESSERA_RETURN_IF_ERROR(CublasStatus((call), #call))
// Launch errors (a bad configuration, no kernel image) are reported by cudaGetLastError right after <<<>>>.
#define TESSERA_CUDA_RETURN_IF_LAUNCH_FAILED(kernel) \
  TESSERA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "launch of " kernel))

// ---------------------------------------------------------------------------------------------------------
// RAII owners. Each remembers its device and makes it current while it releases, so that owners may be
// destroyed on any thread and in any order. Release errors are ignored: there is no one to report them to, and
// at process exit the runtime may already be unloading.

// Makes `ordinal` the calling thread's current device for the scope, and restores the previous one after.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) : status_(Enter(ordinal)) {}
  ~ScopedDevice() {
    if (restore_) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  absl::Status Enter(int ordinal) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    if (previous_ != ordinal) {
      TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
      restore_ = true;
    }
    return absl::OkStatus();
  }

  int previous_ = 0;
  bool restore_ = false;
  const absl::Status status_;  // declared last: Enter sets the members above
};

struct StreamDestroyer {
  int ordinal;
  void operator()(cudaStream_t stream) const {
    ScopedDevice device(ordinal);
    (void)cudaStreamDestroy(stream);
  }
};
struct EventDestroyer {
  int ordinal;
  void operator()(cudaEvent_t event) const {
    ScopedDevice device(ordinal);
    (void)cudaEventDestroy(event);
  }
};
struct CublasDestroyer {
  int ordinal;
  void operator()(cublasHandle_t handle) const {
    ScopedDevice device(ordinal);
    (void)cublasDestroy(handle);
  }
};
// cudaFree waits for the device to finish with the memory before it releases it.
struct DeviceFree {
  int ordinal;
  void operator()(void* memory) const {
    ScopedDevice device(ordinal);
    (void)cudaFree(memory);
  }
};
struct PinnedFree {
  void operator()(void* memory) const { (void)cudaFreeHost(memory); }
};

using StreamOwner = std::unique_ptr<CUstream_st, StreamDestroyer>;
using EventOwner = std::unique_ptr<CUevent_st, EventDestroyer>;
using CublasOwner = std::unique_ptr<cublasContext, CublasDestroyer>;
using DeviceMemory = std::unique_ptr<void, DeviceFree>;
using PinnedMemory = std::unique_ptr<void, PinnedFree>;

absl::StatusOr<DeviceMemory> AllocateDevice(int ordinal, size_t bytes) {
  void* memory = nullptr;
  if (bytes > 0) TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(&memory, bytes));
  return DeviceMemory(memory, DeviceFree{ordinal});
}

// Device memory that only grows, for operands and partial sums that live for one call. Used in stream order on
// one stream only, so reusing it needs no synchronisation; growing it does (work in flight may still read the
// old block). Not thread-safe.
class Scratch {
 public:
  explicit Scratch(int ordinal) : ordinal_(ordinal), memory_(nullptr, DeviceFree{ordinal}) {}

  absl::StatusOr<void*> Get(size_t bytes, cudaStream_t stream) {
    if (bytes > capacity_) {
      TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      memory_.reset();
      capacity_ = 0;
      TESSERA_ASSIGN_OR_RETURN(memory_, AllocateDevice(ordinal_, bytes));
      capacity_ = bytes;
    }
    return memory_.get();
  }

 private:
  const int ordinal_;
  DeviceMemory memory_;
  size_t capacity_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// Kernels. Elementwise kernels use grid-stride loops over size_t indices, so any n fits a capped grid.

constexpr int kThreads = 256;

unsigned int BlocksFor(size_t n) {
  return static_cast<unsigned int>(std::min<size_t>((n + kThreads - 1) / kThreads, 4096));
}

__device__ size_t GlobalThread() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t GridThreads() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

__global__ void BiasActivationKernel(float* z, const float* bias, size_t n, int cols, bool relu) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = z[i] + bias[i % cols];
    z[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void ReluBackwardKernel(float* grad, const float* activation, size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    if (activation[i] <= 0.0f) grad[i] = 0.0f;
  }
}

// Block (32, kColumnSumRows): threadIdx.x picks a column of the block's 32 (so a warp reads one row's run of
// consecutive columns), threadIdx.y a residue of the row index; the kColumnSumRows partial sums of a column are
// then added in a fixed order, so the result does not depend on scheduling.
constexpr int kColumnSumRows = 16;

__global__ void ColumnSumKernel(const float* x, int rows, int cols, float* out) {
  __shared__ float partial[kColumnSumRows][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += kColumnSumRows) sum += x[static_cast<size_t>(r) * cols + col];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int i = 0; i < kColumnSumRows; ++i) total += partial[i][threadIdx.x];
    out[col] = total;
  }
}

// Rounds to TF32 (8-bit exponent, 10-bit mantissa) to nearest, ties away from zero, keeping the float32 layout:
// add half a TF32 unit to the magnitude bits, then clear the 13 bits TF32 lacks. Inf and NaN pass unchanged.
__device__ float RoundToTf32(float x) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  return __uint_as_float(bits);
}

__device__ void ConvertOperand(float x, float* out) { *out = RoundToTf32(x); }
__device__ void ConvertOperand(float x, __nv_bfloat16* out) { *out = __float2bfloat16_rn(x); }

// Converts A[0, na) and B[0, nb) in one launch (a GEMM of the MLP is often small enough that a second launch
// would cost as much as the conversion).
template <typename T>
__global__ void ConvertOperandsKernel(const float* a, size_t na, const float* b, size_t nb, T* out_a, T* out_b) {
  for (size_t i = GlobalThread(); i < na + nb; i += GridThreads()) {
    if (i < na) {
      ConvertOperand(a[i], &out_a[i]);
    } else {
      ConvertOperand(b[i - na], &out_b[i - na]);
    }
  }
}

// Loss and hits summed over some rows.
struct Sums {
  double loss;
  long long correct;
};

// One warp per row. Lanes stride over the classes, so the reads are coalesced whatever `classes` is; butterfly
// shuffles leave every lane with the row's max, arg-max and sum of exponentials. Each block then writes the sums
// of its rows to partials[blockIdx.x], added in a fixed order.
constexpr int kSoftmaxWarps = kThreads / 32;

__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int rows, int classes,
                                          float grad_scale, float* grad, Sums* partials) {
  __shared__ Sums warp_sums[kSoftmaxWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int row = blockIdx.x * kSoftmaxWarps + warp;
  Sums sums = {0.0, 0};
  if (row < rows) {  // uniform across the warp, so the full-mask shuffles below are safe
    const float* z = logits + static_cast<size_t>(row) * classes;
    // Arg-max with the first maximal index winning, as std::max_element does: a lane scans its classes in
    // increasing order with '>', and the merge prefers the smaller index on a tie.
    float max = -INFINITY;
    int arg = INT_MAX;
    for (int c = lane; c < classes; c += 32) {
      if (arg == INT_MAX || z[c] > max) {
        max = z[c];
        arg = c;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other_max = __shfl_xor_sync(0xffffffffu, max, offset);
      const int other_arg = __shfl_xor_sync(0xffffffffu, arg, offset);
      if (other_arg != INT_MAX && (arg == INT_MAX || other_max > max || (other_max == max && other_arg < arg))) {
        max = other_max;
        arg = other_arg;
      }
    }
    float sum = 0.0f;
    for (int c = lane; c < classes; c += 32) sum += expf(z[c] - max);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float log_sum = logf(sum);
    const int label = labels[row];
    const float label_logit = z[label];  // read by every lane before any lane writes `grad`, which may alias
    __syncwarp();                        // `logits` (lanes of a warp need not run in lockstep)
    if (grad != nullptr) {
      float* g = grad + static_cast<size_t>(row) * classes;
      for (int c = lane; c < classes; c += 32) {
        g[c] = (expf(z[c] - max - log_sum) - (c == label ? 1.0f : 0.0f)) * grad_scale;
      }
    }
    sums.loss = static_cast<double>(log_sum) - static_cast<double>(label_logit - max);
    sums.correct = arg == label ? 1 : 0;
  }
  if (lane == 0) warp_sums[warp] = sums;
  __syncthreads();
  if (threadIdx.x == 0) {
    Sums block = {0.0, 0};
    for (int w = 0; w < kSoftmaxWarps; ++w) {
      block.loss += warp_sums[w].loss;
      block.correct += warp_sums[w].correct;
    }
    partials[blockIdx.x] = block;
  }
}

// One block adds the n partial sums: each thread a fixed strided subset, then a fixed tree.
__global__ void ReduceSumsKernel(const Sums* partials, int n, Sums* total) {
  __shared__ Sums shared[kThreads];
  Sums sums = {0.0, 0};
  for (int i = threadIdx.x; i < n; i += kThreads) {
    sums.loss += partials[i].loss;
    sums.correct += partials[i].correct;
  }
  shared[threadIdx.x] = sums;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      shared[threadIdx.x].loss += shared[threadIdx.x + stride].loss;
      shared[threadIdx.x].correct += shared[threadIdx.x + stride].correct;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *total = shared[0];
}

// ---------------------------------------------------------------------------------------------------------
// Buffers

class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(const Backend* owner, DeviceMemory memory, size_t size)
      : owner_(owner), memory_(std::move(memory)), size_(size) {}
  float* data() override { return static_cast<float*>(memory_.get()); }
  const float* data() const override { return static_cast<const float*>(memory_.get()); }
  size_t size() const override { return size_; }
  const Backend* owner() const { return owner_; }

 private:
  const Backend* const owner_;  // the allocating backend; compared, never dereferenced (it may be gone)
  const DeviceMemory memory_;
  const size_t size_;
};

// ---------------------------------------------------------------------------------------------------------
// The backend

class CudaBackend final : public Backend {
 public:
  // Host <-> device copies go through two pinned chunks of this size: a pageable host array is never handed to
  // the copy engine (which would stage it synchronously in small pieces), pinned memory stays bounded, and the
  // host's memcpy into one chunk overlaps the transfer of the other.
  static constexpr size_t kStagingBytes = size_t{4} << 20;

  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int ordinal, const CudaBackendOptions& options);
  // Waits for the stream to drain first: a transfer may still be reading a staging chunk about to be freed.
  ~CudaBackend() override {
    ScopedDevice device(ordinal_);
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_.get());
    if (copy_stream_ != nullptr) (void)cudaStreamSynchronize(copy_stream_.get());
  }

  std::string name() const override { return name_; }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t n) override;
  absl::Status Upload(absl::Span<const float> src, Buffer& dst) override;
  absl::Status Download(const Buffer& src, absl::Span<float> dst) override;
  absl::StatusOr<std::unique_ptr<PendingDownload>> StartDownload(const Buffer& src, size_t offset,
                                                               absl::Span<float> dst) override;
  absl::Status Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const Buffer& a,
                    const Buffer& b, float beta, Buffer& c) override;
  bool supports_gemm_rows() const override { return true; }
  absl::Status GemmTransposedRows(int m, int n, int k, const Buffer& a, const Buffer& b, int row_begin, int row_end,
                                  Buffer& c) override;
  absl::Status BiasActivation(Buffer& z, const Buffer& bias, int rows, int cols, bool relu) override;
  absl::Status ReluBackward(Buffer& grad, const Buffer& activation, size_t n) override;
  absl::Status ColumnSum(const Buffer& x, int rows, int cols, Buffer& out) override;
  absl::StatusOr<LossSums> SoftmaxCrossEntropy(const Buffer& logits, absl::Span<const int32_t> labels, int classes,
                                               float grad_scale, Buffer* grad) override;

  cudaStream_t stream() const { return stream_.get(); }

 private:
  struct Staging {
    PinnedMemory host;
    EventOwner done;  // recorded after the last transfer that used `host`
  };

  CudaBackend(int ordinal, CudaBackendOptions options)
      : ordinal_(ordinal),
        options_(options),
        stream_(nullptr, StreamDestroyer{ordinal}),
        copy_stream_(nullptr, StreamDestroyer{ordinal}),
        cublas_(nullptr, CublasDestroyer{ordinal}),
        operands_(ordinal),
        labels_(ordinal),
        sums_(ordinal) {}
  absl::Status Init();

  // The device address of `buffer` once it is known to come from this backend and to hold `need` floats.
  absl::StatusOr<float*> DevicePointer(const Buffer& buffer, size_t need, const char* what) const;
  // Pipelined copies through the staging chunks; CopyToHost returns once the bytes are on the host.
  absl::Status CopyToDevice(const void* host, void* device, size_t bytes);
  absl::Status CopyToHost(const void* device, void* host, size_t bytes);
  // The row-major C = alpha op(A) op(B) + beta C on device memory, C being m x n with rows n apart. op(A) starts
  // `a_offset` floats into A, whose rows are `lda` apart; A (`size_a` floats) and B (`size_b`, rows `ldb` apart)
  // are converted whole for the TF32 and BF16 math modes.
  absl::Status DeviceGemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
                          size_t size_a, size_t a_offset, int lda, const float* b, size_t size_b, int ldb, float beta,
                          float* c);
  // Converts the first `na` floats of `a` and `nb` of `b` into operands_ as T (TF32-rounded float or bf16).
  template <typename T>
  absl::StatusOr<std::pair<const T*, const T*>> ConvertOperands(const float* a, size_t na, const float* b, size_t nb);

  friend class CudaPendingDownload;
  // Pinned host memory of at least `bytes` for a download, reused from earlier ones when possible.
  absl::StatusOr<PinnedMemory> TakePinned(size_t bytes);
  void ReturnPinned(PinnedMemory memory, size_t bytes);

  // Constant after Init.
  const int ordinal_;
  const CudaBackendOptions options_;
  std::string name_;
  StreamOwner stream_;
  StreamOwner copy_stream_;  // StartDownload's device-to-host copies
  CublasOwner cublas_;  // bound to stream_
  Staging staging_[2];
  // Used in stream order on stream_.
  Scratch operands_;  // converted GEMM operands
  Scratch labels_;    // int32 labels of SoftmaxCrossEntropy
  Scratch sums_;      // its per-block partial sums, then the total
  // Pinned blocks of finished downloads, by capacity, for the next ones (bounded by kMaxFreePinnedBytes).
  static constexpr size_t kMaxFreePinnedBytes = size_t{256} << 20;
  std::multimap<size_t, PinnedMemory> free_pinned_;
  size_t free_pinned_bytes_ = 0;
};

// A copy on the backend's copy stream into pinned memory; Wait() moves the values to their destination.
class CudaPendingDownload final : public PendingDownload {
 public:
  CudaPendingDownload(CudaBackend* backend, PinnedMemory pinned, size_t bytes, EventOwner copied,
                      absl::Span<float> dst)
      : backend_(backend), pinned_(std::move(pinned)), bytes_(bytes), copied_(std::move(copied)), dst_(dst) {}
  ~CudaPendingDownload() override {
    // The copy may still be writing the pinned block: let it finish before the block is reused.
    if (copied_ != nullptr) {
      ScopedDevice device(backend_->ordinal_);
      (void)cudaEventSynchronize(copied_.get());
    }
    if (pinned_ != nullptr) backend_->ReturnPinned(std::move(pinned_), bytes_);
  }
  bool Ready() override {
    if (done_) return true;
    ScopedDevice device(backend_->ordinal_);
    return cudaEventQuery(copied_.get()) != cudaErrorNotReady;
  }
  absl::Status Wait() override {
    if (done_) return absl::OkStatus();
    ScopedDevice device(backend_->ordinal_);
    TESSERA_RETURN_IF_ERROR(device.status());
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copied_.get()));
    std::memcpy(dst_.data(), pinned_.get(), bytes_);
    done_ = true;
    return absl::OkStatus();
  }

 private:
  CudaBackend* const backend_;  // not owned; outlives the download (one training loop owns both)
  PinnedMemory pinned_;
  const size_t bytes_;
  EventOwner copied_;
  const absl::Span<float> dst_;
  bool done_ = false;
};

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int ordinal, const CudaBackendOptions& options) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend(ordinal, options));
  TESSERA_RETURN_IF_ERROR(backend->Init());
  return backend;
}

absl::Status CudaBackend::Init() {
  int count = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (count == 0) return absl::FailedPreconditionError("cudaGetDeviceCount reports no CUDA device");
  if (ordinal_ >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device ", ordinal_, ": this process sees ", count, " (0..", count - 1, ")"));
  }
  cudaDeviceProp properties;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, ordinal_));
  name_ = absl::StrCat("cuda:", ordinal_, " (", properties.name, ")");
  if (options_.math != CudaBackendOptions::Math::kFp32 && properties.major < 8) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " has compute capability ", properties.major, ".",
                                                      properties.minor, "; TF32 and BF16 GEMMs need 8.0 or newer"));
  }
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  // Fails when this binary holds no code the GPU can run, which would otherwise show only at the first launch.
  cudaFuncAttributes attributes;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, ReluBackwardKernel));

  cudaStream_t stream = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_.reset(stream);
  cudaStream_t copy_stream = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  copy_stream_.reset(copy_stream);
  cublasHandle_t handle = nullptr;
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  cublas_.reset(handle);
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  // Plain float32 unless a GEMM asks otherwise through its compute type (never TF32 behind the caller's back).
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  for (Staging& staging : staging_) {
    void* host = nullptr;
    TESSERA_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, kStagingBytes, cudaHostAllocPortable));
    staging.host.reset(host);
    cudaEvent_t event = nullptr;
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    staging.done = EventOwner(event, EventDestroyer{ordinal_});
  }
  return absl::OkStatus();
}

absl::StatusOr<float*> CudaBackend::DevicePointer(const Buffer& buffer, size_t need, const char* what) const {
  const auto* device_buffer = dynamic_cast<const DeviceBuffer*>(&buffer);
  if (device_buffer == nullptr || device_buffer->owner() != this) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": buffer was not allocated by ", name_));
  }
  if (buffer.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": buffer holds ", buffer.size(), " floats, need ", need));
  }
  // The kernels write through pointers of `const Buffer&` only where the interface hands them a mutable one.
  return const_cast<float*>(buffer.data());
}

absl::Status CudaBackend::CopyToDevice(const void* host, void* device, size_t bytes) {
  const char* from = static_cast<const char*>(host);
  char* to = static_cast<char*>(device);
  for (size_t done = 0, chunk = 0; done < bytes; ++chunk) {
    Staging& staging = staging_[chunk % 2];
    const size_t length = std::min(kStagingBytes, bytes - done);
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging.done.get()));  // its last transfer is over
    std::memcpy(staging.host.get(), from + done, length);
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(to + done, staging.host.get(), length, cudaMemcpyHostToDevice, stream_.get()));
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging.done.get(), stream_.get()));
    done += length;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(const void* device, void* host, size_t bytes) {
  const char* from = static_cast<const char*>(device);
  char* to = static_cast<char*>(host);
  // pending[s] = where the chunk in flight into staging_[s] goes, and how long it is.
  std::pair<size_t, size_t> pending[2] = {{0, 0}, {0, 0}};
  auto drain = [&](int s) -> absl::Status {
    if (pending[s].second == 0) return absl::OkStatus();
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_[s].done.get()));
    std::memcpy(to + pending[s].first, staging_[s].host.get(), pending[s].second);
    pending[s].second = 0;
    return absl::OkStatus();
  };
  for (size_t done = 0, chunk = 0; done < bytes; ++chunk) {
    const int s = static_cast<int>(chunk % 2);
    TESSERA_RETURN_IF_ERROR(drain(s));  // copy out this slot's previous chunk while the other one transfers
    const size_t length = std::min(kStagingBytes, bytes - done);
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staging_[s].host.get(), from + done, length, cudaMemcpyDeviceToHost, stream_.get()));
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_[s].done.get(), stream_.get()));
    pending[s] = {done, length};
    done += length;
  }
  TESSERA_RETURN_IF_ERROR(drain(0));
  TESSERA_RETURN_IF_ERROR(drain(1));
  // Also waits for work enqueued before the copies, and reports any error it met.
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Buffer>> CudaBackend::Allocate(size_t n) {
  if (n > SIZE_MAX / sizeof(float)) {
    return absl::ResourceExhaustedError(absl::StrCat("Allocate: ", n, " floats do not fit in memory"));
  }
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  absl::StatusOr<DeviceMemory> memory = AllocateDevice(ordinal_, n * sizeof(float));
  if (!memory.ok()) {
    return absl::Status(memory.status().code(),
                        absl::StrCat("Allocate(", n, " floats) on ", name_, ": ", memory.status().message()));
  }
  return std::unique_ptr<Buffer>(std::make_unique<DeviceBuffer>(this, std::move(*memory), n));
}

absl::Status CudaBackend::Upload(absl::Span<const float> src, Buffer& dst) {
  TESSERA_ASSIGN_OR_RETURN(float* to, DevicePointer(dst, src.size(), "Upload"));
  if (src.empty()) return absl::OkStatus();
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  return CopyToDevice(src.data(), to, src.size() * sizeof(float));
}

absl::Status CudaBackend::Download(const Buffer& src, absl::Span<float> dst) {
  TESSERA_ASSIGN_OR_RETURN(const float* from, DevicePointer(src, dst.size(), "Download"));
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  return CopyToHost(from, dst.data(), dst.size() * sizeof(float));
}

absl::StatusOr<PinnedMemory> CudaBackend::TakePinned(size_t bytes) {
  auto it = free_pinned_.lower_bound(bytes);
  if (it != free_pinned_.end() && it->first <= 2 * bytes) {
    PinnedMemory memory = std::move(it->second);
    free_pinned_bytes_ -= it->first;
    free_pinned_.erase(it);
    return memory;
  }
  void* host = nullptr;
  const cudaError_t error = cudaHostAlloc(&host, std::max<size_t>(bytes, 1), cudaHostAllocPortable);
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat("cudaHostAlloc(", bytes, " bytes): out of pinned memory"));
  }
  TESSERA_CUDA_RETURN_IF_ERROR(error);
  return PinnedMemory(host);
}

void CudaBackend::ReturnPinned(PinnedMemory memory, size_t bytes) {
  if (free_pinned_bytes_ + bytes > kMaxFreePinnedBytes) return;  // freed
  free_pinned_bytes_ += bytes;
  free_pinned_.emplace(bytes, std::move(memory));
}

absl::StatusOr<std::unique_ptr<PendingDownload>> CudaBackend::StartDownload(const Buffer& src, size_t offset,
                                                                            absl::Span<float> dst) {
  TESSERA_ASSIGN_OR_RETURN(const float* start, DevicePointer(src, offset + dst.size(), "StartDownload"));
  const float* from = start + offset;
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  const size_t bytes = dst.size() * sizeof(float);
  // The copy stream waits for the compute stream's work so far (the gradient being produced), and only that.
  cudaEvent_t produced = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
  EventOwner produced_owner(produced, EventDestroyer{ordinal_});
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(produced, stream_.get()));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_.get(), produced, 0));
  TESSERA_ASSIGN_OR_RETURN(PinnedMemory pinned, TakePinned(bytes));
  cudaEvent_t copied = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  EventOwner copied_owner(copied, EventDestroyer{ordinal_});
  if (bytes > 0) {
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(pinned.get(), from, bytes, cudaMemcpyDeviceToHost, copy_stream_.get()));
  }
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied, copy_stream_.get()));
  return std::unique_ptr<PendingDownload>(
      std::make_unique<CudaPendingDownload>(this, std::move(pinned), bytes, std::move(copied_owner), dst));
}

template <typename T>
absl::StatusOr<std::pair<const T*, const T*>> CudaBackend::ConvertOperands(const float* a, size_t na, const float* b,
                                                                           size_t nb) {
  const size_t b_offset = (na * sizeof(T) + 255) / 256 * 256;  // keep B aligned for the tensor-core kernels
  TESSERA_ASSIGN_OR_RETURN(void* memory, operands_.Get(b_offset + nb * sizeof(T), stream_.get()));
  T* out_a = static_cast<T*>(memory);
  T* out_b = reinterpret_cast<T*>(static_cast<char*>(memory) + b_offset);
  ConvertOperandsKernel<T><<<BlocksFor(na + nb), kThreads, 0, stream_.get()>>>(a, na, b, nb, out_a, out_b);
  TESSERA_CUDA_RETURN_IF_LAUNCH_FAILED("ConvertOperandsKernel");
  return std::pair<const T*, const T*>(out_a, out_b);
}

absl::Status CudaBackend::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const Buffer& a,
                               const Buffer& b, float beta, Buffer& c) {
  if (m <= 0 || n <= 0 || k <= 0)
    return absl::InvalidArgumentError(absl::StrCat("Gemm: bad sizes ", m, "x", n, "x", k));
  const size_t size_a = static_cast<size_t>(m) * k, size_b = static_cast<size_t>(k) * n;
  TESSERA_ASSIGN_OR_RETURN(const float* da, DevicePointer(a, size_a, "Gemm A"));
  TESSERA_ASSIGN_OR_RETURN(const float* db, DevicePointer(b, size_b, "Gemm B"));
  TESSERA_ASSIGN_OR_RETURN(float* dc, DevicePointer(c, static_cast<size_t>(m) * n, "Gemm C"));
  return DeviceGemm(transpose_a, transpose_b, m, n, k, alpha, da, size_a, 0, transpose_a ? m : k, db, size_b,
                    transpose_b ? k : n, beta, dc);
}

absl::Status CudaBackend::GemmTransposedRows(int m, int n, int k, const Buffer& a, const Buffer& b, int row_begin,
                                             int row_end, Buffer& c) {
  if (m <= 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GemmTransposedRows: bad sizes ", m, "x", n, "x", k));
  }
  if (row_begin < 0 || row_end > m || row_begin >= row_end) {
    return absl::InvalidArgumentError(absl::StrCat("GemmTransposedRows: rows [", row_begin, ", ", row_end, ") of ", m));
  }
  const size_t size_a = static_cast<size_t>(k) * m, size_b = static_cast<size_t>(k) * n;
  TESSERA_ASSIGN_OR_RETURN(const float* da, DevicePointer(a, size_a, "GemmTransposedRows A"));
  TESSERA_ASSIGN_OR_RETURN(const float* db, DevicePointer(b, size_b, "GemmTransposedRows B"));
  TESSERA_ASSIGN_OR_RETURN(float* dc, DevicePointer(c, static_cast<size_t>(m) * n, "GemmTransposedRows C"));
  // Columns [row_begin, row_end) of A (rows m apart) against all of B, into the same rows of C.
  return DeviceGemm(true, false, row_end - row_begin, n, k, 1.0f, da, size_a, static_cast<size_t>(row_begin), m, db,
                    size_b, n, 0.0f, dc + static_cast<size_t>(row_begin) * n);
}

absl::Status CudaBackend::DeviceGemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                                     const float* a, size_t size_a, size_t a_offset, int lda, const float* b,
                                     size_t size_b, int ldb, float beta, float* c) {
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());

  // cuBLAS is column-major, and a row-major matrix is its transpose seen column-major. So the row-major
  // C = op(A) op(B) (m x n) is computed as the column-major C^T = op(B)^T op(A)^T (n x m): B goes first, the
  // transpose flags stay with their operands, and the leading dimensions are the row-major row lengths.
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasHandle_t handle = cublas_.get();
  switch (options_.math) {
    case CudaBackendOptions::Math::kFp32:
      TESSERA_CUBLAS_RETURN_IF_ERROR(
          cublasSgemm(handle, op_b, op_a, n, m, k, &alpha, b, ldb, a + a_offset, lda, &beta, c, n));
      return absl::OkStatus();
    case CudaBackendOptions::Math::kTf32: {
      TESSERA_ASSIGN_OR_RETURN(auto operands, ConvertOperands<float>(a, size_a, b, size_b));
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, operands.second, CUDA_R_32F, ldb,
                                                  operands.first + a_offset, CUDA_R_32F, lda, &beta, c, CUDA_R_32F, n,
                                                  CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
      return absl::OkStatus();
    }
    case CudaBackendOptions::Math::kBf16: {
      TESSERA_ASSIGN_OR_RETURN(auto operands, ConvertOperands<__nv_bfloat16>(a, size_a, b, size_b));
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, operands.second, CUDA_R_16BF,
                                                  ldb, operands.first + a_offset, CUDA_R_16BF, lda, &beta, c,
                                                  CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("Gemm: unknown CudaBackendOptions::Math");
}

absl::Status CudaBackend::BiasActivation(Buffer& z, const Buffer& bias, int rows, int cols, bool relu) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat("BiasActivation: bad sizes ", rows, "x", cols));
  }
  const size_t n = static_cast<size_t>(rows) * cols;
  TESSERA_ASSIGN_OR_RETURN(float* dz, DevicePointer(z, n, "BiasActivation"));
  TESSERA_ASSIGN_OR_RETURN(const float* dbias, DevicePointer(bias, cols, "BiasActivation bias"));
  if (n == 0) return absl::OkStatus();
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  BiasActivationKernel<<<BlocksFor(n), kThreads, 0, stream_.get()>>>(dz, dbias, n, cols, relu);
  TESSERA_CUDA_RETURN_IF_LAUNCH_FAILED("BiasActivationKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::ReluBackward(Buffer& grad, const Buffer& activation, size_t n) {
  TESSERA_ASSIGN_OR_RETURN(float* dgrad, DevicePointer(grad, n, "ReluBackward"));
  TESSERA_ASSIGN_OR_RETURN(const float* dact, DevicePointer(activation, n, "ReluBackward activation"));
  if (n == 0) return absl::OkStatus();
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  ReluBackwardKernel<<<BlocksFor(n), kThreads, 0, stream_.get()>>>(dgrad, dact, n);
  TESSERA_CUDA_RETURN_IF_LAUNCH_FAILED("ReluBackwardKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::ColumnSum(const Buffer& x, int rows, int cols, Buffer& out) {
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError(absl::StrCat("ColumnSum: bad sizes ", rows, "x", cols));
  TESSERA_ASSIGN_OR_RETURN(const float* dx, DevicePointer(x, static_cast<size_t>(rows) * cols, "ColumnSum"));
  TESSERA_ASSIGN_OR_RETURN(float* dout, DevicePointer(out, cols, "ColumnSum out"));
  if (cols == 0) return absl::OkStatus();
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());
  // rows == 0 still launches: the kernel then writes the zeros CpuBackend writes.
  ColumnSumKernel<<<(cols + 31) / 32, dim3(32, kColumnSumRows), 0, stream_.get()>>>(dx, rows, cols, dout);
  TESSERA_CUDA_RETURN_IF_LAUNCH_FAILED("ColumnSumKernel");
  return absl::OkStatus();
}

absl::StatusOr<LossSums> CudaBackend::SoftmaxCrossEntropy(const Buffer& logits, absl::Span<const int32_t> labels,
                                                          int classes, float grad_scale, Buffer* grad) {
  const size_t rows = labels.size();
  if (classes < 0 || rows > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SoftmaxCrossEntropy: bad sizes ", rows, " examples x ", classes, " classes"));
  }
  const size_t n = rows * classes;
  TESSERA_ASSIGN_OR_RETURN(const float* dlogits, DevicePointer(logits, n, "SoftmaxCrossEntropy"));
  float* dgrad = nullptr;
  if (grad != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(dgrad, DevicePointer(*grad, n, "SoftmaxCrossEntropy grad"));
  }
  // Labels are checked here, before anything is enqueued: the kernel indexes the logits with them.
  for (size_t r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", labels[r], " of example ", r, " is outside 0..", classes - 1));
    }
  }
  if (rows == 0) return LossSums();
  ScopedDevice device(ordinal_);
  TESSERA_RETURN_IF_ERROR(device.status());

  TESSERA_ASSIGN_OR_RETURN(void* dlabels, labels_.Get(rows * sizeof(int32_t), stream_.get()));
  TESSERA_RETURN_IF_ERROR(CopyToDevice(labels.data(), dlabels, rows * sizeof(int32_t)));
  const int blocks = static_cast<int>((rows + kSoftmaxWarps - 1) / kSoftmaxWarps);
  TESSERA_ASSIGN_OR_RETURN(void* dsums, sums_.Get((blocks + 1) * sizeof(Sums), stream_.get()));
  Sums* partials = static_cast<Sums*>(dsums);
  Sums* total = partials + blocks;
  SoftmaxCrossEntropyKernel<<<blocks, kThreads, 0, stream_.get()>>>(
      dlogits, static_cast<const int32_t*>(dlabels), static_cast<int>(rows), classes, grad_scale, dgrad, partials);
  TESSERA_CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxCrossEntropyKernel");
  ReduceSumsKernel<<<1, kThreads, 0, stream_.get()>>>(partials, blocks, total);
  TESSERA_CUDA_RETURN_IF_LAUNCH_FAILED("ReduceSumsKernel");
  Sums host;
  TESSERA_RETURN_IF_ERROR(CopyToHost(total, &host, sizeof(host)));
  LossSums sums;
  sums.loss = host.loss;
  sums.correct = host.correct;
  return sums;
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_ordinal, const CudaBackendOptions& options) {
  if (device_ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ordinal must be >= 0, got ", device_ordinal));
  }
  if (options.math != CudaBackendOptions::Math::kFp32 && options.math != CudaBackendOptions::Math::kTf32 &&
      options.math != CudaBackendOptions::Math::kBf16) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBackendOptions: unknown math ", static_cast<int>(options.math)));
  }
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create(device_ordinal, options);
  if (!backend.ok()) {
    // Whatever stops the GPU from starting up (other than memory) means "this GPU cannot be used": callers such
    // as --device=auto move on to the CPU.
    const absl::StatusCode code = absl::IsResourceExhausted(backend.status()) ? absl::StatusCode::kResourceExhausted
                                                                              : absl::StatusCode::kFailedPrecondition;
    return absl::Status(code, absl::StrCat("cuda:", device_ordinal, ": ", backend.status().message()));
  }
  return std::unique_ptr<Backend>(std::move(*backend));
}

CUstream_st* CudaBackendStream(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda == nullptr ? nullptr : cuda->stream();
}

}  // namespace tessera
