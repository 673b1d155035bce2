"""ASYNC and SSP with optimizer { kind: SCRIPT } (DistributedOptimizer): the block's gradients stay here; the
script's optimizer steps on them, and the change it made to the values leaves (the servers add it, times the
staleness-aware scale) and brings the servers' values, with everyone's changes, before the next forward. Every
state_every steps the optimizer's state goes to the servers too, so that a restarted worker continues with it."""

import torch

from .. import Error
from .exchange import _ServersOptimizerExchange
from .step import _LOCAL_BLOCK


class _ScriptLocalExchange(_ServersOptimizerExchange):
    """ASYNC and SSP with the script's optimizer (see the module's comment)."""

    def __init__(self, model):
        super().__init__(model)
        self.pending = None  # (batch size, busy seconds, values before the optimizer's step) of the last block

    def open_block(self, batch_size):
        m = self.model
        if self.pending is not None:
            self.push_update()  # the last block's optimizer step was skipped (GradScaler): no change
        m._current = _LOCAL_BLOCK
        m._waited = 0.0
        return True

    def end(self, step, busy):
        self.end_local_block(step.batch_size, busy)
        step.gate = self.model._gate
        return False

    def after_optimizer_step(self):
        """The change leaves; the optimizer's state every state_every clocks."""
        m = self.model
        self.push_update()
        if m._optimizer_state is not None and m._state_every > 0 and m.clock % m._state_every == 0:
            m._optimizer_state.save(m.clock)

    def before_done(self):
        m = self.model
        if self.pending is not None and not m._gate["stop"]:
            self.push_update()

    def end_local_block(self, batch_size, busy):
        """ASYNC and SSP with SCRIPT: the block's gradients stay here for the script's optimizer; the values it
        starts from are kept to make its change. The embedding tables' rows leave now (their optimizer is the
        servers')."""
        m = self.model
        for table in m._tables:
            table._push(batch_size)
        m._current = None
        m._settle()
        self.pending = (batch_size, busy, [p.detach().clone() for _, p in m._params])

    def push_update(self):
        """Sends the change the optimizer made since the block ended (the servers add it) and takes the clock."""
        m = self.model
        if self.pending is None:
            raise Error("FAILED_PRECONDITION: optimizer.step() without a step block before it")
        batch_size, busy, before = self.pending
        self.pending = None
        m._set = m._steps % 2
        m._grads = m._grad_sets[m._set]
        m._steps += 1
        with torch.no_grad():
            for (_, p), b, g in zip(m._params, before, m._grads):
                torch.sub(p.detach(), b, out=b)
                torch.from_numpy(g).copy_(b)
        m._current = m._plan.begin(m._set, batch_size)
        for i in range(len(m._params)):
            m._current.send(i)
        try:
            m._finish(batch_size, busy)
        except Error:
            m._abandon()
            raise
