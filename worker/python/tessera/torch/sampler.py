"""tessera.torch's Sampler: this worker's example indices for each step of a DistributedModel."""

import torch


class Sampler:
    """This worker's example indices for each step, from the model's clock on (a restarted worker goes on where
    the job is), until the job stops: worker r takes the r-th batch_size examples of every step's global batch
    (batch_size * workers examples, reshuffled every epoch from the job's seed, the order tessera-worker uses),
    or the slice the scheduler gives it when the job balances the split (consistency { balance: THROUGHPUT })."""

    def __init__(self, model, examples):
        from .._tessera import BatchSchedule

        spec = model.job.spec
        self._model = model
        self.batch_size = int(spec["batch_size"])
        self._schedule = BatchSchedule(examples, self.batch_size, model.workers, model.rank, int(spec["seed"]))
        self.steps_per_epoch = self._schedule.steps_per_epoch
        model._stop_clock = model._client.stop_clock(self.steps_per_epoch)
        model._sampler = self

    def indices(self, step):
        """This worker's indices at `step` (an int64 tensor)."""
        offset, count = self._model._client.batch_slice
        if count > 0:
            return torch.from_numpy(self._schedule.slice(step, offset, count))
        return torch.from_numpy(self._schedule.batch(step))

    def epochs(self, steps=None):
        """Passes over the training set by the cluster after `steps` steps (default: the model's clock)."""
        return self._schedule.epochs(self._model.clock if steps is None else steps)

    def __iter__(self):
        while not self._model.stopped:
            yield self.indices(self._model.clock)
