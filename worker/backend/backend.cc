#include "worker/backend/backend.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"
#include "worker/backend/cpu_backend.h"

#if TESSERA_HAVE_CUDA
#include "worker/backend/cuda_backend.h"
#endif

namespace tessera {
namespace {

// A download that finished before it was returned.
class FinishedDownload final : public PendingDownload {
 public:
  bool Ready() override { return true; }
  absl::Status Wait() override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<PendingDownload>> Backend::StartDownload(const Buffer& src, size_t offset,
                                                                         absl::Span<float> dst) {
  if (offset == 0) {
    TESSERA_RETURN_IF_ERROR(Download(src, dst));
  } else {
    // Download copies from the front only.
    std::vector<float> front(offset + dst.size());
    TESSERA_RETURN_IF_ERROR(Download(src, absl::MakeSpan(front)));
    std::copy(front.begin() + offset, front.end(), dst.begin());
  }
  return std::unique_ptr<PendingDownload>(std::make_unique<FinishedDownload>());
}

absl::Status Backend::GemmTransposedRows(int, int, int, const Buffer&, const Buffer&, int, int, Buffer&) {
  return absl::UnimplementedError(name() + " computes no GEMM a block of rows at a time");
}

#if TESSERA_HAVE_CUDA
namespace {
CudaBackendOptions CudaOptions(const BackendOptions& options) {
  CudaBackendOptions cuda;
  switch (options.math) {
    case BackendOptions::Math::kTf32:
      cuda.math = CudaBackendOptions::Math::kTf32;
      break;
    case BackendOptions::Math::kBf16:
      cuda.math = CudaBackendOptions::Math::kBf16;
      break;
    default:
      cuda.math = CudaBackendOptions::Math::kFp32;
  }
  return cuda;
}
}  // namespace
#endif

absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "auto" || device == "cpu") return -1;
  int ordinal = -1;
  if (!absl::StartsWith(device, "cuda:") || device.size() == 5 ||
      device.find_first_not_of("0123456789", 5) != std::string::npos || !absl::SimpleAtoi(device.substr(5), &ordinal)) {
    return absl::InvalidArgumentError(absl::StrCat("--device: expected auto, cpu or cuda:N, got '", device, "'"));
  }
  return ordinal;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& device, const BackendOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(const int ordinal, ParseDevice(device));
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.cpu_threads));
  if (device == "auto") {
#if TESSERA_HAVE_CUDA
    const int visible = CudaDeviceCount();
    const int ordinal = visible > 0 ? options.local_index % visible : 0;
    absl::StatusOr<std::unique_ptr<Backend>> gpu = CreateCudaBackend(ordinal, CudaOptions(options));
    if (gpu.ok()) {
      LOG(INFO) << "device auto: using " << (*gpu)->name();
      return gpu;
    }
    LOG(INFO) << "device auto: using the CPU, because no GPU answered: " << gpu.status().message();
#else
    LOG(INFO) << "device auto: using the CPU, because this build has no CUDA backend";
#endif
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.cpu_threads));
  }
  // cuda:N
#if TESSERA_HAVE_CUDA
  return CreateCudaBackend(ordinal, CudaOptions(options));
#else
  (void)ordinal;
  return absl::FailedPreconditionError(
      absl::StrCat("--device=", device, ": this build has no CUDA backend (nvcc was not found at configure time)"));
#endif
}

}  // namespace tessera
