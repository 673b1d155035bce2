"""SYNC with optimizer { kind: SCRIPT } (DistributedOptimizer): the exchange brings the workers' mean gradient,
which becomes each parameter's .grad, and every worker's optimizer makes the same step. The keeper (rank 0, or
while it is away the lowest-ranked worker there) sends its values and the optimizer's state only when something
needs them (a checkpoint's cut, a joiner); a digest of the values every check_every clocks shows that every
worker stays equal; a worker that starts where the job is takes the keeper's values, or a checkpoint's with that
step's mean gradient, replaying the step; a rollback goes back to a checkpoint the same way."""

import gc

import numpy as np
import torch

from .. import Error
from .exchange import _ServersOptimizerExchange
from .optimizer import _DIGEST, _FOUND_INF
from .step import _REPLAY_BLOCK


class _ScriptSyncExchange(_ServersOptimizerExchange):
    """SYNC with the script's optimizer (see the module's comment)."""

    def __init__(self, model):
        super().__init__(model)
        # (clock, clock of the values taken) when the next block replays a checkpoint's step (end_replay), else
        # None.
        self.replay = None
        self.saved_for = -1  # the clock of the last values known to be on the servers
        self.digests = {}  # this worker's digest of its values, by clock

    def open_own_block(self):
        m = self.model
        if m._joining:
            raise Error(f"FAILED_PRECONDITION: this worker joined the SYNC job at clock {m.clock}, whose values "
                        "are the workers' own: wrap the optimizer in tt.DistributedOptimizer before the first step, "
                        "so that it takes the keeper's values and optimizer state")
        if self.replay is None:
            return False
        for _, p in m._params:
            p.grad = None  # backward's gradients go to memory of their own, and are not used
        m._current = _REPLAY_BLOCK
        m._waited = 0.0
        return True

    def open_block(self, batch_size):
        m = self.model
        if (m.rank == m._keeper and m._optimizer_state is not None and self.saved_for != m.clock
                and (m.clock in m._gate.get("joining_clocks", ())
                     or m._gate.get("checkpoint_clock", 0) == m.clock + 1
                     or (m._state_every > 0 and m.clock % m._state_every == 0))):
            # Before this step's gradients leave, and only when something needs them: a worker joining at this
            # clock (the gate names it) waits for them, and a checkpoint cut at the next clock (the gate announces
            # it) holds them beside this step's mean gradient.
            m._optimizer_state.save(m.clock, values=True)
            self.saved_for = m.clock
        return False

    def end(self, step, busy):
        m = self.model
        if m._current is _REPLAY_BLOCK:
            self.end_replay()
            step.gate = m._gate
            return False
        if not self._send_and_finish(step, busy):
            return False
        if m._take_rollback():
            step.gate = m._gate
            return False
        try:
            self.install_mean_gradients()
        except Error:
            if not m._take_rollback():  # the job went back to a checkpoint while the mean was awaited
                raise
            step.gate = m._gate
        return False

    def after_optimizer_step(self):
        """Every check_every clocks, this worker's digest of its values is kept, and the keeper sends its own to
        the servers."""
        m = self.model
        clock = m.clock
        if m._gate["stop"]:
            return  # the job is over: its servers may be leaving
        if m._check_every <= 0 or clock % m._check_every:
            return
        digest = self.values_digest()
        if m.rank == m._keeper:
            try:
                m._client.assign([_DIGEST], [np.array([clock, *digest], np.float32)])
            except Error:
                m._pending_rollback = m._client.take_rollback()
                if m._pending_rollback is None:
                    raise
        else:
            self.digests = {clock: digest}

    def install_mean_gradients(self):
        """SYNC: once the round's mean gradient is in, it becomes each parameter's .grad (the script's optimizer
        steps on it); then the keeper's digest of the values two blocks back is compared with this worker's."""
        m = self.model
        n = len(m._params)
        if m._previous is not None:
            try:
                for i in range(n + 1):  # the parameters' means and the round's flag
                    m._previous.wait_values(i)
            except Error:
                if not m._previous.stopped:
                    raise
                m._after(None)
                for _, p in m._params:
                    p.grad = None  # the optimizer makes no step on a mean that did not arrive
                print(f"tessera: worker {m.rank}: the job stopped before the round's mean gradient arrived; the "
                      "optimizer's last step is skipped", flush=True)
                return
        m._after(None)
        self.install_means()
        self.compare_digest()

    def install_means(self):
        """The round's mean gradient, in the exchange's buffers, becomes each parameter's .grad (NaN when a
        worker's gradient was not finite: so is the round's, on every worker)."""
        m = self.model
        if m._values[-1][0] > 0:
            for mean in m._values[:-1]:
                mean.fill(np.nan)
        for (_, p), mean in zip(m._params, m._values):
            p.grad = torch.from_numpy(mean).to(p.device) if m._mirror is not None else torch.from_numpy(mean)

    def pull_means(self, clock):
        """Pulls the chunks' mean gradient of step clock - 1 into the exchange's buffers (a checkpoint's, cut at
        `clock`). False when the chunks do not all hold that step's (their round is not `clock`)."""
        m = self.model
        for _, p in m._params:
            p.grad = None  # the last round's mean, over these buffers: no backward may add into them now
        m._client.pull([_FOUND_INF], [m._values[-1]])
        if m._client.pulled_clock(_FOUND_INF) != clock:
            return False
        names = m.names + [_FOUND_INF]
        m._client.pull(names, m._values)
        return all(m._client.pulled_clock(n) == clock for n in names)

    def take_kept_values(self):
        """SYNC with SCRIPT, a worker that started where the job is (joined, rejoined, resumed): takes the
        keeper's values, optimizer state and rates; with a checkpoint's, of the clock before, its first block
        replays that step (end_replay)."""
        m = self.model
        clock = m.clock
        took = m._optimizer_state.take_values(clock)
        m._joining = False
        self.saved_for = took
        if took == clock:
            print(f"tessera: worker {m.rank}: joined at clock {clock} with the keeper's values and optimizer "
                  "state", flush=True)
            return
        self.replay = (clock, took)
        m._gate = dict(m._gate, clock=took)
        print(f"tessera: worker {m.rank}: took the checkpoint's values of clock {took}: its first step ends with "
              f"that step's mean gradient, so that the optimizer makes it again, then it goes on at {clock}",
              flush=True)

    def end_replay(self):
        """The end of a replayed block: the gradients backward made stay unused; .grad holds the checkpoint's mean
        gradient of this step (pulled when the values were taken; None when the values taken were of the job's
        clock already: the optimizer's step changes nothing), and the clock is the job's again."""
        m = self.model
        (clock, took), self.replay = self.replay, None
        m._current = None
        for table in m._tables:
            table._abandon()  # the checkpoint's rows already hold this step's update
        self.install_means_or_none(clock, took)
        m._gate = dict(m._gate, clock=clock)

    def install_means_or_none(self, clock, took):
        m = self.model
        if took == clock - 1:
            self.install_means()
        else:
            for _, p in m._params:
                p.grad = None

    def roll_back(self, to, in_block):
        """SYNC with SCRIPT: the checkpoint holds the keeper's values, optimizer state and rates of clock to - 1
        and that step's mean gradient: they become the parameters, the optimizer's state and .grad, so that the
        script's clipping and optimizer step after this block (`in_block`; else after the block that begins now,
        a replay) make the checkpoint's step again, and the schedulers of the optimizer go back to it. (Values of
        `to` itself, which the keeper saved after the cut: .grad is None, the step changes nothing.)"""
        m = self.model
        if m._optimizer_state is None:
            raise Error(f"FAILED_PRECONDITION: the job went back to the checkpoint of clock {to}; with optimizer "
                        "{ kind: SCRIPT } in SYNC the values are the workers' own, and only tt.DistributedOptimizer "
                        "takes them back")
        self.digests = {}
        took = m._optimizer_state.take_values(to, timeout_s=60.0)
        self.saved_for = took
        m._take_buffers()
        m._gate = {"clock": to, "stop": False, "stop_reason": "", "rolled_back": True}
        if in_block:
            self.install_means_or_none(to, took)
        else:
            self.replay = (to, took)
            m._gate["clock"] = took
        optimizer = m._optimizer_state.optimizer
        scheduler = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler
        for o in gc.get_objects():  # rare (a rollback) and found without the script's help
            if isinstance(o, scheduler) and o.optimizer is optimizer:
                o.last_epoch = to - 1  # its next step() makes the rate of step `to`
        return True

    def values_digest(self):
        """The mean, the root mean square and the mean of every 7th of all the parameters' values: equal on every
        worker of a SYNC job with SCRIPT (the same mean gradient, the same optimizer); means, so that a 16-bit
        wire carries them unclamped."""
        m = self.model
        total, squares, strided, count, strided_count = 0.0, 0.0, 0.0, 0, 0
        with torch.no_grad():
            for _, p in m._params:
                flat = p.detach().reshape(-1).double()
                total += flat.sum().item()
                squares += flat.dot(flat).item()
                strided += flat[::7].sum().item()
                count += flat.numel()
                strided_count += flat[::7].numel()
        return np.array([total / count, (squares / count) ** 0.5, strided / strided_count], np.float64)

    def compare_digest(self):
        """A round after a digest clock c (the keeper sent its digest of c before it pushed this round): a worker
        whose values differ from the keeper's fails the job naming itself."""
        m = self.model
        if m.rank == m._keeper or not self.digests:
            return
        (clock, mine), = self.digests.items()
        if m.clock <= clock:
            return
        self.digests = {}
        theirs = np.zeros(4, np.float32)
        m._client.pull([_DIGEST], [theirs])
        if int(theirs[0]) != clock:
            return  # the keeper changed, stopped or restarted in between: nothing to compare
        mine32 = mine.astype(np.float32)
        # The digest travels at the wire's precision for values: 8 bits of mantissa in BF16, 11 in FP16.
        rtol = {"BF16": 2.0 ** -7, "FP16": 2.0 ** -10}.get(m.job.spec.get("wire", {}).get("values"), 1e-5)
        if np.allclose(mine32, theirs[1:], rtol=rtol, atol=1e-6):
            return
        why = (f"worker {m.rank}'s parameters differ from worker {m._keeper}'s at clock {clock} (digest "
               f"{mine32.tolist()} against {theirs[1:].tolist()}): with optimizer {{ kind: SCRIPT }} in SYNC every worker's optimizer "
               "must make the same step from the same mean gradient (the same optimizer, settings and schedule, "
               "and no change to the values outside it)")
        m._client.fail(why, program_error=True)
        raise Error("FAILED_PRECONDITION: " + why)
