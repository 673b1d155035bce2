"""tessera.torch's step block: _Step (what DistributedModel.step returns), the markers of the blocks that keep
their gradients here, and the servers' path with a gradient scaler (_Scaling)."""

import time

import numpy as np
import torch

from .. import Error


_LOCAL_BLOCK = object()  # the open step of ASYNC or SSP with SCRIPT: nothing leaves until the optimizer steps
# SYNC with SCRIPT: the open step of a worker that took the values of the clock before its own (a checkpoint's): its
# gradients stay here, and the block ends with the checkpoint's mean gradient of that step in .grad.
_REPLAY_BLOCK = object()


class _Step:
    """One step of a DistributedModel (see DistributedModel.step)."""

    def __init__(self, model, batch_size, scaler):
        self._model = model
        self.batch_size = batch_size
        self._scaler = scaler
        self.gate = None  # after the block: {"clock", "stop", "stop_reason", ...}
        self.skipped = False  # after the block, with a scaler: the step applied no update (an inf or NaN)

    def __enter__(self):
        try:
            self._model._begin(self.batch_size, self._scaler)
        except Error:
            # The job went back to a checkpoint before this step began: the step begins there (with the script's
            # optimizer in SYNC as a replay of the checkpoint's step, whose data the loop did not pick).
            if not self._model._take_rollback(in_block=False):
                raise
            self._model._begin(self.batch_size, self._scaler)
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind, error, trace):
        model = self._model
        if kind is not None:
            model._abandon()
            # A SYNC job that went back to a checkpoint (a server was lost) voids this step: the loop goes on from
            # the checkpoint's clock, as tessera-worker does.
            return issubclass(kind, Error) and model._take_rollback()
        busy = time.perf_counter() - self._started - model._waited
        return model._exchange.end(self, busy)


class _Scaling:
    """The servers' path with a gradient scaler (model.step(..., scaler=)): the block divides the gradients by the
    scale before they leave and skips a step with an inf or NaN on every worker alike; then it updates the scale
    as torch.cuda.amp.GradScaler.update() would after that step (backoff after a skipped one, growth after
    growth_interval steps without one), through update(new_scale), so every worker keeps the same scale."""

    def __init__(self, scaler):
        self.scaler = scaler
        self.good_steps = 0

    def unscale(self, grads):
        """Divides `grads` (tensors) by the scale; True when one of them is not finite."""
        inv = float(np.float32(1.0 / float(self.scaler.get_scale())))
        finite = []
        for g in grads:
            g.mul_(inv)
            finite.append(torch.isfinite(g).all())
        return bool(finite) and not bool(torch.stack(finite).all())  # one device synchronisation

    def update(self, skipped):
        scale = float(self.scaler.get_scale())
        if skipped:
            self.good_steps = 0
            scale *= self.scaler.get_backoff_factor()
        else:
            self.good_steps += 1
            if self.good_steps >= self.scaler.get_growth_interval():
                self.good_steps = 0
                scale *= self.scaler.get_growth_factor()
        self.scaler.update(scale)
