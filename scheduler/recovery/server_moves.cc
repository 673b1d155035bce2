#include "scheduler/recovery/server_moves.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace tessera {

namespace {
// How long the first phase of a move may take to fill the new copies.
constexpr absl::Duration kFillTimeout = absl::Seconds(60);
}  // namespace

void ServerMoves::OnMembership(const MembershipEvent& event) {
  if (event.kind == MembershipEvent::kServerReplaced && parts_.view->placed()) {
    parts_.executor->Submit([this, m = event.member] { GiveShareTo(m); });
  }
}

void ServerMoves::GiveShareTo(const Member& server) {
  const absl::Time start = absl::Now();
  // Its registration made a new epoch, which every server must hold, whatever moves.
  absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> backed_up = parts_.view->GiveShareTo(server.id);
  absl::Status done = backed_up.status();
  if (done.ok()) done = parts_.servers->Assign(*parts_.view->Map(), *parts_.job);
  // Then primaries, in two phases: copied while their owners serve, then switched (no checkpoint, no rollback).
  const std::vector<ChunkMove> moves = parts_.view->ShareMoves(server.id);
  if (done.ok()) done = MoveInTwoPhases(moves);
  if (!done.ok()) {
    // The servers that did take a view serve it; those that did not answer are found by the failure detector.
    LOG(WARNING) << "giving " << server.Describe() << " a share of the chunks: " << done;
    return;
  }
  LOG(INFO) << server.Describe() << " took " << moves.size() << " chunks"
            << (backed_up->empty() ? "" : absl::StrCat(" and backs up ", backed_up->size()))
            << " at cluster view epoch " << parts_.view->epoch() << ", in "
            << absl::FormatDuration(absl::Now() - start);
  parts_.records->AddEvent({{"event", "server joined, chunks moved to it"},
                            {"server", server.id},
                            {"chunks_moved", moves.size()},
                            {"chunks_backed_up", backed_up->size()},
                            {"seconds", absl::ToDoubleSeconds(absl::Now() - start)}});
}

absl::Status ServerMoves::MoveInTwoPhases(const std::vector<ChunkMove>& moves) {
  if (moves.empty()) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(parts_.view->BeginMoves(moves));
  TESSERA_RETURN_IF_ERROR(parts_.servers->Assign(*parts_.view->Map(), *parts_.job));
  TESSERA_RETURN_IF_ERROR(WaitUntilFilled());
  TESSERA_RETURN_IF_ERROR(parts_.view->FinishMoves(moves));
  return parts_.servers->Assign(*parts_.view->Map(), *parts_.job);
}

absl::Status ServerMoves::WaitUntilFilled() {
  const absl::Time deadline = absl::Now() + kFillTimeout;
  while (true) {
    int64_t unfilled = 0;
    absl::Status answered;
    for (const ServerStatsAnswer& a : parts_.servers->Stats(*parts_.view->Map())) {
      if (!a.stats.ok()) {
        answered = a.stats.status();
        break;
      }
      unfilled += a.stats->unfilled_chunks();
    }
    if (answered.ok() && unfilled == 0) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the new copies were not filled within ", absl::FormatDuration(kFillTimeout), " (",
          answered.ok() ? absl::StrCat(unfilled, " chunks left") : std::string(answered.message()), ")"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<std::string> ServerMoves::Drain(int server) {
  const absl::Time start = absl::Now();
  if (!parts_.view->placed()) return absl::FailedPreconditionError("the job has placed no parameters yet");
  const std::vector<Member> servers = parts_.view->Servers();
  if (server < 0 || server >= static_cast<int>(servers.size()) || servers[server].state != MemberState::kAlive) {
    return absl::FailedPreconditionError(absl::StrCat("server ", server, " is not alive in the job"));
  }
  const Member drained = servers[server];
  TESSERA_ASSIGN_OR_RETURN(const std::vector<ChunkMove> moves, parts_.view->DrainMoves(server));
  LOG(INFO) << "draining " << drained.Describe() << ": " << moves.size() << " chunk copies move to the others";
  TESSERA_RETURN_IF_ERROR(MoveInTwoPhases(moves));
  // It holds nothing now: it leaves the view (done, not lost), which goes to the others and then to it, and exits.
  if (!parts_.view->MarkServerDrained(server)) {
    return absl::FailedPreconditionError(absl::StrCat(drained.Describe(), " was lost while it was drained"));
  }
  const tessera::v1::ShardMap map = *parts_.view->Map();
  TESSERA_RETURN_IF_ERROR(parts_.servers->Assign(map, *parts_.job));
  LetGo(drained, map);
  parts_.records->AddEvent({{"event", "server drained"},
                            {"server", drained.id},
                            {"address", drained.address},
                            {"chunks_moved", moves.size()},
                            {"clocks_lost", 0},
                            {"seconds", absl::ToDoubleSeconds(absl::Now() - start)}});
  const std::string text = absl::StrCat(drained.Describe(), " drained: ", moves.size(),
                                        " chunk copies moved to the other servers in ",
                                        absl::FormatDuration(absl::Now() - start), "; it exits\n");
  LOG(INFO) << text;
  return text;
}

void ServerMoves::LetGo(const Member& drained, const tessera::v1::ShardMap& map) {
  tessera::v1::ShardMap alone = map;
  alone.clear_servers();
  auto* info = alone.add_servers();
  info->set_id(drained.id);
  info->set_address(drained.address);
  info->set_incarnation(drained.incarnation);
  if (absl::Status s = parts_.servers->Assign(alone, *parts_.job); !s.ok()) {
    LOG(WARNING) << "handing the last view to drained " << drained.Describe() << ": " << s;
  }
  if (absl::Status s = parts_.servers->Shutdown(alone); !s.ok()) {
    LOG(WARNING) << "telling drained " << drained.Describe() << " to exit: " << s;
  }
}

}  // namespace tessera
