#include "worker/models/mlp.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model/param_init.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"

namespace tessera {

std::vector<int> Mlp::LayerSizes(const tessera::v1::ModelSpec& spec, int inputs, int classes) {
  std::vector<int> sizes = {inputs};
  if (spec.has_mlp()) {
    for (int h : spec.mlp().hidden_sizes()) sizes.push_back(h);
  }
  sizes.push_back(classes);
  return sizes;
}

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(Backend* backend, std::vector<int> layer_sizes, uint64_t seed,
                                                 int max_batch) {
  if (layer_sizes.size() < 2) return absl::InvalidArgumentError("an MLP needs at least inputs and classes");
  for (int s : layer_sizes) {
    if (s <= 0) return absl::InvalidArgumentError(absl::StrCat("layer sizes must be positive, got ", s));
  }
  if (max_batch <= 0) return absl::InvalidArgumentError("max_batch must be positive");
  std::unique_ptr<Mlp> mlp(new Mlp(backend, std::move(layer_sizes), max_batch));
  const auto& sizes = mlp->sizes_;
  for (int l = 0; l < mlp->layers(); ++l) {
    tessera::v1::ParameterSpec weight;
    weight.set_name(absl::StrCat("layer", l, "/weight"));
    weight.set_dtype(tessera::v1::DT_FLOAT32);
    weight.add_shape(sizes[l]);
    weight.add_shape(sizes[l + 1]);
    *weight.mutable_init() = GlorotUniform(sizes[l], sizes[l + 1], seed + static_cast<uint64_t>(l));
    tessera::v1::ParameterSpec bias;
    bias.set_name(absl::StrCat("layer", l, "/bias"));
    bias.set_dtype(tessera::v1::DT_FLOAT32);
    bias.add_shape(sizes[l + 1]);
    mlp->params_.push_back(weight);
    mlp->params_.push_back(bias);
  }
  for (const auto& p : mlp->params_) {
    const size_t n = static_cast<size_t>(NumElements(p.shape()));
    TESSERA_ASSIGN_OR_RETURN(auto value, backend->Allocate(n));
    TESSERA_ASSIGN_OR_RETURN(auto grad, backend->Allocate(n));
    std::vector<float> init(n);
    FillInit(p.init(), p.name(), 0, absl::MakeSpan(init));
    TESSERA_RETURN_IF_ERROR(backend->Upload(init, *value));
    mlp->values_.push_back(std::move(value));
    mlp->grads_.push_back(std::move(grad));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto act, backend->Allocate(static_cast<size_t>(max_batch) * sizes[i]));
    TESSERA_ASSIGN_OR_RETURN(auto delta, backend->Allocate(static_cast<size_t>(max_batch) * sizes[i]));
    mlp->activations_.push_back(std::move(act));
    mlp->deltas_.push_back(std::move(delta));
  }
  return mlp;
}

absl::Status Mlp::SetParameter(int index, absl::Span<const float> values) {
  if (index < 0 || index >= num_parameters()) return absl::InvalidArgumentError("parameter index out of range");
  if (values.size() != values_[index]->size()) {
    return absl::InvalidArgumentError(absl::StrCat(params_[index].name(), ": expected ", values_[index]->size(),
                                                   " values, got ", values.size()));
  }
  return backend_->Upload(values, *values_[index]);
}

absl::Status Mlp::BindParameter(int index, absl::Span<float> memory) {
  if (index < 0 || index >= num_parameters()) return absl::InvalidArgumentError("parameter index out of range");
  if (!backend_->host_memory()) {
    return absl::FailedPreconditionError(absl::StrCat(backend_->name(), " computes in memory of its own: upload the "
                                                      "values (SetParameter)"));
  }
  if (memory.size() != values_[index]->size()) {
    return absl::InvalidArgumentError(absl::StrCat(params_[index].name(), ": expected ", values_[index]->size(),
                                                   " values, got ", memory.size()));
  }
  values_[index] = std::make_unique<HostSpanBuffer>(memory);
  return absl::OkStatus();
}

absl::Status Mlp::GetParameter(int index, absl::Span<float> out) {
  if (index < 0 || index >= num_parameters()) return absl::InvalidArgumentError("parameter index out of range");
  return backend_->Download(*values_[index], out);
}

absl::Status Mlp::GetGradient(int index, absl::Span<float> out) {
  if (index < 0 || index >= num_parameters()) return absl::InvalidArgumentError("parameter index out of range");
  return backend_->Download(*grads_[index], out);
}

absl::StatusOr<std::unique_ptr<PendingDownload>> Mlp::StartGradientDownload(int index, size_t offset,
                                                                         absl::Span<float> out) {
  if (index < 0 || index >= num_parameters()) return absl::InvalidArgumentError("parameter index out of range");
  return backend_->StartDownload(*grads_[index], offset, out);
}

absl::Span<const float> Mlp::HostGradient(int index) const {
  if (!backend_->host_memory() || index < 0 || index >= num_parameters()) return {};
  const Buffer& g = *grads_[index];
  return {g.data(), g.size()};
}

std::vector<size_t> Mlp::WeightGradientBlocks(int layer) const {
  const size_t rows = static_cast<size_t>(sizes_[layer]);
  const size_t cols = static_cast<size_t>(sizes_[layer + 1]);
  if (gradient_block_ == 0 || !backend_->supports_gemm_rows()) return {rows * cols};
  const size_t per_block = std::max<size_t>(1, gradient_block_ / cols);
  std::vector<size_t> ends;
  for (size_t r = per_block; r < rows; r += per_block) ends.push_back(r * cols);
  ends.push_back(rows * cols);
  return ends;
}

absl::StatusOr<LossSums> Mlp::Forward(absl::Span<const float> x, absl::Span<const int32_t> labels, bool backward,
                                      const LayerGradientsReady& ready, const LayerNeeded& needed,
                                      const GradientPartReady& part) {
  const int batch = static_cast<int>(labels.size());
  if (batch <= 0 || batch > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", batch, " examples; expected 1..", max_batch_));
  }
  if (x.size() != static_cast<size_t>(batch) * inputs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs: expected ", batch, " x ", inputs(), " values, got ", x.size()));
  }
  TESSERA_RETURN_IF_ERROR(backend_->Upload(x, *activations_[0]));
  const int L = layers();
  for (int l = 0; l < L; ++l) {
    if (needed) TESSERA_RETURN_IF_ERROR(needed(l));
    TESSERA_RETURN_IF_ERROR(backend_->Gemm(false, false, batch, sizes_[l + 1], sizes_[l], 1.0f, *activations_[l],
                                           *values_[2 * l], 0.0f, *activations_[l + 1]));
    TESSERA_RETURN_IF_ERROR(
        backend_->BiasActivation(*activations_[l + 1], *values_[2 * l + 1], batch, sizes_[l + 1], l + 1 < L));
  }
  TESSERA_ASSIGN_OR_RETURN(LossSums sums,
                           backend_->SoftmaxCrossEntropy(*activations_[L], labels, classes(), 1.0f / batch,
                                                         backward ? deltas_[L].get() : nullptr));
  if (!backward) return sums;
  for (int l = L - 1; l >= 0; --l) {
    // dW = A_l^T dZ, db = column sums of dZ, dA_l = dZ W^T masked by the ReLU.
    const std::vector<size_t> blocks = WeightGradientBlocks(l);
    if (blocks.size() == 1) {
      TESSERA_RETURN_IF_ERROR(backend_->Gemm(true, false, sizes_[l], sizes_[l + 1], batch, 1.0f, *activations_[l],
                                             *deltas_[l + 1], 0.0f, *grads_[2 * l]));
    } else {
      int row = 0;
      for (size_t end : blocks) {
        const int end_row = static_cast<int>(end / sizes_[l + 1]);
        TESSERA_RETURN_IF_ERROR(backend_->GemmTransposedRows(sizes_[l], sizes_[l + 1], batch, *activations_[l],
                                                             *deltas_[l + 1], row, end_row, *grads_[2 * l]));
        row = end_row;
        if (part && end < blocks.back()) TESSERA_RETURN_IF_ERROR(part(2 * l, end));
      }
    }
    TESSERA_RETURN_IF_ERROR(backend_->ColumnSum(*deltas_[l + 1], batch, sizes_[l + 1], *grads_[2 * l + 1]));
    if (ready) TESSERA_RETURN_IF_ERROR(ready(l));
    if (l == 0) break;
    TESSERA_RETURN_IF_ERROR(backend_->Gemm(false, true, batch, sizes_[l], sizes_[l + 1], 1.0f, *deltas_[l + 1],
                                           *values_[2 * l], 0.0f, *deltas_[l]));
    TESSERA_RETURN_IF_ERROR(
        backend_->ReluBackward(*deltas_[l], *activations_[l], static_cast<size_t>(batch) * sizes_[l]));
  }
  return sums;
}

absl::StatusOr<LossSums> Mlp::ForwardBackward(absl::Span<const float> x, absl::Span<const int32_t> labels,
                                              const LayerGradientsReady& ready, const LayerNeeded& needed,
                                              const GradientPartReady& part) {
  return Forward(x, labels, /*backward=*/true, ready, needed, part);
}

absl::StatusOr<LossSums> Mlp::Evaluate(absl::Span<const float> x, absl::Span<const int32_t> labels) {
  LossSums total;
  const size_t n = labels.size();
  for (size_t start = 0; start < n; start += max_batch_) {
    const size_t count = std::min<size_t>(max_batch_, n - start);
    TESSERA_ASSIGN_OR_RETURN(LossSums part, Forward(x.subspan(start * inputs(), count * inputs()),
                                                    labels.subspan(start, count), /*backward=*/false, nullptr, nullptr,
                                                    nullptr));
    total.loss += part.loss;
    total.correct += part.correct;
  }
  return total;
}

}  // namespace tessera
