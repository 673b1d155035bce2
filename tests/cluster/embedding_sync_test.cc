// SYNC for embedding tables equals one process: on a real in-process cluster (two servers, real gRPC or UCX), 1,
// 2 and 3 workers with unequal batches push rows with ids repeated within and across workers, step after step;
// every row must then hold what one process gets by applying the table's optimizer once per step to each touched
// row's gradient of the mean loss over the union batch, for every row optimizer. With a backup worker that is
// always last (and slow, so that its clock moves on past rounds it missed), its rows are counted as late and never
// applied. Every pull at a step's start reads the values of
// the rounds before it.
#include <cmath>
#include <iostream>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/tables/row_optimizer.h"
#include "server/tables/sparse_table.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

using Kind = tessera::v1::RowOptimizerSpec::Kind;

constexpr int64_t kDim = 4;
constexpr int kSteps = 6;
constexpr int kIdsPerExample = 5;
const int kBatch[] = {8, 5, 3};  // worker w's examples per step: unequal shares

tessera::v1::ParameterSpec Table(Kind kind) {
  tessera::v1::ParameterSpec p;
  p.set_name("emb");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(kDim);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(0.1f);
  p.mutable_init()->set_seed(11);
  p.mutable_embedding()->set_slots(16);
  auto* optimizer = p.mutable_embedding()->mutable_optimizer();
  optimizer->set_kind(kind);
  optimizer->set_learning_rate(kind == tessera::v1::RowOptimizerSpec::SGD ? 0.5f : 0.05f);
  if (kind == tessera::v1::RowOptimizerSpec::FTRL) {
    optimizer->set_l1(0.001f);
    optimizer->set_l2(0.01f);
  }
  return p;
}

tessera::v1::ParameterSpec Dense() {
  tessera::v1::ParameterSpec p;
  p.set_name("w");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(4);
  return p;
}

// Example e of worker w at step s: its ids (skewed to a few hot ones, so that they repeat within an example, a
// batch and across workers) and, per id occurrence, the gradient of that example's loss.
struct Example {
  std::vector<uint64_t> ids;
  std::vector<float> grads;  // ids.size() rows of kDim
};
Example ExampleOf(int step, int worker, int e) {
  Example x;
  for (int k = 0; k < kIdsPerExample; ++k) {
    const uint32_t h = static_cast<uint32_t>(step * 7919 + worker * 104729 + e * 1299709 + k * 15485863);
    const uint64_t id = (h % 4 == 0) ? h % 3 : 1000 + (h / 4) % 40;  // ids 0..2 are hot
    x.ids.push_back(id * 2654435761ull);
    for (int64_t j = 0; j < kDim; ++j) x.grads.push_back(std::sin(0.37f * (h % 1000) + 0.91f * j) * 0.8f);
  }
  return x;
}

// One process: each step, every touched row takes the union batch's mean-loss gradient once.
class OneProcess {
 public:
  explicit OneProcess(const tessera::v1::ParameterSpec& table)
      : init_(table.init()), spec_(*RowOptimizerFromProto(table.embedding().optimizer())), optimizer_(spec_) {}

  // A step of the examples of `workers` (their batches in kBatch).
  void Step(int step, const std::vector<int>& workers) {
    int total = 0;
    std::map<uint64_t, std::vector<double>> sum;
    for (int w : workers) {
      total += kBatch[w];
      for (int e = 0; e < kBatch[w]; ++e) {
        Example x = ExampleOf(step, w, e);
        for (size_t i = 0; i < x.ids.size(); ++i) {
          std::vector<double>& s = sum[x.ids[i]];
          s.resize(kDim);
          for (int64_t j = 0; j < kDim; ++j) s[j] += x.grads[i * kDim + j];
        }
      }
    }
    for (auto& [id, s] : sum) {
      Row& row = RowOf(id);
      std::vector<float> g(kDim);
      for (int64_t j = 0; j < kDim; ++j) g[j] = static_cast<float>(s[j] / total);
      ++row.step;
      optimizer_.Apply(absl::MakeSpan(row.values), absl::MakeSpan(row.state), g, row.step);
    }
  }
  std::vector<float> Values(uint64_t id) {
    if (auto it = rows_.find(id); it != rows_.end()) return it->second.values;
    std::vector<float> v(kDim);
    FillRowInit(init_, "emb", id, absl::MakeSpan(v));
    return v;
  }

 private:
  struct Row {
    std::vector<float> values, state;
    int64_t step = 0;
  };
  Row& RowOf(uint64_t id) {
    auto [it, fresh] = rows_.try_emplace(id);
    if (fresh) {
      it->second.values.resize(kDim);
      FillRowInit(init_, "emb", id, absl::MakeSpan(it->second.values));
      it->second.state.resize(optimizer_.StateFloats(kDim));
      optimizer_.InitState(absl::MakeSpan(it->second.state));
    }
    return it->second;
  }

  const tessera::v1::InitSpec init_;
  const RowOptimizerSpec spec_;
  const RowOptimizer optimizer_;
  std::map<uint64_t, Row> rows_;
};

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff) / std::max(1e-12, std::sqrt(norm));
}

struct Case {
  Kind kind;
  int workers;
  tessera::v1::Transport transport;
  bool backup;  // one backup worker: the last worker is always late
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(tessera::v1::RowOptimizerSpec::Kind_Name(c.kind), "_", c.workers, "Workers_",
                      c.transport == tessera::v1::UCX ? "UCX" : "GRPC", c.backup ? "_OneLateBackup" : "");
}

class EmbeddingSyncTest : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingSyncTest, EveryRowOptimizerEqualsOneProcessOnTheUnionBatch) {
  const Case c = GetParam();
  tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::SYNC, /*servers=*/2, c.workers);
  job.set_transport(c.transport);
  job.set_trusted_network(c.transport == tessera::v1::UCX);
  job.mutable_stop()->set_max_steps(1000);  // the test decides when it ends
  if (c.backup) job.mutable_consistency()->set_backup_workers(1);
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < c.workers; ++w) {
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    clients.push_back(*std::move(client));
  }
  const tessera::v1::ParameterSpec table = Table(c.kind);
  const int late_worker = c.backup ? c.workers - 1 : -1;
  std::vector<int> members;
  for (int w = 0; w < c.workers; ++w) {
    if (w != late_worker) members.push_back(w);
  }
  // The values every row must read at the start of each step, and at the end.
  OneProcess reference(table);
  std::vector<OneProcess> before_step;
  for (int s = 0; s < kSteps; ++s) {
    before_step.push_back(reference);
    reference.Step(s, members);
  }
  // Members finish a step (their dense values arrived, so the round was decided and closed) before the late
  // worker sends that step's gradients.
  std::vector<std::vector<absl::Notification>> finished(c.workers);
  for (auto& f : finished) f = std::vector<absl::Notification>(kSteps);
  std::vector<absl::Status> results(c.workers);
  std::vector<double> pull_error(c.workers, 0);
  std::vector<int> late_pushes(c.workers, 0);
  std::vector<int> steps_taken(c.workers, 0);  // a late worker's clock moves on to the others' round: it skips
  std::vector<std::thread> threads;
  for (int w = 0; w < c.workers; ++w) {
    threads.emplace_back([&, w] {
      PsClient& client = *clients[w];
      results[w] = client.Declare({Dense(), table});
      auto fail = [&](absl::Status s) { results[w] = std::move(s); };
      if (!results[w].ok()) return;
      while (client.clock() < kSteps) {
        const int step = static_cast<int>(client.clock());
        std::vector<uint64_t> ids;
        std::vector<float> grads;
        for (int e = 0; e < kBatch[w]; ++e) {
          Example x = ExampleOf(step, w, e);
          ids.insert(ids.end(), x.ids.begin(), x.ids.end());
          for (float g : x.grads) grads.push_back(g / kBatch[w]);  // the gradient of the batch's mean loss
        }
        if (w == late_worker) {
          // Slower than the members, so that they run ahead and its clock moves on to their round (it skips).
          absl::SleepFor(absl::Milliseconds(20));
          for (int m : members) {
            if (!finished[m][step].WaitForNotificationWithTimeout(absl::Seconds(60))) {
              return fail(absl::DeadlineExceededError(
                  absl::StrCat("the late worker waited 60 s for worker ", m, " to finish step ", step)));
            }
          }
        } else {
          // The rows this step reads are the rounds before it.
          std::vector<float> rows(ids.size() * kDim);
          if (absl::Status s = client.PullRows("emb", ids, absl::MakeSpan(rows)); !s.ok()) return fail(s);
          for (size_t i = 0; i < ids.size(); ++i) {
            std::vector<float> got(rows.begin() + i * kDim, rows.begin() + (i + 1) * kDim);
            pull_error[w] = std::max(pull_error[w], RelativeError(got, before_step[step].Values(ids[i])));
          }
        }
        absl::StatusOr<PsClient::RowsPushed> pushed = client.PushRows("emb", ids, grads, kBatch[w]);
        if (!pushed.ok()) return fail(pushed.status());
        late_pushes[w] += pushed->late;
        ++steps_taken[w];
        // The names and spans stay valid until the values arrived.
        std::vector<float> dense_grad(4, 0.1f), dense(4);
        const std::vector<std::string> names = {"w"};
        const std::vector<absl::Span<const float>> grad_spans = {absl::MakeConstSpan(dense_grad)};
        const std::vector<absl::Span<float>> outs = {absl::MakeSpan(dense)};
        std::unique_ptr<StepExchange> exchange = client.BeginStep(names, grad_spans, kBatch[w], outs);
        absl::StatusOr<ClockResult> clock = exchange->Finish();
        if (!clock.ok()) return fail(clock.status());
        if (absl::Status s = exchange->WaitValues(0); !s.ok()) return fail(s);
        if (w != late_worker) finished[w][step].Notify();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < c.workers; ++w) ASSERT_THAT(results[w], IsOk()) << "worker " << w;
  for (int w : members) EXPECT_LT(pull_error[w], 1e-5) << "worker " << w << "'s pulls";
  // Every row the job touched, as one process has it.
  std::vector<uint64_t> touched;
  for (int s = 0; s < kSteps; ++s) {
    for (int w = 0; w < c.workers; ++w) {
      for (int e = 0; e < kBatch[w]; ++e) {
        Example x = ExampleOf(s, w, e);
        touched.insert(touched.end(), x.ids.begin(), x.ids.end());
      }
    }
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  std::vector<float> after(touched.size() * kDim);
  ASSERT_THAT(clients[0]->PullRows("emb", touched, absl::MakeSpan(after)), IsOk());
  std::vector<float> want;
  for (uint64_t id : touched) {
    std::vector<float> v = reference.Values(id);
    want.insert(want.end(), v.begin(), v.end());
  }
  EXPECT_LT(RelativeError(after, want), 1e-5);
  std::cout << "relative error of the rows from one process: " << RelativeError(after, want) << std::endl;
  for (size_t i = 0; i < touched.size(); ++i) {
    std::vector<float> got(after.begin() + i * kDim, after.begin() + (i + 1) * kDim);
    ASSERT_LT(RelativeError(got, reference.Values(touched[i])), 1e-5) << "row " << touched[i];
  }
  if (c.backup) {
    // The late worker's rows were counted on both servers, in every step it took, and never applied.
    int64_t late = 0;
    for (int s = 0; s < 2; ++s) late += (*cluster)->server(s).store().Stats().late_pushes();
    ASSERT_GT(steps_taken[late_worker], 0);
    EXPECT_GE(late, 2 * steps_taken[late_worker]);
  } else {
    for (int w = 0; w < c.workers; ++w) EXPECT_EQ(late_pushes[w], 0);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (tessera::v1::Transport transport : {tessera::v1::GRPC, tessera::v1::UCX}) {
    for (Kind kind : {tessera::v1::RowOptimizerSpec::SGD, tessera::v1::RowOptimizerSpec::ADAGRAD,
                      tessera::v1::RowOptimizerSpec::ROWWISE_ADAGRAD, tessera::v1::RowOptimizerSpec::FTRL,
                      tessera::v1::RowOptimizerSpec::LAZY_ADAM}) {
      for (int workers : {1, 2, 3}) cases.push_back(Case{kind, workers, transport, false});
      cases.push_back(Case{kind, 3, transport, true});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(RowOptimizers, EmbeddingSyncTest, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace tessera::testing
