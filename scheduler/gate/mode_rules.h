// What the job's consistency mode means to the scheduler, decided once per job (ModeRules::ForJob), so that the
// coordinator and its parts ask a rule instead of the mode:
//
//              gate bound   checkpoints, lost server                         a returning rank starts at
//   SYNC       0            one cut: every worker held at one clock; every  the round after the newest any
//                           chunk and worker go back to it                   worker started
//   SSP(s)     s            as each chunk is; only the lost server's        its last clock, or the slowest
//                           chunks go back                                   active worker's when ahead
//   ASYNC      -1 (none)    as SSP                                           its last clock
#ifndef TESSERA_SCHEDULER_GATE_MODE_RULES_H_
#define TESSERA_SCHEDULER_GATE_MODE_RULES_H_

#include <cstdint>
#include <vector>

#include "proto/job.pb.h"

namespace tessera {

struct ModeRules {
  static ModeRules ForJob(const tessera::v1::ConsistencySpec& consistency);

  // The clock table's gate: -1 for no gate, 0 for lockstep, s for at most s clocks apart.
  int gate_bound = 0;
  // Checkpoints are consistent cuts (the workers held at one clock), and a lost server rolls the whole job back
  // to the last one.
  bool consistent_cut = true;
  // Backup workers per round (SYNC only; 0 otherwise).
  int backup_workers = 0;

  // The clock a rank coming back starts at, from its own last clock and the active workers' clocks.
  int64_t ReturningStart(int64_t own, const std::vector<int64_t>& active) const;

 private:
  enum class Start { kOwn, kOwnOrSlowest, kAfterNewest };
  Start start_ = Start::kAfterNewest;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_GATE_MODE_RULES_H_
