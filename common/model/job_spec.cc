#include "common/model/job_spec.h"

#include <algorithm>
#include <limits>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace tessera {
namespace {

using tessera::v1::ConsistencySpec;
using tessera::v1::DataSpec;
using tessera::v1::JobSpec;
using tessera::v1::OptimizerSpec;

// Keeps the first error of a text-format parse, with its position.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

absl::Status FieldError(std::string_view field, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("job field ", std::string(field), ": ", std::string(problem)));
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(std::string_view text, std::string_view origin) {
  JobSpec job;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') {
    google::protobuf::util::JsonParseOptions options;
    auto status = google::protobuf::util::JsonStringToMessage(std::string(text), &job, options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(origin), ": not a valid JSON JobSpec: ", std::string(status.message())));
    }
    return job;
  }
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &job)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(origin), ": ", errors.error()));
  }
  return job;
}

namespace {

// Clears in `to` every field the text of `tree` names (recursing into messages it names), so that a merge
// afterwards sets exactly what the text says: lists replaced as a whole, and zero values (which a proto3 merge
// skips) taken too.
void ClearNamedFields(const google::protobuf::TextFormat::ParseInfoTree& tree, google::protobuf::Message& to) {
  const google::protobuf::Descriptor* descriptor = to.GetDescriptor();
  const google::protobuf::Reflection* reflection = to.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const int index = field->is_repeated() ? 0 : -1;
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated()) {
      if (const auto* nested = tree.GetTreeForNested(field, index); nested != nullptr) {
        ClearNamedFields(*nested, *reflection->MutableMessage(&to, field));
      }
    } else if (tree.GetLocation(field, index).line >= 0) {
      reflection->ClearField(&to, field);
    }
  }
}

}  // namespace

int64_t StopClock(const JobSpec& job, int64_t steps_per_epoch) {
  int64_t stop = std::numeric_limits<int64_t>::max();
  if (job.stop().max_steps() > 0) stop = job.stop().max_steps();
  if (job.stop().epochs() > 0) stop = std::min(stop, job.stop().epochs() * steps_per_epoch);
  return stop;
}

std::string TargetReachedReason(const JobSpec& job, double accuracy) {
  const float target = job.stop().target_accuracy();
  if (!(target > 0 && accuracy >= target)) return "";
  return absl::StrCat("test accuracy ", accuracy, " reached the target ", target);
}

absl::Status MergeJobOverrides(std::string_view text, JobSpec& job) {
  JobSpec overrides;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  google::protobuf::TextFormat::ParseInfoTree tree;
  parser.WriteLocationsTo(&tree);
  if (!parser.MergeFromString(std::string(text), &overrides)) {
    return absl::InvalidArgumentError(absl::StrCat("job overrides: ", errors.error()));
  }
  JobSpec merged = job;
  ClearNamedFields(tree, merged);
  merged.MergeFrom(overrides);
  job = std::move(merged);
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file ", path));
  std::stringstream text;
  text << in.rdbuf();
  TESSERA_ASSIGN_OR_RETURN(JobSpec job, ParseJobSpec(text.str(), path));
  ApplyJobDefaults(job);
  TESSERA_RETURN_IF_ERROR(Annotate(ValidateJobSpec(job), path));
  return job;
}

void ApplyJobDefaults(JobSpec& job) {
  DataSpec& data = *job.mutable_data();
  if (data.format() == DataSpec::FORMAT_UNSPECIFIED) data.set_format(DataSpec::IDX);
  if (data.format() == DataSpec::IDX) {
    const std::string dir = kFashionMnistDir;
    if (data.train_images().empty()) data.set_train_images(dir + "/train-images-idx3-ubyte.gz");
    if (data.train_labels().empty()) data.set_train_labels(dir + "/train-labels-idx1-ubyte.gz");
    if (data.test_images().empty()) data.set_test_images(dir + "/t10k-images-idx3-ubyte.gz");
    if (data.test_labels().empty()) data.set_test_labels(dir + "/t10k-labels-idx1-ubyte.gz");
  } else if (data.format() == DataSpec::SYNTHETIC) {
    if (data.synthetic_train_examples() == 0) data.set_synthetic_train_examples(8192);
    if (data.synthetic_test_examples() == 0) data.set_synthetic_test_examples(2048);
    if (data.synthetic_features() == 0) data.set_synthetic_features(32);
    if (data.synthetic_classes() == 0) data.set_synthetic_classes(4);
  }
  OptimizerSpec& opt = *job.mutable_optimizer();
  if (opt.kind() == OptimizerSpec::KIND_UNSPECIFIED) opt.set_kind(OptimizerSpec::SGD);
  const bool adam = opt.kind() == OptimizerSpec::ADAM || opt.kind() == OptimizerSpec::ADAMW;
  const bool script = opt.kind() == OptimizerSpec::SCRIPT;
  // SCRIPT: an update arrives whole (its rate is the script's), scaled only by the staleness-aware factor.
  if (opt.learning_rate() == 0) opt.set_learning_rate(script ? 1.0f : adam ? 0.001f : 0.05f);
  if (!opt.has_weight_decay()) opt.set_weight_decay(opt.kind() == OptimizerSpec::ADAMW ? 0.01f : 0.0f);
  if (opt.schedule().total_steps() == 0 && job.stop().max_steps() > 0 && !script) {
    opt.mutable_schedule()->set_total_steps(job.stop().max_steps());
  }
  if (opt.schedule().kind() == tessera::v1::ScheduleSpec::STEP && opt.schedule().gamma() == 0) {
    opt.mutable_schedule()->set_gamma(0.1f);
  }
  if (adam) {
    if (opt.beta1() == 0) opt.set_beta1(0.9f);
    if (opt.beta2() == 0) opt.set_beta2(0.999f);
    if (opt.epsilon() == 0) opt.set_epsilon(1e-8f);
  }
  if (job.batch_size() == 0) job.set_batch_size(64);
  ConsistencySpec& consistency = *job.mutable_consistency();
  if (consistency.mode() == ConsistencySpec::MODE_UNSPECIFIED) consistency.set_mode(ConsistencySpec::SYNC);
  if (consistency.async_momentum() == ConsistencySpec::ASYNC_MOMENTUM_UNSPECIFIED) {
    consistency.set_async_momentum(ConsistencySpec::CORRECTED);
  }
  if (consistency.balance() == ConsistencySpec::BALANCE_UNSPECIFIED) consistency.set_balance(ConsistencySpec::EQUAL);
  if (job.eval_every_steps() == 0) job.set_eval_every_steps(100);
  if (job.chunk_bytes() == 0) job.set_chunk_bytes(65536);
  if (job.checkpoint().keep() == 0) job.mutable_checkpoint()->set_keep(3);
  if (job.cluster().num_servers() == 0) job.mutable_cluster()->set_num_servers(1);
  if (job.cluster().num_workers() == 0) job.mutable_cluster()->set_num_workers(1);
}

absl::Status CheckModelSize(const JobSpec& job, int64_t inputs, int64_t classes) {
  // Each layer's width and the field that sets it; the ends only where known.
  std::vector<std::pair<int64_t, std::string>> widths;
  if (inputs > 0) widths.emplace_back(inputs, "the input width (data)");
  for (int i = 0; i < job.model().mlp().hidden_sizes_size(); ++i) {
    widths.emplace_back(job.model().mlp().hidden_sizes(i), absl::StrCat("model.mlp.hidden_sizes[", i, "]"));
  }
  if (classes > 0) widths.emplace_back(classes, "the number of classes (data)");
  // A worker's batches: a balanced SYNC job may give one worker the whole global batch; evaluation uses 1000.
  const int64_t batch =
      std::max<int64_t>(int64_t{std::max(1, job.batch_size())} * std::max(1, job.cluster().num_workers()), 1000);
  int64_t parameters = 0, activations = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    activations += batch * widths[i].first;  // widths <= 2^20 and batch <= 2^20: no overflow
    if (activations > kMaxActivationElements) {
      return FieldError(widths[i].second, absl::StrCat("a batch of ", batch, " through layers this wide needs more than ",
                                                       kMaxActivationElements, " activations per worker"));
    }
    if (i + 1 == widths.size()) break;
    parameters += widths[i].first * widths[i + 1].first + widths[i + 1].first;  // weight and bias
    if (parameters > kMaxModelElements) {
      return FieldError(widths[i + 1].second,
                        absl::StrCat("the model would have more than ", kMaxModelElements, " parameters (",
                                     kMaxModelElements * 4 >> 30, " GiB of float32 per copy)"));
    }
  }
  return absl::OkStatus();
}

namespace {

// model.mlp: layer count and widths.
absl::Status CheckModel(const JobSpec& job) {
  if (job.model().mlp().hidden_sizes_size() > kMaxDimensions * 8) {
    return FieldError("model.mlp.hidden_sizes", absl::StrCat("at most ", kMaxDimensions * 8, " layers"));
  }
  for (int i = 0; i < job.model().mlp().hidden_sizes_size(); ++i) {
    if (job.model().mlp().hidden_sizes(i) <= 0 || job.model().mlp().hidden_sizes(i) > kMaxLayerWidth) {
      return FieldError(absl::StrCat("model.mlp.hidden_sizes[", i, "]"),
                        absl::StrCat("expected a layer width of 1 .. 1048576, got ", job.model().mlp().hidden_sizes(i)));
    }
  }
  return absl::OkStatus();
}

// data: synthetic sizes, or IDX files, not both.
absl::Status CheckData(const JobSpec& job) {
  const DataSpec& data = job.data();
  if (data.format() == DataSpec::SYNTHETIC) {
    if (!data.train_images().empty() || !data.test_images().empty()) {
      return FieldError("data.train_images", "file paths contradict format SYNTHETIC; remove one of them");
    }
    if (data.synthetic_train_examples() < 0 || data.synthetic_test_examples() < 0 || data.synthetic_features() < 0 ||
        data.synthetic_classes() < 2) {
      return FieldError("data.synthetic_*", "expected positive sizes and at least 2 classes");
    }
    if (data.synthetic_classes() > kMaxLayerWidth || data.synthetic_features() > kMaxLayerWidth) {
      return FieldError(data.synthetic_classes() > kMaxLayerWidth ? "data.synthetic_classes" : "data.synthetic_features",
                        absl::StrCat("expected at most ", kMaxLayerWidth, ", got ",
                                     std::max<int64_t>(data.synthetic_classes(), data.synthetic_features())));
    }
    const int64_t examples = std::max<int64_t>(data.synthetic_train_examples(), data.synthetic_test_examples());
    if (examples * std::max<int64_t>(1, data.synthetic_features()) > kMaxDatasetElements) {
      return FieldError("data.synthetic_train_examples",
                        absl::StrCat(examples, " examples of ", data.synthetic_features(), " features exceed ",
                                     kMaxDatasetElements, " values, more than a worker should hold"));
    }
  } else if (data.synthetic_train_examples() != 0 || data.synthetic_features() != 0) {
    return FieldError("data.synthetic_train_examples", "synthetic sizes contradict format IDX; remove one of them");
  }
  return absl::OkStatus();
}

// optimizer and its schedule; SCRIPT takes none of the servers' settings.
absl::Status CheckOptimizer(const JobSpec& job) {
  const OptimizerSpec& opt = job.optimizer();
  if (opt.kind() == OptimizerSpec::ROUND_MEAN) {
    return FieldError("optimizer.kind", "ROUND_MEAN is what SCRIPT becomes on a SYNC job's servers; write SCRIPT");
  }
  if (opt.kind() == OptimizerSpec::SCRIPT) {
    OptimizerSpec bare;
    bare.set_kind(OptimizerSpec::SCRIPT);
    bare.set_learning_rate(1.0f);
    bare.set_weight_decay(0.0f);
    if (!google::protobuf::util::MessageDifferencer::Equals(opt, bare)) {
      return FieldError("optimizer", "SCRIPT runs the workers' own optimizer: the learning rate, momentum, betas, "
                                     "weight decay, no_decay, schedule and clipping are the script's; remove them here");
    }
  }
  if (!(opt.learning_rate() > 0) || !std::isfinite(opt.learning_rate())) {
    return FieldError("optimizer.learning_rate", absl::StrCat("expected a finite value > 0, got ", opt.learning_rate()));
  }
  if (!(opt.momentum() >= 0 && opt.momentum() < 1)) {
    return FieldError("optimizer.momentum", absl::StrCat("expected in [0, 1), got ", opt.momentum()));
  }
  const bool adam = opt.kind() == OptimizerSpec::ADAM || opt.kind() == OptimizerSpec::ADAMW;
  if (adam && opt.momentum() != 0) {
    return FieldError("optimizer.momentum", "applies to SGD only; Adam uses beta1");
  }
  if (!(opt.weight_decay() >= 0) || !std::isfinite(opt.weight_decay())) {
    return FieldError("optimizer.weight_decay", absl::StrCat("expected a finite value >= 0, got ", opt.weight_decay()));
  }
  if (!(opt.clip_global_norm() >= 0) || !std::isfinite(opt.clip_global_norm())) {
    return FieldError("optimizer.clip_global_norm",
                      absl::StrCat("expected a finite value >= 0 (0: off), got ", opt.clip_global_norm()));
  }
  for (const std::string& pattern : opt.no_decay()) {
    if (pattern.empty()) return FieldError("optimizer.no_decay", "an empty pattern would match every parameter");
  }
  const tessera::v1::ScheduleSpec& schedule = opt.schedule();
  if (schedule.warmup_steps() < 0 || schedule.total_steps() < 0 || schedule.step_every() < 0 ||
      schedule.scaling_reference_batch() < 0) {
    return FieldError("optimizer.schedule", "steps and the reference batch must be >= 0");
  }
  if ((schedule.kind() == tessera::v1::ScheduleSpec::COSINE || schedule.kind() == tessera::v1::ScheduleSpec::LINEAR) &&
      schedule.total_steps() <= schedule.warmup_steps()) {
    return FieldError("optimizer.schedule.total_steps",
                      absl::StrCat("a decay needs total_steps after the warmup (", schedule.warmup_steps(),
                                   " steps), got ", schedule.total_steps(), " (it defaults to stop.max_steps)"));
  }
  if (!(schedule.min_factor() >= 0 && schedule.min_factor() <= 1)) {
    return FieldError("optimizer.schedule.min_factor", absl::StrCat("expected in [0, 1], got ", schedule.min_factor()));
  }
  if (schedule.kind() == tessera::v1::ScheduleSpec::STEP &&
      (schedule.step_every() <= 0 || !(schedule.gamma() > 0) || !std::isfinite(schedule.gamma()))) {
    return FieldError("optimizer.schedule", "STEP needs step_every > 0 and gamma > 0");
  }
  if (!tessera::v1::ScheduleSpec::Kind_IsValid(schedule.kind()) || !OptimizerSpec::Kind_IsValid(opt.kind())) {
    return FieldError("optimizer", "unknown optimizer or schedule kind");
  }
  if (adam &&
      !(opt.beta1() >= 0 && opt.beta1() < 1 && opt.beta2() >= 0 && opt.beta2() < 1 && opt.epsilon() > 0 &&
        std::isfinite(opt.epsilon()))) {
    return FieldError("optimizer.beta1/beta2/epsilon", "expected betas in [0, 1) and epsilon > 0");
  }
  return absl::OkStatus();
}

// batch_size, and the model's size where the data's widths are known.
absl::Status CheckBatchAndModelSize(const JobSpec& job) {
  if (job.batch_size() <= 0) return FieldError("batch_size", absl::StrCat("expected > 0, got ", job.batch_size()));
  if (int64_t{job.batch_size()} * std::max(1, job.cluster().num_workers()) > kMaxGlobalBatch) {
    return FieldError("batch_size", absl::StrCat(job.batch_size(), " per worker x ", job.cluster().num_workers(),
                                                 " workers exceed a global batch of ", kMaxGlobalBatch));
  }
  // Synthetic data: the widths are known now; IDX: the worker checks again once it has read its files.
  const DataSpec& data = job.data();
  const bool synthetic = data.format() == DataSpec::SYNTHETIC;
  TESSERA_RETURN_IF_ERROR(CheckModelSize(job, synthetic ? data.synthetic_features() : 0,
                                         synthetic ? data.synthetic_classes() : 0));
  return absl::OkStatus();
}

// transport and wire.
absl::Status CheckDataPlane(const JobSpec& job) {
  if (job.transport() == tessera::v1::UCX && !job.trusted_network()) {
    return FieldError("transport", "UCX does not encrypt: set trusted_network: true for a private fabric, or keep "
                                   "transport GRPC (TLS) on any other network");
  }
  const tessera::v1::WireSpec& wire = job.wire();
  if (!tessera::v1::WireSpec::Precision_IsValid(wire.gradients()) ||
      !tessera::v1::WireSpec::Precision_IsValid(wire.values())) {
    return FieldError("wire", "precisions are FP32, BF16 or FP16");
  }
  if (!(wire.gradient_top_k() >= 0 && wire.gradient_top_k() <= 0.5f)) {
    return FieldError("wire.gradient_top_k",
                      absl::StrCat("expected a fraction in (0, 0.5] (0: dense), got ", wire.gradient_top_k()));
  }
  return absl::OkStatus();
}

// consistency: staleness, balance, shares, backup workers (and clipping with them).
absl::Status CheckConsistency(const JobSpec& job) {
  const ConsistencySpec& c = job.consistency();
  if (c.staleness() < 0) return FieldError("consistency.staleness", absl::StrCat("expected >= 0, got ", c.staleness()));
  if (c.mode() != ConsistencySpec::SSP && c.staleness() != 0) {
    return FieldError("consistency.staleness",
                      absl::StrCat("set to ", c.staleness(), " but mode is ", ConsistencySpec::Mode_Name(c.mode()),
                                   "; a staleness bound applies to SSP only"));
  }
  if (c.mode() == ConsistencySpec::SYNC && c.staleness_aware_lr()) {
    return FieldError("consistency.staleness_aware_lr", "applies to ASYNC and SSP only; SYNC has no staleness");
  }
  const bool sync = c.mode() == ConsistencySpec::SYNC;
  const int workers = job.cluster().num_workers();
  if (!sync && c.balance() != ConsistencySpec::EQUAL) {
    return FieldError("consistency.balance", "applies to SYNC only; ASYNC and SSP workers never wait for a round");
  }
  if (c.balance() == ConsistencySpec::FIXED) {
    if (c.shares_size() != workers) {
      return FieldError("consistency.shares", absl::StrCat("FIXED needs one share per worker (", workers, "), got ",
                                                           c.shares_size()));
    }
    for (float share : c.shares()) {
      if (!(share > 0) || !std::isfinite(share)) {
        return FieldError("consistency.shares", absl::StrCat("expected finite values > 0, got ", share));
      }
    }
  } else if (c.shares_size() > 0) {
    return FieldError("consistency.shares", "applies to balance: FIXED only");
  }
  if (c.backup_workers() < 0 || (c.backup_workers() > 0 && (!sync || c.backup_workers() >= workers))) {
    return FieldError("consistency.backup_workers",
                      absl::StrCat("expected 0 .. num_workers-1 (", workers - 1, ") in SYNC, got ", c.backup_workers(),
                                   " in ", ConsistencySpec::Mode_Name(c.mode())));
  }
  if (!(c.delay_compensation() >= 0) || !std::isfinite(c.delay_compensation())) {
    return FieldError("consistency.delay_compensation",
                      absl::StrCat("expected a finite lambda >= 0, got ", c.delay_compensation()));
  }
  if (c.delay_compensation() > 0 && sync) {
    return FieldError("consistency.delay_compensation", "applies to ASYNC and SSP only; SYNC gradients are never stale");
  }
  if (c.delay_compensation() > 0 && job.optimizer().kind() == OptimizerSpec::SCRIPT) {
    return FieldError("consistency.delay_compensation",
                      "not with optimizer SCRIPT: its workers push the change their optimizer made, not a gradient");
  }
  if (c.backup_workers() > 0 && job.optimizer().clip_global_norm() > 0) {
    return FieldError("optimizer.clip_global_norm",
                      "not with backup workers: clipping's norm round waits for every worker of a round, which "
                      "backup workers exist not to do");
  }
  return absl::OkStatus();
}

// stop, eval_every_steps and eval_every_seconds.
absl::Status CheckStopAndEvaluation(const JobSpec& job) {
  const auto& stop = job.stop();
  if (stop.max_steps() < 0) return FieldError("stop.max_steps", "expected >= 0");
  if (stop.epochs() < 0) return FieldError("stop.epochs", "expected >= 0");
  if (!(stop.target_accuracy() >= 0 && stop.target_accuracy() <= 1)) {
    return FieldError("stop.target_accuracy", absl::StrCat("expected in (0, 1], got ", stop.target_accuracy()));
  }
  if (stop.max_seconds() < 0) return FieldError("stop.max_seconds", "expected >= 0");
  if (stop.max_steps() == 0 && stop.epochs() == 0 && stop.target_accuracy() == 0 && stop.max_seconds() == 0) {
    return FieldError("stop", "no stop condition; set max_steps, epochs, target_accuracy or max_seconds");
  }
  if (job.eval_every_steps() <= 0) return FieldError("eval_every_steps", "expected > 0");
  if (job.eval_every_seconds() < 0) return FieldError("eval_every_seconds", "expected >= 0");
  return absl::OkStatus();
}

// checkpoint.
absl::Status CheckCheckpoint(const JobSpec& job) {
  const tessera::v1::CheckpointSpec& checkpoint = job.checkpoint();
  if (checkpoint.every_steps() < 0) return FieldError("checkpoint.every_steps", "expected >= 0");
  if (checkpoint.every_seconds() < 0) return FieldError("checkpoint.every_seconds", "expected >= 0");
  if (checkpoint.keep() < 1) return FieldError("checkpoint.keep", "expected >= 1");
  if (checkpoint.full_every() < 0 || checkpoint.full_every() > 1000000) {
    return FieldError("checkpoint.full_every", "expected 0 .. 1000000");
  }
  if ((checkpoint.every_steps() > 0 || checkpoint.every_seconds() > 0) && checkpoint.dir().empty()) {
    return FieldError("checkpoint.dir", "required with checkpoint.every_steps or every_seconds");
  }
  return absl::OkStatus();
}

// chunk_bytes, cluster and replication.
absl::Status CheckClusterAndChunks(const JobSpec& job) {
  if (job.chunk_bytes() < 4 || job.chunk_bytes() > (64 << 20)) {
    return FieldError("chunk_bytes", absl::StrCat("expected 4 .. 67108864 bytes, got ", job.chunk_bytes()));
  }
  if (job.cluster().num_servers() <= 0 || job.cluster().num_servers() > 1024) {
    return FieldError("cluster.num_servers", absl::StrCat("expected 1 .. 1024, got ", job.cluster().num_servers()));
  }
  if (job.cluster().num_workers() <= 0 || job.cluster().num_workers() > 4096) {
    return FieldError("cluster.num_workers", absl::StrCat("expected 1 .. 4096, got ", job.cluster().num_workers()));
  }
  if (!tessera::v1::ClusterSpec::WorkerErrors_IsValid(job.cluster().worker_errors())) {
    return FieldError("cluster.worker_errors", absl::StrCat("expected FAIL_JOB or AWAIT_RESTART, got ",
                                                            job.cluster().worker_errors()));
  }
  const int backups = job.replication().backups();
  if (backups < 0 || backups >= job.cluster().num_servers()) {
    return FieldError("replication.backups",
                      absl::StrCat("expected 0 .. num_servers-1 (", job.cluster().num_servers() - 1,
                                   "): each copy of a chunk needs a server of its own; got ", backups));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& job) {
  TESSERA_RETURN_IF_ERROR(CheckKnownEnums(job));
  TESSERA_RETURN_IF_ERROR(CheckLength("name", job.name(), kMaxNameBytes));
  for (absl::Status (*check)(const JobSpec&) :
       {CheckModel, CheckData, CheckOptimizer, CheckBatchAndModelSize, CheckDataPlane, CheckConsistency,
        CheckStopAndEvaluation, CheckCheckpoint, CheckClusterAndChunks}) {
    TESSERA_RETURN_IF_ERROR(check(job));
  }
  return absl::OkStatus();
}

std::string ModeName(const ConsistencySpec& consistency) {
  switch (consistency.mode()) {
    case ConsistencySpec::ASYNC:
      return "async";
    case ConsistencySpec::SSP:
      return absl::StrCat("ssp(", consistency.staleness(), ")");
    default:
      return "sync";
  }
}

std::string JobSpecToText(const JobSpec& job) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(job, &text);
  return text;
}

}  // namespace tessera
