#include "worker/client/chunk_calls.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"

namespace tessera {

std::string ChunkCall::What() const {
  if (op == kRowPull) return absl::StrCat("pull of rows of '", row_pull().table(), "' at ", server);
  if (op == kRowPush) return absl::StrCat("push of rows of '", row_push().table(), "' at ", server);
  return absl::StrCat(op == kPull ? "Pull " : op == kExchange ? "PushPull " : op == kNorm ? "PushPull (norm) " : "Push ", placement->param(), "/",
                      placement->index(), " at ", server);
}

namespace {

WireEncoding GradientEncoding(const tessera::v1::WireSpec& wire) {
  WireEncoding encoding;
  encoding.precision = wire.gradients();
  encoding.sparse = wire.gradient_top_k() > 0;
  encoding.top_k = wire.gradient_top_k();
  return encoding;
}

std::string_view BytesOf(absl::Span<const float> values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)};
}

}  // namespace

ChunkCaller::ChunkCaller(std::unique_ptr<ChunkTransport> transport, const tessera::v1::WireSpec& wire)
    : transport_(std::move(transport)), gradients_(GradientEncoding(wire)), values_(wire.values()) {}

void ChunkCaller::EncodeGradientOf(ChunkCall& call, absl::Span<const float> grad, uint64_t seq) {
  tessera::v1::PushRequest& r = call.push();
  if (!gradients_.sparse && gradients_.precision == tessera::v1::WireSpec::FP32) {
    call.src = BytesOf(grad);  // exact: straight from the caller's memory
    return;
  }
  Feedback& f = feedback_[call.key()];
  if (f.sent == nullptr || f.seq != seq) {
    if (f.residual.size() != grad.size()) f.residual.assign(grad.size(), 0.0f);
    std::shared_ptr<PooledBuffer> buffer = buffers_.Get(std::max<size_t>(MaxEncodedBytes(gradients_, grad.size()), 1));
    const EncodedGradient sent = EncodeGradient(grad, absl::MakeSpan(f.residual), gradients_, buffer->data());
    f.length = sent.bytes;
    f.sparse = sent.sparse;
    f.sent = std::move(buffer);
    f.seq = seq;
  }
  call.src = std::string_view(f.sent->data(), f.length);
  call.src_owner = f.sent;
  r.set_data_precision(gradients_.precision);
  r.set_data_sparse(f.sparse);
}

absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> ChunkCaller::Make(
    ChunkOp op, const std::shared_ptr<const ShardMapIndex>& map, size_t name_index, const std::string& name,
    absl::Span<const float> grad, int batch_size, absl::Span<float> out, Stamp stamp, const CallerIdentity& who,
    const PulledChunks& pulled, absl::Duration timeout, size_t begin, size_t end) {
  if (map == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  TESSERA_ASSIGN_OR_RETURN(const tessera::v1::ParameterSpec* spec, map->Param(name));
  const size_t expected = static_cast<size_t>(NumElements(spec->shape()));
  const bool sends = op != kPull;
  const bool receives = op == kPull || op == kExchange;
  if ((sends && grad.size() != expected) || (receives && out.size() != expected)) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has shape ", ShapeString(spec->shape()),
                                                   " (", expected, " values); the span holds ",
                                                   sends && grad.size() != expected ? grad.size() : out.size()));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<const tessera::v1::ChunkPlacement*> chunks, map->Chunks(name));
  TESSERA_ASSIGN_OR_RETURN(const int position, map->ParamPosition(name));
  const auto priority = static_cast<uint32_t>(position);
  std::vector<std::unique_ptr<ChunkCall>> calls;
  for (const tessera::v1::ChunkPlacement* placement : chunks) {
    const auto chunk_begin = static_cast<size_t>(placement->offset());
    if (chunk_begin < begin || chunk_begin + static_cast<size_t>(placement->length()) > end) continue;
    // A chunk of a server the view no longer has is moving to another one: retry once the view says where.
    if (absl::StatusOr<std::string> server = map->ServerAddress(placement->server_id()); !server.ok()) {
      return absl::UnavailableError(absl::StrCat("chunk ", placement->param(), "/", placement->index(), " is on server ",
                                                 placement->server_id(), ", which is out of the cluster view at epoch ",
                                                 map->epoch(), "; its chunks are moving"));
    }
    auto call = std::make_unique<ChunkCall>();
    call->op = op;
    call->map = map;
    call->placement = placement;
    call->name_index = name_index;
    call->priority = priority;
    call->server_id = placement->server_id();
    call->server = map->ServerAddress(placement->server_id()).value_or("?");
    call->timeout = timeout;
    call->transport = transport_.get();
    auto cached = pulled.find({placement->param(), placement->index()});
    if (receives) call->dst = out.subspan(placement->offset(), placement->length());
    if (op == kPull) {
      tessera::v1::PullRequest& r = call->pull();
      r.set_epoch(map->epoch());
      r.set_worker_id(who.worker_id);
      r.mutable_key()->set_param(placement->param());
      r.mutable_key()->set_index(placement->index());
      const bool same_memory = cached != pulled.end() && cached->second.where == call->dst.data();
      r.set_have_version(same_memory ? cached->second.version : -1);
      // Module state (buffers, a script optimizer's state) is assigned exactly and comes back exactly.
      r.set_reply_precision(spec->state() ? tessera::v1::WireSpec::FP32 : values_);
    } else {
      tessera::v1::PushRequest& r = call->push();
      r.set_epoch(map->epoch());
      r.set_worker_id(who.worker_id);
      r.set_incarnation(who.incarnation);
      r.set_seq(stamp.seq);
      r.set_clock(stamp.clock);
      r.set_read_clock_version(cached == pulled.end() ? stamp.clock : cached->second.clock_version);
      r.set_batch_size(batch_size);
      r.set_kind(op == kAssign ? tessera::v1::PushRequest::ASSIGN : tessera::v1::PushRequest::GRADIENT);
      r.mutable_key()->set_param(placement->param());
      r.mutable_key()->set_index(placement->index());
      r.set_priority(priority);
      if (op != kAssign && stamp.lr_factor >= 0.0f) r.set_lr_factor(stamp.lr_factor);
      if (op != kAssign) r.set_skip(stamp.skip);
      r.set_norm_only(op == kNorm);
      const absl::Span<const float> chunk = grad.subspan(placement->offset(), placement->length());
      if (op == kAssign) {
        call->src = BytesOf(chunk);  // assignments are exact
      } else if (stamp.skip || op == kNorm) {
        // Never applied: the error feedback's residual waits for the gradient that is (a norm round's is exact).
        call->src = BytesOf(chunk);
      } else {
        EncodeGradientOf(*call, chunk, stamp.seq);
      }
    }
    TESSERA_RETURN_IF_ERROR(transport_->Prepare(*call, who));
    calls.push_back(std::move(call));
  }
  return calls;
}

ChunkBatch::~ChunkBatch() {
  CancelAll();
  WaitAll();
}

void ChunkBatch::Add(std::unique_ptr<ChunkCall> call) {
  ChunkCall* c = call.get();
  bool start = false;
  {
  absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
    ++pending_;
    ++pending_by_name_[c->name_index];
    Server& s = servers_[c->server_id];
    if (s.in_flight < window_) {
      ++s.in_flight;
      start = true;
    } else {
      s.queue.emplace(c->priority, c);
    }
  }
  if (!start) return;
  if (launcher_ != nullptr) {
    // Earlier layers first there too. The destructor waits for every call, launched or not.
    launcher_->Submit([this, c] { Launch(c); }, c->priority);
  } else {
    Launch(c);
  }
}

void ChunkBatch::WaitAll(const std::function<bool()>& give_up) {
  while (give_up) {
    {
      absl::MutexLock lock(&mu_);
      if (pending_ == 0) return;
      call_done_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
      if (pending_ == 0) return;
    }
    if (give_up()) {
      CancelAll();
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](size_t* p) { return *p == 0; }, &pending_));
}

bool ChunkBatch::WaitForName(size_t name_index, const std::function<bool()>& give_up) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (pending_by_name_[name_index] == 0) return true;
      call_done_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
      if (pending_by_name_[name_index] == 0) return true;
    }
    if (give_up && give_up()) return false;
  }
}

std::vector<ChunkCall*> ChunkBatch::CallsOf(size_t name_index) {
  absl::MutexLock lock(&mu_);
  std::vector<ChunkCall*> out;
  for (auto& c : calls_) {
    if (c->name_index == name_index) out.push_back(c.get());
  }
  return out;
}

std::vector<ChunkCall*> ChunkBatch::calls() {
  absl::MutexLock lock(&mu_);
  std::vector<ChunkCall*> out;
  for (auto& c : calls_) out.push_back(c.get());
  return out;
}

void ChunkBatch::CancelAll() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (auto& c : calls_) c->transport->Cancel(c.get());
  for (auto& [id, s] : servers_) {
    pending_ -= s.queue.size();
    for (auto& [prio, c] : s.queue) {
      c->status = absl::CancelledError(c->What() + ": cancelled");
      --pending_by_name_[c->name_index];
    }
    s.queue.clear();
  }
  call_done_.SignalAll();
}

void ChunkBatch::Launch(ChunkCall* c) {
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    cancelled = cancelled_;
  }
  // A call still waiting for the launcher when the batch was cancelled never starts (a transport may not know
  // a call it has not started, and one that started now could wait for a round that never closes).
  if (cancelled) {
    c->status = absl::CancelledError(c->What() + ": cancelled");
    OnDone(c);
    return;
  }
  c->transport->Start(c, [this, c] { OnDone(c); });
}

void ChunkBatch::OnDone(ChunkCall* c) {
  ChunkCall* next = nullptr;
  {
  absl::MutexLock lock(&mu_);
    Server& s = servers_[c->server_id];
    if (!s.queue.empty() && !cancelled_) {
      next = s.queue.begin()->second;
      s.queue.erase(s.queue.begin());
    } else {
      --s.in_flight;
    }
    --pending_;
    --pending_by_name_[c->name_index];
    call_done_.SignalAll();
  }
  if (next != nullptr) Launch(next);
}

}  // namespace tessera
