// A fully connected classifier (softmax regression when there are no hidden layers) computed on a Backend.
//
// Parameters, in declaration order: "layer<i>/weight" [fan_in, fan_out] (Glorot uniform) and "layer<i>/bias"
// [fan_out] (zeros), for i = 0 .. layers-1. ReLU between layers; the loss is the mean softmax cross-entropy,
// so gradients are means over the batch.
//
//   TESSERA_ASSIGN_OR_RETURN(auto mlp, Mlp::Create(backend.get(), {784, 256, 128, 10}, /*seed=*/1, 256));
//   for (int i = 0; i < mlp->num_parameters(); ++i) TESSERA_RETURN_IF_ERROR(mlp->SetParameter(i, values[i]));
//   TESSERA_ASSIGN_OR_RETURN(LossSums sums, mlp->ForwardBackward(x, labels));
//   TESSERA_RETURN_IF_ERROR(mlp->GetGradient(0, grad0));
#ifndef TESSERA_WORKER_MODELS_MLP_H_
#define TESSERA_WORKER_MODELS_MLP_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"
#include "worker/backend/backend.h"

namespace tessera {

// Not thread-safe.
class Mlp {
 public:
  // `layer_sizes` = {inputs, hidden..., classes}, at least two entries. `backend` is not owned and must outlive
  // the model. Batches may hold up to `max_batch` examples.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Mlp>> Create(Backend* backend, std::vector<int> layer_sizes,
                                                                   uint64_t seed, int max_batch);

  // The layer sizes a ModelSpec asks for, for `inputs` features and `classes` classes.
  static std::vector<int> LayerSizes(const tessera::v1::ModelSpec& spec, int inputs, int classes);

  const std::vector<tessera::v1::ParameterSpec>& parameters() const { return params_; }
  int num_parameters() const { return static_cast<int>(params_.size()); }
  int inputs() const { return sizes_.front(); }
  int classes() const { return sizes_.back(); }
  int max_batch() const { return max_batch_; }
  int layers() const { return static_cast<int>(sizes_.size()) - 1; }

  // Copies host values into parameter `index`; INVALID_ARGUMENT on a size mismatch.
  [[nodiscard]] absl::Status SetParameter(int index, absl::Span<const float> values);
  // Parameter `index` is read from `memory` from now on, without a copy (its values are what `memory` holds
  // when forward or backward reads them): for backends whose buffers are host memory (Backend::host_memory),
  // FAILED_PRECONDITION on others. `memory` must outlive its use; INVALID_ARGUMENT on a size mismatch.
  [[nodiscard]] absl::Status BindParameter(int index, absl::Span<float> memory);
  // Copies parameter `index` (or its gradient from the last ForwardBackward) to the host.
  [[nodiscard]] absl::Status GetParameter(int index, absl::Span<float> out);
  [[nodiscard]] absl::Status GetGradient(int index, absl::Span<float> out);
  // Starts copying values [offset, offset + out.size()) of the gradient of parameter `index` to `out` (see
  // Backend::StartDownload): valid once the returned download's Wait() returned OK, and until the next
  // ForwardBackward.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<PendingDownload>> StartGradientDownload(int index, size_t offset,
                                                                                       absl::Span<float> out);

  // The gradient of parameter `index` in the model's own memory, when that is host memory
  // (Backend::host_memory): valid after a ForwardBackward announced it, until the next ForwardBackward. Empty
  // on a device backend (download it).
  absl::Span<const float> HostGradient(int index) const;

  // Backward computes each weight gradient in blocks of rows of about `values` floats (0: whole layers), where
  // the backend can (Backend::supports_gemm_rows), announcing each finished block (GradientPartReady) so that it
  // can leave before the rest of the layer is done. The gradients are the same bit for bit either way on the
  // CPU, and to within the GEMM's rounding on a GPU (Backend::GemmTransposedRows).
  void set_gradient_block(size_t values) { gradient_block_ = values; }
  // Where layer `layer`'s weight-gradient blocks end, in values of that gradient, ascending; the last is its size.
  std::vector<size_t> WeightGradientBlocks(int layer) const;

  // Called during backward as soon as layer `layer`'s gradients (parameters 2*layer and 2*layer+1) are final,
  // last layer first; an error stops the backward pass and is returned.
  using LayerGradientsReady = std::function<absl::Status(int layer)>;
  // Called before forward uses layer `layer`'s parameters, first layer first: the moment to put them in place
  // (SetParameter) when they arrive layer by layer. An error stops the pass and is returned.
  using LayerNeeded = std::function<absl::Status(int layer)>;
  // Called during backward when the first `values` values of parameter `index` (a weight) are final, before
  // the layer is (LayerGradientsReady); an error stops the backward pass and is returned.
  using GradientPartReady = std::function<absl::Status(int index, size_t values)>;

  // Forward and backward over `labels.size()` examples (x is row-major [batch, inputs]); leaves the gradients of
  // the mean loss in the model, announcing each layer's to `ready` (if set) as backward produces it, and asking
  // `needed` (if set) for each layer's parameters before forward uses them, and each block of a weight
  // gradient but the last to `part` (if set). INVALID_ARGUMENT for a batch larger than max_batch or mismatched
  // sizes.
  [[nodiscard]] absl::StatusOr<LossSums> ForwardBackward(absl::Span<const float> x, absl::Span<const int32_t> labels,
                                                         const LayerGradientsReady& ready = nullptr,
                                                         const LayerNeeded& needed = nullptr,
                                                         const GradientPartReady& part = nullptr);
  // Forward only, in slices of max_batch: summed loss and hits over all examples.
  [[nodiscard]] absl::StatusOr<LossSums> Evaluate(absl::Span<const float> x, absl::Span<const int32_t> labels);

 private:
  Mlp(Backend* backend, std::vector<int> sizes, int max_batch) : backend_(backend), sizes_(std::move(sizes)), max_batch_(max_batch) {}
  absl::StatusOr<LossSums> Forward(absl::Span<const float> x, absl::Span<const int32_t> labels, bool backward,
                                   const LayerGradientsReady& ready, const LayerNeeded& needed,
                                   const GradientPartReady& part);

  Backend* const backend_;  // not owned
  const std::vector<int> sizes_;
  const int max_batch_;
  size_t gradient_block_ = 0;  // values per weight-gradient block; 0: whole layers
  std::vector<tessera::v1::ParameterSpec> params_;
  std::vector<std::unique_ptr<Buffer>> values_;       // per parameter
  std::vector<std::unique_ptr<Buffer>> grads_;        // per parameter
  std::vector<std::unique_ptr<Buffer>> activations_;  // per layer boundary: [max_batch, sizes_[i]]
  std::vector<std::unique_ptr<Buffer>> deltas_;       // per layer boundary, i >= 1
};

}  // namespace tessera

#endif  // TESSERA_WORKER_MODELS_MLP_H_
