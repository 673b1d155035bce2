"""How a DistributedModel's step block exchanges, one object per way, chosen once when the model is made
(DistributedModel._exchange): the servers' optimizer (here, for SYNC, ASYNC and SSP alike: the C++ step plan knows
the mode), the script's optimizer in SYNC (script_sync.py) and in ASYNC and SSP (script_local.py). A new way to
exchange is a new class with these methods, not new branches in the model.

Each holds the model and works through its attributes (the step's state stays on the model, which its hooks
share with every way)."""

from .. import Error


class _ServersOptimizerExchange:
    """The servers' optimizer: gradients leave as backward finishes them (overlap) or when the block ends, the
    servers step, and the next forward waits for the values it reads."""

    def __init__(self, model):
        self.model = model

    def open_own_block(self):
        """Before anything of a step changes: True when this way opened a block of its own (the model then does
        nothing more to begin it)."""
        return False

    def open_block(self, batch_size):
        """After the module's buffers were taken: True when this way opened the block itself."""
        return False

    def end(self, step, busy):
        """The block's end: sends what is left, waits as the way needs, sets step.gate (and step.skipped).
        Returns False (the block's exception, if any, is the caller's)."""
        m = self.model
        if not self._send_and_finish(step, busy):
            return False
        if m._take_rollback():
            step.gate = m._gate
        elif m._scaling is not None:
            step.skipped = m._update_scaler()
        return False

    def _send_and_finish(self, step, busy):
        """Sends the block's remaining gradients and finishes its exchange; False when the job went back to a
        checkpoint meanwhile (step.gate set)."""
        m = self.model
        try:
            m._send_the_rest(step.batch_size)
        except Error:
            m._abandon()
            raise
        try:
            step.gate = m._finish(step.batch_size, busy)
        except Error:
            if not m._take_rollback():
                raise
            step.gate = m._gate
            return False
        return True

    def after_optimizer_step(self):
        """After the script's optimizer stepped (DistributedOptimizer)."""

    def roll_back(self, to, in_block):
        """After a rollback to the checkpoint of clock `to`: True when this way took the checkpoint's values
        itself."""
        return False

    def before_done(self):
        """Before the model's done(): what is left to send."""
