// tessera._tessera: the client library (worker/client/ps_client.h) for Python, not a second client. Values and
// gradients cross as float32, C-contiguous buffers (NumPy arrays, or a CPU tensor's .numpy()), read and written
// in place: nothing is copied between Python and the library. Every call that may wait (connect, declare, pull,
// push, the clock gate, a step's values) releases the GIL while it waits. Errors are tessera.Error, its message
// "CODE: what the daemon said".
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon/cluster_environment.h"
#include "common/daemon/daemon_init.h"
#include "common/model/job_spec.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "worker/client/ps_client.h"
#include "worker/data/batch_schedule.h"
#include "worker/data/dataset.h"

namespace py = pybind11;

namespace tessera {
namespace {

// A failed call, raised in Python as tessera.Error ("UNAVAILABLE: ...").
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const absl::Status& status)
      : std::runtime_error(absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message())) {}
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Take(absl::StatusOr<T> value) {
  Check(value.status());
  return *std::move(value);
}

// The memory of a float32, C-contiguous buffer. INVALID_ARGUMENT (as tessera.Error) naming `what` otherwise.
absl::Span<float> FloatsOf(const py::buffer& buffer, bool writable, const std::string& what) {
  py::buffer_info info = buffer.request(writable);
  if (info.format != py::format_descriptor<float>::format() || info.itemsize != sizeof(float)) {
    Check(absl::InvalidArgumentError(absl::StrCat(what, ": expected float32 values, got format '", info.format, "'")));
  }
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      Check(absl::InvalidArgumentError(absl::StrCat(what, ": the buffer is not contiguous (copy it first)")));
    }
    expected *= info.shape[d];
  }
  return absl::MakeSpan(static_cast<float*>(info.ptr), static_cast<size_t>(info.size));
}

// The ids of a buffer of 64-bit integers (NumPy int64 or uint64; a torch LongTensor's .numpy()). INVALID_ARGUMENT
// for another type, a buffer that is not contiguous, or a negative int64.
absl::Span<const uint64_t> IdsOf(const py::buffer& buffer, const std::string& what) {
  py::buffer_info info = buffer.request();
  const bool is_signed = info.format == "q" || info.format == "l";
  const bool is_unsigned = info.format == "Q" || info.format == "L";
  if (info.itemsize != 8 || !(is_signed || is_unsigned)) {
    Check(absl::InvalidArgumentError(absl::StrCat(what, ": ids must be int64 or uint64, got format '", info.format, "'")));
  }
  if (info.ndim > 1 || (info.ndim == 1 && info.shape[0] > 1 && info.strides[0] != 8)) {
    Check(absl::InvalidArgumentError(absl::StrCat(what, ": ids must be one contiguous row (flatten them first)")));
  }
  const auto* ids = static_cast<const uint64_t*>(info.ptr);
  if (is_signed) {
    for (py::ssize_t i = 0; i < info.size; ++i) {
      if (static_cast<int64_t>(ids[i]) < 0) {
        Check(absl::InvalidArgumentError(absl::StrCat(what, ": id ", static_cast<int64_t>(ids[i]), " is negative")));
      }
    }
  }
  return absl::MakeConstSpan(ids, static_cast<size_t>(info.size));
}

// An embedding table's declaration from a dict (tessera.torch.Embedding's): name, dim, optimizer, learning_rate,
// init_scale, seed, slots, admit_after, expire_after_steps, evict_when_full and the optimizer's other numbers.
tessera::v1::ParameterSpec TableSpecOf(const py::dict& d) {
  auto number = [&](const char* key, double fallback) {
    return d.contains(key) ? py::cast<double>(d[key]) : fallback;
  };
  tessera::v1::ParameterSpec spec;
  spec.set_name(py::cast<std::string>(d["name"]));
  spec.set_dtype(tessera::v1::DT_FLOAT32);
  spec.add_shape(py::cast<int64_t>(d["dim"]));
  const double scale = number("init_scale", 0.0);
  if (scale > 0) {
    spec.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
    spec.mutable_init()->set_scale(static_cast<float>(scale));
    spec.mutable_init()->set_seed(static_cast<uint64_t>(number("seed", 0)));
  }
  tessera::v1::EmbeddingSpec* e = spec.mutable_embedding();
  e->set_slots(static_cast<int>(number("slots", 0)));
  e->set_admit_after(static_cast<int>(number("admit_after", 0)));
  e->set_expire_after_steps(static_cast<int64_t>(number("expire_after_steps", 0)));
  e->set_evict_when_full(d.contains("evict_when_full") && py::cast<bool>(d["evict_when_full"]));
  tessera::v1::RowOptimizerSpec* o = e->mutable_optimizer();
  const std::string kind = d.contains("optimizer") ? py::cast<std::string>(d["optimizer"]) : "sgd";
  tessera::v1::RowOptimizerSpec::Kind parsed;
  if (!tessera::v1::RowOptimizerSpec::Kind_Parse(absl::AsciiStrToUpper(kind), &parsed)) {
    Check(absl::InvalidArgumentError(absl::StrCat("table '", spec.name(), "': unknown optimizer '", kind,
                                                  "' (sgd, adagrad, rowwise_adagrad, ftrl, lazy_adam)")));
  }
  o->set_kind(parsed);
  o->set_learning_rate(static_cast<float>(number("learning_rate", 0)));
  o->set_epsilon(static_cast<float>(number("epsilon", 0)));
  o->set_initial_accumulator(static_cast<float>(number("initial_accumulator", 0)));
  o->set_beta1(static_cast<float>(number("beta1", 0)));
  o->set_beta2(static_cast<float>(number("beta2", 0)));
  o->set_ftrl_beta(static_cast<float>(number("ftrl_beta", 0)));
  o->set_l1(static_cast<float>(number("l1", 0)));
  o->set_l2(static_cast<float>(number("l2", 0)));
  return spec;
}

std::vector<absl::Span<float>> Writable(const std::vector<py::buffer>& buffers, const std::vector<std::string>& names) {
  std::vector<absl::Span<float>> out;
  for (size_t i = 0; i < buffers.size(); ++i) {
    out.push_back(FloatsOf(buffers[i], true, i < names.size() ? "values of '" + names[i] + "'" : "values"));
  }
  return out;
}

std::vector<absl::Span<const float>> Readable(const std::vector<py::buffer>& buffers,
                                              const std::vector<std::string>& names) {
  std::vector<absl::Span<const float>> out;
  for (size_t i = 0; i < buffers.size(); ++i) {
    out.push_back(FloatsOf(buffers[i], false, i < names.size() ? "gradient of '" + names[i] + "'" : "gradient"));
  }
  return out;
}

py::dict ClockDict(const ClockResult& r) {
  py::dict d;
  d["clock"] = r.clock;
  d["min_clock"] = r.min_clock;
  d["stop"] = r.stop;
  d["stop_reason"] = r.stop_reason;
  d["rolled_back"] = r.rolled_back;
  d["late"] = r.late;
  d["joining_clocks"] = r.joining_clocks;
  d["values_keeper"] = r.values_keeper;
  d["checkpoint_clock"] = r.checkpoint_clock;
  return d;
}

// One step's exchange (PsClient::BeginStep). Holds the names and the buffers for as long as the exchange may
// read or write them.
class PyStep {
 public:
  PyStep(PsClient* client, std::vector<std::string> names, std::vector<py::buffer> grads, int batch_size,
         std::vector<py::buffer> out)
      : names_(std::move(names)), grad_objects_(std::move(grads)), out_objects_(std::move(out)) {
    const std::vector<absl::Span<const float>> grad_spans = Readable(grad_objects_, names_);
    const std::vector<absl::Span<float>> out_spans = Writable(out_objects_, names_);
    step_ = client->BeginStep(names_, grad_spans, batch_size, out_spans);
  }
  // A step of a plan (PyStepPlan), which owns the names and the memory and outlives the step.
  explicit PyStep(std::unique_ptr<StepExchange> step) : step_(std::move(step)) {}
  ~PyStep() {
    py::gil_scoped_release release;  // cancelling what is in flight may wait for gRPC's threads
    step_.reset();
  }

  void Send(int index) {
    absl::Status sent;
    {
      py::gil_scoped_release release;  // starting the calls writes to sockets
      sent = step_->Send(index);
    }
    Check(sent);
  }
  py::dict Finish() {
    absl::StatusOr<ClockResult> result;
    {
      py::gil_scoped_release release;
      result = step_->Finish();
    }
    return ClockDict(Take(std::move(result)));
  }
  void WaitValues(int index) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = step_->WaitValues(index, [] {
        py::gil_scoped_acquire acquire;  // Ctrl-C while waiting gives up the wait
        return PyErr_CheckSignals() != 0;
      });
    }
    if (PyErr_Occurred()) throw py::error_already_set();
    Check(status);
  }
  bool stopped() const { return step_->stopped(); }
  void SetLearningRateFactors(std::vector<float> factors) { step_->SetLearningRateFactors(std::move(factors)); }
  void Skip() { step_->SkipStep(); }
  bool skipped() const { return step_->skipped(); }

 private:
  const std::vector<std::string> names_;  // the exchange keeps a reference to it
  const std::vector<py::buffer> grad_objects_;
  const std::vector<py::buffer> out_objects_;
  std::unique_ptr<StepExchange> step_;
};

// What every step of a model exchanges, converted once: the names, the gradient sets (steps alternate between
// them, so that one step's pushes may still be read while the next step's backward writes the other) and the
// values' memory. Begin() starts a step over one set: no per-step conversion of Python objects.
class PyStepPlan {
 public:
  PyStepPlan(PsClient* client, std::vector<std::string> names, std::vector<std::vector<py::buffer>> grad_sets,
             std::vector<py::buffer> out)
      : client_(client), names_(std::move(names)), grad_objects_(std::move(grad_sets)), out_objects_(std::move(out)) {
    for (const auto& set : grad_objects_) {
      if (set.size() != names_.size()) Check(absl::InvalidArgumentError("a gradient set per name, every set"));
      grad_spans_.push_back(Readable(set, names_));
    }
    if (out_objects_.size() != names_.size()) Check(absl::InvalidArgumentError("a values buffer per name"));
    out_spans_ = Writable(out_objects_, names_);
  }

  std::unique_ptr<PyStep> Begin(size_t set, int batch_size);

 private:
  PsClient* const client_;
  const std::vector<std::string> names_;
  const std::vector<std::vector<py::buffer>> grad_objects_;  // keeps the memory alive
  const std::vector<py::buffer> out_objects_;
  std::vector<std::vector<absl::Span<const float>>> grad_spans_;
  std::vector<absl::Span<float>> out_spans_;
};

class PyClient {
 public:
  explicit PyClient(std::unique_ptr<PsClient> client) : client_(std::move(client)) {}
  ~PyClient() {
    py::gil_scoped_release release;  // the heartbeat thread is joined
    client_.reset();
  }

  PsClient& get() { return *client_; }

 private:
  std::unique_ptr<PsClient> client_;
};

std::unique_ptr<PyStep> PyStepPlan::Begin(size_t set, int batch_size) {
  if (set >= grad_spans_.size()) Check(absl::InvalidArgumentError(absl::StrCat("no gradient set ", set)));
  std::unique_ptr<StepExchange> step;
  {
    py::gil_scoped_release release;
    step = client_->BeginStep(names_, grad_spans_[set], batch_size, out_spans_);
  }
  return std::make_unique<PyStep>(std::move(step));
}

std::unique_ptr<PyClient> Connect(const std::string& scheduler, int rank, const std::string& device,
                                  const std::string& token_file, const std::string& tls_cert,
                                  const std::string& tls_key, const std::string& tls_ca, bool insecure,
                                  double connect_timeout_s, double clock_wait_timeout_s) {
  PsClient::Options options;
  options.scheduler_address = scheduler;
  options.rank = rank;
  options.device = device;
  options.security.token_file = token_file;
  options.security.tls_cert = tls_cert;
  options.security.tls_key = tls_key;
  options.security.tls_ca = tls_ca;
  options.security.insecure = insecure;
  options.connect_timeout = absl::Seconds(connect_timeout_s);
  options.clock_wait_timeout = absl::Seconds(clock_wait_timeout_s);
  absl::StatusOr<std::unique_ptr<PsClient>> client;
  {
    py::gil_scoped_release release;
    client = PsClient::Connect(options);
  }
  return std::make_unique<PyClient>(Take(std::move(client)));
}

std::string JobJson(const tessera::v1::JobSpec& job) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(job, &json, options).ok()) {
    Check(absl::InternalError("the job could not be written as JSON"));
  }
  return json;
}

py::array_t<int64_t> IndexArray(const std::vector<int64_t>& indices) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(indices.size()));
  std::copy(indices.begin(), indices.end(), out.mutable_data());
  return out;
}

py::tuple DatasetTuple(Dataset d) {
  py::array_t<float> x({static_cast<py::ssize_t>(d.size()), static_cast<py::ssize_t>(d.features)});
  std::copy(d.x.begin(), d.x.end(), x.mutable_data());
  py::array_t<int64_t> y(static_cast<py::ssize_t>(d.size()));
  std::copy(d.y.begin(), d.y.end(), y.mutable_data());
  return py::make_tuple(x, y, d.classes);
}

// The job's training or test split (its DataSpec: Fashion-MNIST's IDX files by default, or the synthetic problem)
// as (x float32 [examples, features], y int64 [examples]), read by the C++ worker's own loader.
py::tuple LoadJobSplit(PyClient& c, bool train) {
  absl::StatusOr<Dataset> data;
  {
    py::gil_scoped_release release;
    data = LoadSplit(c.get().job().data(), train, c.get().job().seed());
  }
  return DatasetTuple(Take(std::move(data)));
}

// Module functions: where a worker joins, and reading IDX files.
void BindFunctions(py::module_& m) {
  m.def(
      "resolve_join",
      [](const std::string& scheduler, int scheduler_port, int rank, int rank_offset) {
        tessera::ClusterEnvironment env = tessera::Take(tessera::ReadClusterEnvironment());
        tessera::WorkerJoin join = tessera::Take(
            tessera::ResolveWorkerJoin(scheduler, scheduler_port, rank, rank_offset, env));
        py::dict d;
        d["scheduler"] = join.scheduler_address;
        d["rank"] = join.rank;
        d["rank_source"] = join.rank_source;
        return d;
      },
      py::arg("scheduler"), py::arg("scheduler_port"), py::arg("rank"), py::arg("rank_offset"),
      "Where a worker joins, as tessera-worker decides it: the scheduler's address and the rank, from the given "
      "settings and what Slurm or Kubernetes set.");

  m.def(
      "load_idx",
      [](const std::string& images, const std::string& labels) {
        absl::StatusOr<tessera::Dataset> data;
        {
          py::gil_scoped_release release;
          data = tessera::LoadIdx(images, labels);
        }
        return tessera::DatasetTuple(tessera::Take(std::move(data)));
      },
      py::arg("images"), py::arg("labels"),
      "An images file and a labels file in IDX format (gzip'd or not), as tessera-worker reads them: (x float32 "
      "[n, features] in [0, 1], y int64 [n], classes).");
}

// BatchSchedule: the examples of each worker at each step.
void BindBatchSchedule(py::module_& m) {
  py::class_<tessera::BatchSchedule>(
      m, "BatchSchedule",
      "Which examples each worker trains on at each step, as the C++ worker decides it: global batches of "
      "batch_size * workers examples in an order reshuffled every epoch from the seed; worker r takes the r-th "
      "slice, or the slice the scheduler gives it when the job balances the split.")
      .def(py::init([](int64_t examples, int batch_size, int workers, int rank, uint64_t seed) {
             if (batch_size <= 0 || workers <= 0 || rank < 0 || rank >= workers) {
               tessera::Check(absl::InvalidArgumentError(absl::StrCat(
                   "a batch schedule needs batch_size > 0 and 0 <= rank < workers (got batch_size ", batch_size,
                   ", rank ", rank, ", workers ", workers, ")")));
             }
             if (examples < static_cast<int64_t>(batch_size) * workers) {
               tessera::Check(absl::InvalidArgumentError(
                   absl::StrCat("the training set has ", examples, " examples, fewer than one global batch of ",
                                static_cast<int64_t>(batch_size) * workers)));
             }
             return std::make_unique<tessera::BatchSchedule>(examples, batch_size, workers, rank, seed);
           }),
           py::arg("examples"), py::arg("batch_size"), py::arg("workers"), py::arg("rank"), py::arg("seed"))
      .def_property_readonly("steps_per_epoch", &tessera::BatchSchedule::steps_per_epoch)
      .def(
          "batch", [](tessera::BatchSchedule& s, int64_t step) { return tessera::IndexArray(s.Batch(step)); },
          py::arg("step"), "This worker's example indices at `step` (an int64 array).")
      .def(
          "slice",
          [](tessera::BatchSchedule& s, int64_t step, int64_t offset, int count) {
            return tessera::IndexArray(s.Slice(step, offset, count));
          },
          py::arg("step"), py::arg("offset"), py::arg("count"),
          "Indices [offset, offset + count) of the global batch of `step`.")
      .def("epochs", &tessera::BatchSchedule::Epochs, py::arg("steps"));
}

// Step and StepPlan: one step's exchange, and a model's exchange converted once.
void BindSteps(py::module_& m) {
  py::class_<PyStep>(m, "Step", "One step's exchange (see Client.begin_step).")
      .def("send", &PyStep::Send, py::arg("index"), "grads[index] is final: its chunks leave now.")
      .def("finish", &PyStep::Finish, "Sends what was not sent and returns the clock (a dict).")
      .def("wait_values", &PyStep::WaitValues, py::arg("index"),
           "Waits until out[index] holds the values after this step.")
      .def_property_readonly("stopped", &PyStep::stopped)
      .def("set_lr_factors", &PyStep::SetLearningRateFactors, py::arg("factors"),
           "Before the first send: each parameter's learning rate in this step, as a factor of the job's.")
      .def("skip", &PyStep::Skip,
           "Before the first send: this worker skips the step (its gradient scaler found inf or NaN); the "
           "gradients sent must be finite (zeros) and none is applied.")
      .def_property_readonly("skipped", &PyStep::skipped,
                             "After the values were waited for: the step applied no update (SYNC: some worker "
                             "skipped it).");

  py::class_<tessera::PyStepPlan>(m, "StepPlan", "A model's step exchange, converted once (Client.step_plan).")
      .def("begin", &tessera::PyStepPlan::Begin, py::arg("set"), py::arg("batch_size"), py::keep_alive<0, 1>(),
           "Starts a step whose gradients are read from gradient set `set`.");
}

// Client: Registration and what the job says: the rank, the clock, the parameters, the stop clock.
void BindClientJob(py::class_<PyClient>& client) {
  client
      .def_static("connect", &tessera::Connect, py::arg("scheduler"), py::arg("rank") = -1,
                  py::arg("device") = "cpu", py::arg("token_file") = "", py::arg("tls_cert") = "",
                  py::arg("tls_key") = "", py::arg("tls_ca") = "", py::arg("insecure") = false,
                  py::arg("connect_timeout_s") = 120.0, py::arg("clock_wait_timeout_s") = 300.0,
                  "Registers with the scheduler: the rank and the job come back.")
      .def_property_readonly("worker_id", [](PyClient& c) { return c.get().worker_id(); })
      .def_property_readonly("incarnation", [](PyClient& c) { return c.get().incarnation(); })
      .def_property_readonly("clock", [](PyClient& c) { return c.get().clock(); })
      .def_property_readonly("job_json", [](PyClient& c) { return tessera::JobJson(c.get().job()); })
      .def_property_readonly("batch_slice",
                             [](PyClient& c) {
                               const tessera::BatchSlice s = c.get().batch_slice();
                               return py::make_tuple(s.offset, s.count);
                             })
      .def(
          "job_parameters",
          [](PyClient& c) {
            absl::StatusOr<std::vector<tessera::v1::ParameterSpec>> params;
            {
              py::gil_scoped_release release;
              params = c.get().JobParameters();
            }
            py::dict d;
            for (const auto& p : tessera::Take(std::move(params))) {
              d[py::str(p.name())] = std::vector<int64_t>(p.shape().begin(), p.shape().end());
            }
            return d;
          },
          "The parameters the job's servers hold now, {name: shape} (empty before the first declaration).")
      .def("load_split", &tessera::LoadJobSplit, py::arg("train"),
           "The job's training (train=True) or test split as (x float32 [n, features], y int64 [n], classes).")
      .def(
          "stop_clock",
          [](PyClient& c, int64_t steps_per_epoch) { return tessera::StopClock(c.get().job(), steps_per_epoch); },
          py::arg("steps_per_epoch"),
          "The clock at which the job's stop conditions (max_steps, max_epochs) end training.");
}

// Client: Declaring parameters, module state and embedding tables.
void BindClientDeclarations(py::class_<PyClient>& client) {
  client
      .def(
          "declare",
          [](PyClient& c, const std::vector<std::tuple<std::string, std::vector<int64_t>, float, uint64_t>>& params,
             const std::vector<std::pair<std::string, std::vector<int64_t>>>& state,
             const std::vector<py::dict>& tables) {
            std::vector<tessera::v1::ParameterSpec> specs;
            for (const auto& [name, shape, scale, seed] : params) {
              tessera::v1::ParameterSpec spec;
              spec.set_name(name);
              spec.set_dtype(tessera::v1::DT_FLOAT32);
              for (int64_t d : shape) spec.add_shape(d);
              if (scale > 0) {
                spec.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
                spec.mutable_init()->set_scale(scale);
                spec.mutable_init()->set_seed(seed);
              }
              specs.push_back(std::move(spec));
            }
            for (const auto& [name, shape] : state) {
              tessera::v1::ParameterSpec spec;
              spec.set_name(name);
              spec.set_dtype(tessera::v1::DT_FLOAT32);
              for (int64_t d : shape) spec.add_shape(d);
              spec.set_state(true);
              specs.push_back(std::move(spec));
            }
            for (const py::dict& d : tables) specs.push_back(tessera::TableSpecOf(d));
            py::gil_scoped_release release;
            tessera::Check(c.get().Declare(specs));
          },
          py::arg("params"), py::arg("state") = std::vector<std::pair<std::string, std::vector<int64_t>>>(),
          py::arg("tables") = std::vector<py::dict>(),
          "Declares parameters [(name, shape, uniform_scale, seed)] (scale 0: zeros), module state [(name, "
          "shape)] (assigned only, never pushed: e.g. BatchNorm statistics) and embedding tables [{name, dim, ...}] "
          "(as declare_tables), all in one declaration; waits for the servers.")
      .def(
          "declare_tables",
          [](PyClient& c, const std::vector<py::dict>& tables) {
            std::vector<tessera::v1::ParameterSpec> specs;
            for (const py::dict& d : tables) specs.push_back(tessera::TableSpecOf(d));
            py::gil_scoped_release release;
            tessera::Check(c.get().Declare(specs));
          },
          py::arg("tables"),
          "Declares embedding tables [{name, dim, optimizer, learning_rate, init_scale, seed, slots, admit_after, "
          "expire_after_steps, ...}]; waits for the servers.");
}

// Client: Embedding tables' rows.
void BindClientRows(py::class_<PyClient>& client) {
  client
      .def(
          "pull_rows",
          [](PyClient& c, const std::string& table, const py::buffer& ids, const py::buffer& out) {
            const absl::Span<const uint64_t> id_span = tessera::IdsOf(ids, "rows of '" + table + "'");
            const absl::Span<float> out_span = tessera::FloatsOf(out, true, "rows of '" + table + "'");
            py::gil_scoped_release release;
            tessera::Check(c.get().PullRows(table, id_span, out_span));
          },
          py::arg("table"), py::arg("ids"), py::arg("out"),
          "Fills out (len(ids) rows of the table's dim, float32) with the rows of ids.")
      .def(
          "push_rows",
          [](PyClient& c, const std::string& table, const py::buffer& ids, const py::buffer& grads, int batch_size,
             float lr_factor, bool skip) {
            const absl::Span<const uint64_t> id_span = tessera::IdsOf(ids, "rows of '" + table + "'");
            const absl::Span<const float> grad_span =
                tessera::FloatsOf(grads, false, "gradient of rows of '" + table + "'");
            absl::StatusOr<tessera::PsClient::RowsPushed> pushed;
            {
              py::gil_scoped_release release;
              pushed = c.get().PushRows(table, id_span, grad_span, batch_size, lr_factor, skip);
            }
            tessera::PsClient::RowsPushed p = tessera::Take(std::move(pushed));
            return py::make_tuple(p.updated, p.refused);
          },
          py::arg("table"), py::arg("ids"), py::arg("grads"), py::arg("batch_size"), py::arg("lr_factor") = 1.0f,
          py::arg("skip") = false,
          "Sends the gradients of the rows of ids (repeated ids summed; none: in SYNC the worker still takes part "
          "in the round); skip: the worker skips this step. Returns (rows updated, rows refused).");
}

// Client: Dense values and gradients: pulls, pushes, assignments, steps and the clock.
void BindClientExchange(py::class_<PyClient>& client) {
  client
      .def(
          "pull",
          [](PyClient& c, const std::vector<std::string>& names, const std::vector<py::buffer>& out,
             bool if_changed) {
            const std::vector<absl::Span<float>> spans = tessera::Writable(out, names);
            py::gil_scoped_release release;
            // A buffer Python freed and allocated again has the address of the one pulled into before: only a
            // caller that keeps its buffers untouched between pulls may have unchanged chunks left as they are.
            if (!if_changed) c.get().ForgetPulledValues(names);
            tessera::Check(c.get().Pull(names, spans));
          },
          py::arg("names"), py::arg("out"), py::arg("if_changed") = false,
          "Fills out[i] with the values of names[i]. if_changed: chunks whose version this client last pulled into "
          "the very same memory are not sent again (the buffers must be untouched since).")
      .def(
          "push",
          [](PyClient& c, const std::vector<std::string>& names, const std::vector<py::buffer>& grads,
             int batch_size) {
            const std::vector<absl::Span<const float>> spans = tessera::Readable(grads, names);
            py::gil_scoped_release release;
            tessera::Check(c.get().Push(names, spans, batch_size));
          },
          py::arg("names"), py::arg("grads"), py::arg("batch_size"))
      .def(
          "push_pull",
          [](PyClient& c, const std::vector<std::string>& names, const std::vector<py::buffer>& grads, int batch_size,
             const std::vector<py::buffer>& out) {
            const std::vector<absl::Span<const float>> g = tessera::Readable(grads, names);
            const std::vector<absl::Span<float>> o = tessera::Writable(out, names);
            py::gil_scoped_release release;
            tessera::Check(c.get().PushPull(names, g, batch_size, o));
          },
          py::arg("names"), py::arg("grads"), py::arg("batch_size"), py::arg("out"))
      .def(
          "assign",
          [](PyClient& c, const std::vector<std::string>& names, const std::vector<py::buffer>& values) {
            const std::vector<absl::Span<const float>> spans = tessera::Readable(values, names);
            py::gil_scoped_release release;
            tessera::Check(c.get().Assign(names, spans));
          },
          py::arg("names"), py::arg("values"))
      .def(
          "advance_clock",
          [](PyClient& c) {
            absl::StatusOr<tessera::ClockResult> r;
            {
              py::gil_scoped_release release;
              r = c.get().Clock();
            }
            return tessera::ClockDict(tessera::Take(std::move(r)));
          },
          "Completes this worker's step: advances its clock and waits at the gate (a dict).")
      .def(
          "begin_step",
          [](PyClient& c, std::vector<std::string> names, std::vector<py::buffer> grads, int batch_size,
             std::vector<py::buffer> out) {
            return std::make_unique<PyStep>(&c.get(), std::move(names), std::move(grads), batch_size,
                                            std::move(out));
          },
          py::arg("names"), py::arg("grads"), py::arg("batch_size"), py::arg("out"), py::keep_alive<0, 1>(),
          "Starts a step whose gradients leave as each is sent and whose values arrive as each is waited for.")
      .def(
          "step_plan",
          [](PyClient& c, std::vector<std::string> names, std::vector<std::vector<py::buffer>> grad_sets,
             std::vector<py::buffer> out) {
            return std::make_unique<tessera::PyStepPlan>(&c.get(), std::move(names), std::move(grad_sets),
                                                         std::move(out));
          },
          py::arg("names"), py::arg("grad_sets"), py::arg("out"), py::keep_alive<0, 1>(),
          "A plan for begin_step's exchange over fixed memory: gradient sets to alternate between, and the values.")
      .def(
          "note_step", [](PyClient& c, int samples, double seconds) { c.get().NoteStep(samples, absl::Seconds(seconds)); },
          py::arg("samples"), py::arg("busy_seconds"))
      .def(
          "pulled_version", [](PyClient& c, const std::string& name) { return c.get().PulledVersion(name); },
          py::arg("name"),
          "The oldest version of the chunks of `name` as last pulled (-1: not pulled); 0: nobody changed it yet.")
      .def(
          "pulled_clock", [](PyClient& c, const std::string& name) { return c.get().PulledClock(name); },
          py::arg("name"),
          "The oldest clock the chunks of `name` held values of as last pulled (in SYNC: the rounds applied; -1: not "
          "pulled).")
      .def("take_rollback",
           [](PyClient& c) -> std::optional<int64_t> { return c.get().TakeRollback(); });
}

// Client: Progress, and the end of this worker's part in the job.
void BindClientEnd(py::class_<PyClient>& client) {
  client
      .def(
          "report",
          [](PyClient& c, double train_loss, double samples_per_sec, int64_t samples, double epoch,
             std::optional<double> test_accuracy, double test_loss, int64_t eval_clock, const std::string& device) {
            tessera::v1::ReportRequest r;
            r.set_train_loss(train_loss);
            r.set_samples_per_sec(samples_per_sec);
            r.set_samples(samples);
            r.set_epoch(epoch);
            r.set_device(device);
            if (test_accuracy) {
              r.set_has_eval(true);
              r.set_test_accuracy(*test_accuracy);
              r.set_test_loss(test_loss);
              r.set_eval_clock(eval_clock);
            }
            absl::StatusOr<tessera::v1::ReportResponse> answer;
            {
              py::gil_scoped_release release;
              answer = c.get().Report(r);
            }
            tessera::v1::ReportResponse a = tessera::Take(std::move(answer));
            return py::make_tuple(a.stop(), a.stop_reason());
          },
          py::arg("train_loss") = 0.0, py::arg("samples_per_sec") = 0.0, py::arg("samples") = 0,
          py::arg("epoch") = 0.0, py::arg("test_accuracy") = py::none(), py::arg("test_loss") = 0.0,
          py::arg("eval_clock") = 0, py::arg("device") = "",
          "Progress for the scheduler's records; returns (stop, stop_reason).")
      .def("job_stopped",
           [](PyClient& c) {
             py::gil_scoped_release release;
             return c.get().JobStopped();
           })
      .def("done",
           [](PyClient& c) {
             py::gil_scoped_release release;
             tessera::Check(c.get().Done());
           })
      .def(
          "fail",
          [](PyClient& c, const std::string& why, bool program_error) {
            py::gil_scoped_release release;
            c.get().Fail(absl::InternalError(why), program_error);
          },
          py::arg("why"), py::arg("program_error") = false,
          "This worker leaves the job on `why`; program_error: the script itself raised it (an uncaught "
          "exception), which fails the job unless its cluster.worker_errors is AWAIT_RESTART.");
}

}  // namespace
}  // namespace tessera

PYBIND11_MODULE(_tessera, m) {
  m.doc() = "Tessera's client library: join a job, declare parameters, exchange gradients and values.";
  // As in the daemons and tessera-worker (common/daemon/daemon_init.h): large message buffers stay mapped between calls
  // (otherwise every large push and pull page-faults its memory in again), and Abseil's deadlock detection, a
  // graph search on every lock, is off.
  tessera::KeepTransientBuffersMapped();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // The library's logs go to stderr, as the daemons' do.
  if (!google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging("tessera-python");
  }
  py::register_exception<tessera::StatusError>(m, "Error", PyExc_RuntimeError);

  tessera::BindFunctions(m);
  tessera::BindBatchSchedule(m);
  tessera::BindSteps(m);
  py::class_<tessera::PyClient> client(m, "Client", "A worker's connection to a job (PsClient).");
  tessera::BindClientJob(client);
  tessera::BindClientDeclarations(client);
  tessera::BindClientRows(client);
  tessera::BindClientExchange(client);
  tessera::BindClientEnd(client);
}
