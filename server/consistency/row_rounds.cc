#include "server/consistency/row_rounds.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {

// Pulls that may wait on one table's round at once (a bound on what a retrying client can park).
constexpr size_t kMaxParkedPulls = 4096;

tessera::v1::RowPushResponse Late() {
  tessera::v1::RowPushResponse response;
  response.set_late(true);
  return response;
}

// The rows of `push`'s ids a plain answer reports before its round applies (backup workers: answered collected).
tessera::v1::RowPushResponse Collected(const RowPush& push) {
  tessera::v1::RowPushResponse response;
  for (const SlotRows& s : push.slots) response.set_rows_updated(response.rows_updated() + s.rows.ids.size());
  return response;
}

}  // namespace

RowWaiter WaiterOf(const RowPush& push, RowAnswer done) {
  RowWaiter waiter;
  waiter.done = std::move(done);
  for (const SlotRows& s : push.slots) waiter.ids.emplace_back(s.slot, s.rows.ids);
  return waiter;
}

tessera::v1::RowPushResponse AnswerOf(const RowWaiter& waiter, const RowUpdateResult& result) {
  tessera::v1::RowPushResponse response;
  response.set_duplicate(result.duplicate);
  int64_t updated = 0, refused = 0;
  for (const auto& [slot, ids] : waiter.ids) {
    auto it = result.refused.find(slot);
    for (uint64_t id : ids) {
      const bool no = it != result.refused.end() && std::binary_search(it->second.begin(), it->second.end(), id);
      (no ? refused : updated) += 1;
    }
  }
  if (result.duplicate) updated = refused = 0;
  response.set_rows_updated(updated);
  response.set_rows_refused(refused);
  return response;
}

void RowRounds::Admit(RowPush push, RowAnswer done, const Roster& roster, const RowApplier& apply,
                      RowsTaken& taken) {
  absl::MutexLock lock(&mu_);
  Round& round = rounds_[push.spec->name];
  round.spec = push.spec;
  const int worker = push.worker;
  const std::string what = absl::StrCat("push to rows of '", push.spec->name, "'");
  if (auto seen = round.last_seq.find(worker); seen != round.last_seq.end() && push.seq <= seen->second) {
    // A retry. Of a push its round still collects: without decisions it waits for the round like the original.
    if (!decided_ && round.collected.count(worker) > 0 && round.collected[worker].seq == push.seq) {
      round.waiters.push_back(WaiterOf(push, std::move(done)));
      return;
    }
    tessera::v1::RowPushResponse duplicate;
    duplicate.set_duplicate(true);
    taken.now.emplace_back(std::move(done), duplicate);
    return;
  }
  if (push.clock <= round.closed || (round.open >= 0 && push.clock < round.open)) {
    // Its round closed without it: never mixed into a later one.
    round.last_seq[worker] = push.seq;
    ++taken.late;
    taken.now.emplace_back(std::move(done), Late());
    return;
  }
  if (round.open >= 0 && push.clock > round.open) {
    taken.now.emplace_back(std::move(done), absl::UnavailableError(absl::StrCat(
                                                what, ": round ", push.clock, " is not open yet; server's rows of '",
                                                push.spec->name, "' are collecting round ", round.open)));
    return;
  }
  if (round.collected.count(worker) > 0) {
    taken.now.emplace_back(std::move(done),
                           absl::AbortedError(absl::StrCat(what, ": worker ", worker, " already pushed round ",
                                                           round.open, " with another seq")));
    return;
  }
  round.open = push.clock;
  round.last_seq[worker] = push.seq;
  if (decided_) {
    taken.now.emplace_back(std::move(done), Collected(push));
  } else {
    round.waiters.push_back(WaiterOf(push, std::move(done)));
  }
  round.collected[worker] =
      Contribution{push.seq, push.batch_size, push.lr_factor, push.skip, std::move(push.slots)};
  if (CompleteLocked(round, roster)) CloseLocked(round, apply, taken);
}

void RowRounds::CloseComplete(const Roster& roster, const RowApplier& apply, RowsTaken& taken) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, round] : rounds_) {
    if (CompleteLocked(round, roster)) CloseLocked(round, apply, taken);
  }
}

bool RowRounds::CompleteLocked(const Round& round, const Roster& roster) const {
  if (round.collected.empty()) return false;
  auto in = [&](int w) { return round.collected.count(w) > 0; };
  if (decided_) {
    std::shared_ptr<const std::vector<int>> members = members_of_(round.open);
    if (members == nullptr) return false;
    for (int w : *members) {
      if (w < static_cast<int>(roster.active.size()) && roster.InRound(w, round.open) && !in(w)) return false;
    }
    return true;
  }
  for (size_t w = 0; w < roster.active.size(); ++w) {
    if (roster.InRound(static_cast<int>(w), round.open) && !in(static_cast<int>(w))) return false;
  }
  return true;
}

void RowRounds::CloseLocked(Round& round, const RowApplier& apply, RowsTaken& taken) {
  std::shared_ptr<const std::vector<int>> members = decided_ ? members_of_(round.open) : nullptr;
  auto member = [&](int w) {
    return members == nullptr || std::binary_search(members->begin(), members->end(), w);
  };
  RowUpdate update;
  update.spec = round.spec;
  update.clock = round.open;
  double weight = 0;
  bool first = true;
  // Each slot's members' rows, in ascending worker order.
  std::map<RowSlot*, std::vector<std::pair<int, const RowGradients*>>> by_slot;
  for (const auto& [w, c] : round.collected) {
    if (!member(w)) {
      ++taken.late;  // left out of the round the scheduler decided
      continue;
    }
    weight += c.batch_size;
    update.lr_factor = first ? c.lr_factor : std::min(update.lr_factor, c.lr_factor);
    update.skip = update.skip || c.skip;
    first = false;
    update.pushes.emplace_back(w, c.seq);
    for (const SlotRows& s : c.slots) by_slot[s.slot].emplace_back(c.batch_size, &s.rows);
  }
  const int64_t dim = round.spec->dim;
  const float inv = weight > 0 ? static_cast<float>(1.0 / weight) : 0.0f;
  for (auto& [slot, parts] : by_slot) {
    SlotRows merged;
    merged.slot = slot;
    for (const auto& [b, rows] : parts) merged.rows.ids.insert(merged.rows.ids.end(), rows->ids.begin(), rows->ids.end());
    std::sort(merged.rows.ids.begin(), merged.rows.ids.end());
    merged.rows.ids.erase(std::unique(merged.rows.ids.begin(), merged.rows.ids.end()), merged.rows.ids.end());
    merged.rows.grads.assign(merged.rows.ids.size() * dim, 0.0f);
    for (const auto& [b, rows] : parts) {
      const float w = static_cast<float>(b);
      size_t at = 0;
      for (size_t i = 0; i < rows->ids.size(); ++i) {
        while (merged.rows.ids[at] != rows->ids[i]) ++at;  // both ascending
        float* out = merged.rows.grads.data() + at * dim;
        const float* g = rows->grads.data() + i * dim;
        for (int64_t j = 0; j < dim; ++j) out[j] += w * g[j];
      }
    }
    for (float& g : merged.rows.grads) g *= inv;
    update.slots.push_back(std::move(merged));
  }
  update.waiters = std::move(round.waiters);
  round.waiters.clear();
  RowUpdateResult result;
  if (!update.skip && !update.slots.empty()) result = apply(update);
  round.closed = round.open;
  round.open = -1;
  round.collected.clear();
  for (auto& pull : round.pulls) taken.pulls.push_back(std::move(pull));
  round.pulls.clear();
  taken.applied.emplace_back(std::move(update), std::move(result));
}

absl::StatusOr<bool> RowRounds::ParkPull(const std::string& table, int64_t clock, std::function<void()> retry) {
  absl::MutexLock lock(&mu_);
  auto it = rounds_.find(table);
  if (it == rounds_.end()) return false;
  Round& round = it->second;
  if (round.open < 0 || round.open >= clock || round.collected.empty()) return false;
  if (!cancelled_.ok()) return cancelled_;
  if (round.pulls.size() >= kMaxParkedPulls) {
    return absl::UnavailableError(absl::StrCat(round.pulls.size(), " pulls of rows of '", table,
                                               "' wait for round ", round.open, " already"));
  }
  round.pulls.push_back(std::move(retry));
  return true;
}

void RowRounds::ResetLocked(Round& round, const absl::Status& why, RowsTaken& taken) {
  for (const auto& [w, c] : round.collected) round.last_seq.erase(w);
  for (RowWaiter& waiter : round.waiters) taken.now.emplace_back(std::move(waiter.done), why);
  round.waiters.clear();
  round.collected.clear();
  round.open = -1;
  for (auto& pull : round.pulls) taken.pulls.push_back(std::move(pull));
  round.pulls.clear();
}

void RowRounds::Drop(const std::function<bool(RowSlot&)>& gone, const absl::Status& why, bool forget,
                     RowsTaken& taken) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, round] : rounds_) {
    bool drop = forget;
    for (const auto& [w, c] : round.collected) {
      for (const SlotRows& s : c.slots) {
        if (drop) break;
        absl::MutexLock slot_lock(&s.slot->mu);
        drop = gone(*s.slot);
      }
    }
    if (drop) ResetLocked(round, why, taken);
    if (forget) {
      round.closed = -1;
      round.last_seq.clear();
    }
  }
}

void RowRounds::Cancel(const absl::Status& why, RowsTaken& taken) {
  absl::MutexLock lock(&mu_);
  cancelled_ = why.ok() ? absl::UnavailableError("the server is shutting down") : why;
  for (auto& [name, round] : rounds_) {
    for (RowWaiter& waiter : round.waiters) taken.now.emplace_back(std::move(waiter.done), why);
    round.waiters.clear();
    for (auto& pull : round.pulls) taken.pulls.push_back(std::move(pull));
    round.pulls.clear();
  }
}

}  // namespace tessera
