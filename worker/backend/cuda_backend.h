// The CUDA backend: cuBLAS for GEMM and a few kernels for the rest, all issued in order on one CUDA stream that
// the backend owns. This header needs no CUDA headers; only cuda_backend.cu does.
//
//   absl::StatusOr<std::unique_ptr<Backend>> gpu = CreateCudaBackend(0, CudaBackendOptions());
//   if (!gpu.ok()) return gpu.status();  // FAILED_PRECONDITION, with the reason, on a machine without a GPU
//   TESSERA_ASSIGN_OR_RETURN(auto a, (*gpu)->Allocate(m * k));
//
// Semantics are CpuBackend's (row-major float32, the same size checks and messages, and negative sizes refused
// outright); what differs:
//
//  * Buffers hold device memory. A buffer may only be passed to the backend that allocated it (any other gives
//    INVALID_ARGUMENT). It may outlive that backend; destroying it waits for the device to finish with it.
//  * Gemm, BiasActivation, ReluBackward and ColumnSum enqueue work and return. An error in work already
//    enqueued (a faulting kernel, an ECC error) surfaces from a later call as INTERNAL; the device is then
//    unusable for the rest of the process.
//  * Upload returns once the host values are copied into pinned staging memory (the caller may reuse `src`
//    at once); the transfer to the device goes on in order with the other work. Values larger than the
//    staging memory (2 x 4 MiB) make it wait for the earlier parts of their own transfer.
//  * Download and SoftmaxCrossEntropy block until all work issued before them has finished. StartDownload
//    does not: it records an event on the compute stream, and a second stream of the backend's waits for it and
//    copies into pinned memory (reused across downloads); Wait() then moves the values to their destination.
//    So a layer's gradient leaves the device while the kernels of the layers below run.
//  * Errors: INVALID_ARGUMENT for sizes, foreign buffers and labels out of range (checked on the host before
//    anything is enqueued); RESOURCE_EXHAUSTED when device or pinned memory runs out; INTERNAL for any other
//    CUDA or cuBLAS failure. Every CUDA message names the failing call and the CUDA error.
//  * The sums of SoftmaxCrossEntropy are reduced on the device in a fixed order, so they are deterministic for
//    a given device; they agree with CpuBackend to about 1e-6 relative.
#ifndef TESSERA_WORKER_BACKEND_CUDA_BACKEND_H_
#define TESSERA_WORKER_BACKEND_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

// The CUDA runtime's stream type is `CUstream_st*` (cudaStream_t); declared here so that this header stays
// free of CUDA headers.
struct CUstream_st;

namespace tessera {

struct CudaBackendOptions {
  // The arithmetic of Gemm; every other operation is float32 whatever this says. The relative error of an MLP
  // step's gradients against CpuBackend (Frobenius norm; estimated by emulating the rounding on the host):
  //   kFp32: IEEE float32 (cublasSgemm), ~1e-7 (summation order only).
  //   kTf32: both operands rounded to TF32 (10-bit mantissa, to nearest) on the device, then tensor cores with
  //          float32 accumulation, ~5e-4. The explicit rounding matters: tensor cores may simply drop the low
  //          mantissa bits, and truncation biases every product towards zero (~2.5e-3 over an MLP step).
  //   kBf16: both operands rounded to bfloat16 (7-bit mantissa, to nearest), float32 accumulation and output,
  //          ~4e-3.
  // kTf32 and kBf16 need compute capability 8.0 or newer, and pay one conversion pass over A and B per call.
  enum class Math { kFp32, kTf32, kBf16 };
  Math math = Math::kFp32;
};

// A backend on GPU `device_ordinal` (0-based, as CUDA numbers them under CUDA_VISIBLE_DEVICES).
//
// Returns FAILED_PRECONDITION, with the reason, when that GPU cannot be used: the CUDA driver is missing or too
// old (cudaGetDeviceCount fails), there is no such device, the GPU is unavailable (exclusive mode), this build
// has no kernels for its architecture, or `options` asks for TF32/BF16 on a GPU older than compute capability
// 8.0. This is how "--device=auto" decides to fall back to the CPU. INVALID_ARGUMENT for a negative ordinal;
// RESOURCE_EXHAUSTED when the stream, cuBLAS handle or staging memory cannot be allocated.
//
// The backend's name() is "cuda:<ordinal> (<device name>)", e.g. "cuda:0 (NVIDIA H100 80GB HBM3)".
//
// Thread-compatible, like every Backend: one thread at a time per backend. Each call makes the backend's GPU
// current on the calling thread for its duration only, so one thread may drive backends on several GPUs and
// backends on the same or different GPUs may be used from different threads at once.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_ordinal,
                                                                         const CudaBackendOptions& options);

// How many GPUs this process sees (under CUDA_VISIBLE_DEVICES); 0 when the driver answers with an error.
int CudaDeviceCount();

// The stream on which a backend from CreateCudaBackend issues all of its work (a cudaStream_t), for tools that
// time that work with CUDA events or order their own work after it; nullptr when `backend` is not a CUDA
// backend. Borrowed: valid while the backend lives; do not destroy it.
CUstream_st* CudaBackendStream(const Backend& backend);

}  // namespace tessera

#endif  // TESSERA_WORKER_BACKEND_CUDA_BACKEND_H_
