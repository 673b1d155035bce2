"""tessera.torch: a PyTorch model trained through the servers.

    import torch, tessera.torch as tt

    job = tt.init()                                   # joins from the environment tessera-launch sets
    model = tt.DistributedModel(net, job)             # declares every parameter; rank 0's values start the job
    while True:
        x, y = next_batch_of_this_worker()
        with model.step(batch_size=len(x)) as step:   # no local optimizer: the job's runs on the servers
            loss_fn(model(x), y).backward()
        if step.gate["stop"]:
            break
    model.done()

How a step runs: each parameter's gradient leaves for the servers as soon as backward has accumulated it (a hook
on its gradient accumulator), and the forward of each module waits for the new values of that module's own
parameters only (a forward pre-hook), which arrive while the modules before it compute. The values are written
straight into the parameters' memory and the gradients are read from theirs: nothing is copied in Python.

This first version covers float32 parameters on the CPU. Module buffers (BatchNorm's running statistics) stay
local to each worker.
"""

import time

import numpy as np
import torch

from . import Error, connect

__all__ = ["DistributedModel", "init"]


def init(**overrides):
    """Joins the job as a worker (see tessera.connect for the settings); returns the Job."""
    return connect(**overrides)


class _Step:
    """One step of a DistributedModel (see DistributedModel.step)."""

    def __init__(self, model, batch_size):
        self._model = model
        self.batch_size = batch_size
        self.gate = None  # after the block: {"clock", "stop", "stop_reason", ...}

    def __enter__(self):
        self._model._begin(self.batch_size)
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind, error, trace):
        if kind is not None:
            self._model._abandon()
            return False
        busy = time.perf_counter() - self._started - self._model._waited
        self.gate = self._model._finish(self.batch_size, busy)
        return False


class DistributedModel(torch.nn.Module):
    """Wraps `module` for training through the job's servers. Call it as the module; train in `step` blocks."""

    def __init__(self, module, job, init_timeout_s=120.0):
        super().__init__()
        self.module = module
        self.job = job
        self._client = job.client
        self._params = []
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue  # frozen: stays as each worker has it
            if p.dtype != torch.float32 or p.device.type != "cpu" or not p.is_contiguous():
                raise Error(f"INVALID_ARGUMENT: parameter '{name}' must be a contiguous float32 CPU tensor "
                            f"(got {p.dtype} on {p.device})")
            self._params.append((name, p))
        if not self._params:
            raise Error("INVALID_ARGUMENT: the module has no parameters")
        self.names = [name for name, _ in self._params]
        self._index = {id(p): i for i, (_, p) in enumerate(self._params)}
        self._values = [p.data.numpy() for _, p in self._params]  # the parameters' own memory
        # Gradients accumulate in memory of ours, which the exchange reads as it sends (no copy): each parameter's
        # .grad is a tensor over it. Two sets, one per step in turn: a step's pushes may still be on the wire while
        # the next step's backward runs, and the set is reused only once that step's exchange has settled.
        self._grad_sets = [[np.zeros(tuple(p.shape), np.float32) for _, p in self._params] for _ in range(2)]
        self._steps = 0
        self._grads = self._grad_sets[0]
        self._client.declare([(name, list(p.shape), 0.0, 0) for name, p in self._params])
        self._start_from_rank_zero(init_timeout_s)
        self._previous = None  # the last step's exchange, whose values may still be arriving
        self._current = None
        self._waited = 0.0
        self._hooks = []
        self._accumulators = []  # kept alive: their hooks fire as each gradient is final
        for i, (_, p) in enumerate(self._params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(accumulator.register_hook(lambda *unused, i=i: self._gradient_ready(i)))
            self._accumulators.append(accumulator)
        for m in module.modules():
            own = [self._index[id(p)] for p in m.parameters(recurse=False) if id(p) in self._index]
            if own:
                self._hooks.append(m.register_forward_pre_hook(lambda mod, inputs, own=own: self._need(own)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def step(self, batch_size):
        """A `with` block for one training step on `batch_size` examples: run forward and backward inside it."""
        return _Step(self, batch_size)

    @property
    def rank(self):
        return self.job.rank

    @property
    def gradients_sent(self):
        """How many parameters' gradients of the open step have left (as backward finished each)."""
        return sum(self._sent) if self._current is not None else 0

    def settle(self):
        """Waits until the parameters hold the values after the last step (before scoring or saving them)."""
        self._settle()

    def done(self):
        """Waits for the last step's values, then tells the scheduler this worker is finished."""
        self._settle()
        self._client.done()

    # The job's values start as rank 0's: it assigns them when the servers hold untouched chunks (a fresh job;
    # a rejoining or resumed worker finds trained values), and every rank waits until they are there.
    def _start_from_rank_zero(self, timeout_s):
        self._client.pull(self.names, self._values_scratch())
        fresh = all(self._client.pulled_version(n) == 0 for n in self.names)
        if self.rank == 0 and fresh:
            self._client.assign(self.names, self._values)
        deadline = time.time() + timeout_s
        while True:
            self._client.pull(self.names, self._values)
            if all(self._client.pulled_version(n) > 0 for n in self.names):
                return
            if time.time() > deadline:
                raise Error(f"DEADLINE_EXCEEDED: rank 0's initial values did not reach the servers in {timeout_s} s")
            time.sleep(0.05)

    def _values_scratch(self):
        return [v.copy() for v in self._values]

    def _begin(self, batch_size):
        if self._current is not None:
            raise Error("FAILED_PRECONDITION: a step is already open")
        # The set of two steps ago: that step's exchange has settled (_finish), so its bytes have left.
        self._grads = self._grad_sets[self._steps % 2]
        self._steps += 1
        for (_, p), g in zip(self._params, self._grads):
            g.fill(0)
            p.grad = torch.from_numpy(g)
        self._waited = 0.0
        self._sent = [False] * len(self._params)
        self._current = self._client.begin_step(self.names, self._grads, batch_size, self._values)

    def _gradient_ready(self, i):
        if self._current is None or self._sent[i]:
            return
        p, g = self._params[i][1], self._grads[i]
        if p.grad.data_ptr() != g.ctypes.data:
            np.copyto(g, p.grad.numpy())  # autograd put the sum in a new tensor: one copy into ours
        self._sent[i] = True
        self._current.send(i)

    def _need(self, indices):
        if self._previous is None:
            return
        started = time.perf_counter()
        for i in indices:
            self._previous.wait_values(i)
        self._waited += time.perf_counter() - started

    def _settle(self):
        if self._previous is not None:
            self._need(range(len(self._params)))
            self._previous = None

    def _finish(self, batch_size, busy_seconds):
        step, self._current = self._current, None
        gate = step.finish()
        self._settle()
        self._previous = step
        self._client.note_step(batch_size, max(0.0, busy_seconds))
        return gate

    def _abandon(self):
        self._current = None
