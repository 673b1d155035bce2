"""tessera.torch's DistributedModel: a module trained through the job's servers, and all of its step's exchange,
hooks, buffers and rollbacks (the step block itself is in step.py)."""

import contextlib
import signal
import time

import numpy as np
import torch

from .. import Error
from . import runtime
from .cuda_mirror import _HostMirror
from .embedding import Embedding
from .optimizer import _DIGEST, _FOUND_INF, _KEPT
from .runtime import _some, match_blas_threads
from .sampler import Sampler
from .exchange import _ServersOptimizerExchange
from .script_local import _ScriptLocalExchange
from .script_sync import _ScriptSyncExchange
from .step import _LOCAL_BLOCK, _REPLAY_BLOCK, _Scaling, _Step


_STEP_STATE = frozenset({
    "_pending_rollback", "_current", "_scaling", "_previous", "_ready", "_outside",
    "_hooked", "_gate", "_waited", "_sent", "_set", "_grads", "_steps", "_samples",
    "_reported", "_seen", "_fired", "_no_sync", "_resent"})


def _trained_parameters(module):
    """The module's trained parameters as (name, parameter), and the one device they are on; INVALID_ARGUMENT
    for none, for one that is not float32 or not contiguous, or for several devices or one that is neither CPU
    nor CUDA."""
    params = []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue  # frozen: stays as each worker has it
        if p.dtype != torch.float32:
            raise Error(f"INVALID_ARGUMENT: parameter '{name}' is {p.dtype}; the servers hold float32")
        if not p.is_contiguous():
            raise Error(f"INVALID_ARGUMENT: parameter '{name}' is not contiguous")
        params.append((name, p))
    if not params:
        raise Error("INVALID_ARGUMENT: the module has no trainable parameters")
    devices = {p.device for _, p in params}
    if len(devices) > 1:
        raise Error(f"INVALID_ARGUMENT: the parameters are on several devices ({sorted(map(str, devices))})")
    device = devices.pop()
    if device.type not in ("cpu", "cuda"):
        raise Error(f"INVALID_ARGUMENT: parameters on {device} (CPU or CUDA only)")
    return params, device


class DistributedModel(torch.nn.Module):
    """Wraps `module` for training through the job's servers. Call it as the module; train in `step` blocks.

    Raises tessera.Error FAILED_PRECONDITION when the job's servers hold parameters of another model (other
    names or shapes), INVALID_ARGUMENT for a parameter that is not float32."""

    def __init__(self, module, job, init_timeout_s=120.0, buffers="rank0", buffer_every=1, overlap=False):
        super().__init__()
        self.overlap = bool(overlap)
        self._no_sync = False
        self._fired = []
        self._seen = []
        self._resent = []
        if buffers not in ("rank0", "local"):
            raise Error(f"INVALID_ARGUMENT: buffers must be 'rank0' or 'local', not {buffers!r}")
        self.module = module
        self.job = job
        self._client = job.client
        match_blas_threads()
        self._params, self.device = _trained_parameters(module)
        self.names = [name for name, _ in self._params]
        self._index = {id(p): i for i, (_, p) in enumerate(self._params)}
        tensors = [p for _, p in self._params]
        # optimizer { kind: SCRIPT }: the script's own optimizer steps (DistributedOptimizer); the servers only
        # combine: in SYNC the exchange brings the workers' mean gradient, in ASYNC and SSP it takes this worker's
        # change to the values and brings the servers' values.
        self.script = job.spec["optimizer"]["kind"] == "SCRIPT"
        self._sync = job.mode == "SYNC"
        # How a step block exchanges, chosen once (exchange.py).
        if not self.script:
            self._exchange = _ServersOptimizerExchange(self)
        elif self._sync:
            self._exchange = _ScriptSyncExchange(self)
        else:
            self._exchange = _ScriptLocalExchange(self)
        self._check_every = 100
        self._state_every = 0
        self._optimizer_state = None
        self._joining = False  # SYNC with SCRIPT, joined after the start: the values come with DistributedOptimizer
        self._pending_rollback = None  # a rollback heard of by the optimizer's step: taken as the next block begins
        self._server_optimizer = None  # ServerOptimizer: the script's schedule drives the servers' learning rate
        self._scaling = None  # the open step's gradient scaler (_Scaling), in the servers' path
        self._scalings = {}  # by id(scaler): each scaler's count of steps since it last changed
        exchanged = self._host_memory(tensors)
        # Two gradient sets, one per step in turn: a step's pushes may still be on the wire while the next step's
        # backward runs, and a set is reused only once its step's exchange has settled.
        self._steps = 0
        self._grads = self._grad_sets[0]
        self._declare(module, buffers, buffer_every, exchanged)
        # The last step's exchange, whose values may still be arriving, and which of them this step has waited
        # for (_after).
        self._after(None)
        # Parameters a step read without a forward of a module of theirs (a child's weight used by its parent):
        # the model's own forward waits for them.
        self._outside = set()
        self._hooked = [False] * len(self._params)  # parameters whose module's forward ran in the open step
        self._current = None
        self._waited = 0.0
        self._gate = {"clock": self._client.clock, "stop": False, "stop_reason": ""}
        self._stop_clock = self._client.stop_clock(1 << 40)  # max_steps; a sampler adds max_epochs
        self._sampler = None
        self._reported = (time.perf_counter(), 0)
        self._samples = 0
        self._start_from_rank_zero(init_timeout_s)
        self._install_hooks(module, tensors)

    def _host_memory(self, tensors):
        """Where the values and gradients live on the host: the parameters' own memory, or on a GPU a pinned host
        mirror; and where the exchange writes (the values, or in SYNC with SCRIPT the round's mean gradient).
        Returns the names the exchange carries."""
        if self.device.type == "cuda":
            self._mirror = _HostMirror(tensors)
            self._weights = [v.numpy() for v in self._mirror.values]
            self._grad_sets = [[g.numpy() for g in grads] for grads in self._mirror.grads]
        else:
            self._mirror = None
            self._weights = [p.data.numpy() for p in tensors]  # the parameters' own memory
            # Gradients accumulate in memory of ours, which the exchange reads as it sends (no copy): each
            # parameter's .grad is a tensor over it.
            self._grad_sets = [[np.zeros(tuple(p.shape), np.float32) for p in tensors] for _ in range(2)]
        # Where the exchange writes: the parameters' values, or in SYNC with SCRIPT the round's mean gradient.
        self._values = self._weights
        # SYNC with SCRIPT: one more entry rides in every round, 1 from a worker whose gradient had an inf or NaN
        # (it sends zeros in their place): the whole round's mean is then NaN on every worker, as one process's
        # gradient would be, and a GradScaler skips the step everywhere alike.
        self._flags_inf = self.script and self._sync
        exchanged = list(self.names)
        if self.script and self._sync:
            pin = self._mirror is not None
            self._values = [torch.zeros(p.shape, dtype=torch.float32, pin_memory=pin).numpy() for p in tensors]
            self._values.append(np.zeros(1, np.float32))
            for grads in self._grad_sets:
                grads.append(np.zeros(1, np.float32))
            exchanged.append(_FOUND_INF)
        return exchanged

    def _declare(self, module, buffers, buffer_every, exchanged):
        """Declares the parameters, the module's buffers (with rank0), the embedding tables and what the script's
        optimizer exchanges, after checking that they are the job's, and makes the step plan."""
        params = [(name, list(p.shape)) for name, p in self._params]
        self._buffers = []
        if buffers == "rank0":
            self._buffers = [(name, b) for name, b in module.named_buffers() if b.dtype == torch.float32]
        self._buffer_every = max(1, int(buffer_every))
        self._buffer_host = [np.ascontiguousarray(b.detach().cpu().numpy()) for _, b in self._buffers]
        self.buffer_names = ["buffer:" + name for name, _ in self._buffers]
        if self._flags_inf:
            params.append((_FOUND_INF, [1]))
        state = [(name, list(b.shape)) for name, (_, b) in zip(self.buffer_names, self._buffers)]
        if self.script and self._sync:
            state.append((_DIGEST, [4]))
        # Embedding tables (tessera.torch.Embedding): declared beside the dense parameters; their rows are pulled in
        # forward and pushed when a step block ends, before the dense gradients leave.
        self._tables = [m for m in module.modules() if isinstance(m, Embedding)]
        # With optimizer { kind: SCRIPT } the tables keep their own optimizer on the servers; the dense parameters
        # follow the script's path.
        if self._tables and self.overlap and self._sync:
            raise Error("INVALID_ARGUMENT: embedding tables in SYNC need overlap=False: a step's rows must be on the "
                        "servers before its dense round closes")
        tables = [(t.table, [t.dim]) for t in self._tables]
        if len(set(n for n, _ in tables)) != len(tables):
            raise Error("INVALID_ARGUMENT: two embedding layers name the same table")
        mine = dict(params + state + tables)
        self._check_matches_job(mine, self._client.job_parameters())
        for t in self._tables:
            t._bind(self._client)
        # One declaration: another worker checking the job's parameters sees all of them or none.
        self._client.declare([(name, shape, 0.0, 0) for name, shape in params], state=state,
                             tables=[t.spec for t in self._tables])
        self._check_matches_job(mine, self._client.job_parameters())  # a worker of another model declared first
        self._plan = self._client.step_plan(exchanged, self._grad_sets, self._values)
        self._grad_pointers = [[g.ctypes.data for g in grads] for grads in self._grad_sets]

    def _install_hooks(self, module, tensors):
        """A hook per parameter that fires as its gradient is final (it may leave then), and a forward pre-hook
        per module that waits for the last step's values of the parameters it reads."""
        self._hooks = []
        self._accumulators = []  # kept alive: their hooks fire as each gradient is final
        for i, p in enumerate(tensors):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(accumulator.register_hook(lambda *unused, i=i: self._gradient_ready(i)))
            self._accumulators.append(accumulator)
        for m in module.modules():
            own = [self._index[id(p)] for p in m.parameters(recurse=False) if id(p) in self._index]
            if m is module:
                self._hooks.append(m.register_forward_pre_hook(
                    lambda mod, inputs, own=own: self._need(own + sorted(self._outside))))
            elif own:
                self._hooks.append(m.register_forward_pre_hook(lambda mod, inputs, own=own: self._need(own)))

    def __setattr__(self, name, value):
        # The step's own state is set several times a step: past Module.__setattr__'s registration checks.
        if name in _STEP_STATE:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def step(self, batch_size, scaler=None):
        """A `with` block for one training step on `batch_size` examples: run forward and backward inside it (see
        tessera.torch's documentation for several backward calls and for gradient edits).

        `scaler` (a torch.cuda.amp.GradScaler, in the servers' path): the block divides the gradients by its scale
        before they leave (they leave when the block ends), a step whose gradients hold an inf or NaN on any
        worker is skipped by every worker alike (the block's `skipped` says so), and the scaler's scale is updated
        as GradScaler.update() would; call neither scaler.step() nor scaler.update(). A disabled scaler (no CUDA)
        is ignored. Embedding tables' row gradients are divided by the scale too, and an inf or NaN among them skips
        the step as one in the dense gradients does. With optimizer { kind: SCRIPT } use the scaler with the
        script's optimizer instead (not with embedding tables: their rows would take the scaled gradients)."""
        if scaler is not None and self.script:
            raise Error("FAILED_PRECONDITION: with optimizer { kind: SCRIPT } the scaler goes with the script's "
                        "optimizer (scaler.unscale_(opt), scaler.step(opt), scaler.update() after the block), not "
                        "to model.step()" + (
                            "; and with embedding tables a scaled loss cannot be honoured under SCRIPT (the rows' "
                            "gradients reach the servers' row optimizer before the script's scaler unscales): "
                            "train with the servers' optimizer (optimizer { kind: ADAM ... }) and "
                            "model.step(batch_size, scaler=scaler), or use bfloat16 autocast, which needs no scaler"
                            if self._tables else ""))
        return _Step(self, batch_size, scaler)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside a step block, the backward calls run in this context accumulate gradients here only (DDP's
        no_sync): with overlap=True, run every micro-batch but the last in it. Without overlap it changes nothing
        (every gradient leaves when the block ends)."""
        if self._no_sync:
            raise Error("FAILED_PRECONDITION: no_sync() is already open")
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = False

    def sampler(self, examples):
        """A Sampler over a training set of `examples` examples; it also makes max_epochs a stop condition."""
        return Sampler(self, examples)

    @property
    def rank(self):
        return self.job.rank

    @property
    def _keeper(self):
        """The worker that sends what rank 0 sends while it is there: module buffers, and with SCRIPT in SYNC the
        values, optimizer state and digest (the gate's values_keeper)."""
        return int(self._gate.get("values_keeper", 0))

    @property
    def workers(self):
        return int(self.job.spec["cluster"]["num_workers"])

    @property
    def clock(self):
        """Steps this worker has completed (where a restarted worker starts: the job's position)."""
        return self._gate["clock"]

    @property
    def stopped(self):
        """True once training should end: the job stopped, this worker reached max_steps or max_epochs, or a
        SIGTERM or Ctrl-C came."""
        return bool(self._gate["stop"]) or self.clock >= self._stop_clock or runtime._signal != 0

    @property
    def stop_reason(self):
        if runtime._signal:
            return f"stopped by {signal.Signals(runtime._signal).name}"
        if self._gate["stop"]:
            return self._gate["stop_reason"]
        return "the job's steps are done" if self.clock >= self._stop_clock else ""

    @property
    def gradients_sent(self):
        """How many parameters' gradients of the open step have left (as backward finished each)."""
        return sum(self._sent) if self._current is not None else 0

    def report(self, accuracy=None, loss=None, test_loss=None, clock=None):
        """Progress for the scheduler's records, as tessera-worker sends it: the training loss, throughput since
        the last report, and, with `accuracy` (on held-out data, after settle()), an evaluation at this clock,
        which the summary, metrics.jsonl, /metrics and the dashboard show, and which ends the job when it reaches
        the job's target accuracy. `clock`: the clock of the values scored (default: this worker's clock). Returns
        True when the job has stopped."""
        now, samples = time.perf_counter(), self._samples
        since, samples_then = self._reported
        self._reported = (now, samples)
        rate = (samples - samples_then) / (now - since) if now > since else 0.0
        at = self.clock if clock is None else int(clock)  # the clock of the values scored
        epoch = self._sampler.epochs(at) if self._sampler is not None else 0.0
        stop, reason = self._client.report(
            train_loss=float(loss) if loss is not None else 0.0, samples_per_sec=rate, samples=samples,
            epoch=epoch, test_accuracy=None if accuracy is None else float(accuracy),
            test_loss=float(test_loss) if test_loss is not None else 0.0,
            eval_clock=at,
            device=str(self.device))
        if stop:
            self._gate = dict(self._gate, stop=True, stop_reason=reason)
        return stop

    def sync_buffers(self):
        """Rank 0 sends its floating-point buffers to the servers; the other ranks take the servers' copy (what
        the step blocks do every buffer_every steps). Call it on rank 0 first."""
        if not self._buffers:
            return
        if self.rank == self._keeper:
            self._send_buffers()
        else:
            self._take_buffers()

    def settle(self):
        """Waits until the parameters hold the values after the last step (before scoring or saving them)."""
        self._settle()

    def done(self):
        """Waits for the last step's values, then tells the scheduler this worker is finished, or, after SIGTERM
        or Ctrl-C, that it stopped (and exits with status 130 after Ctrl-C)."""
        self._exchange.before_done()
        self._settle()
        if self._buffers and self.rank == self._keeper:
            try:
                self._send_buffers()
            except Error:
                if not self._gate["stop"]:
                    raise  # a job that is over may no longer take them
        if runtime._signal:
            why = f"{self.stop_reason}: worker {self.rank} stopped at clock {self.clock}"
            self._client.fail(why)
            if runtime._signal == signal.SIGINT:
                raise SystemExit(130)
            return
        self._client.done()

    @staticmethod
    def _check_matches_job(mine, theirs):
        """FAILED_PRECONDITION unless the servers hold nothing yet or exactly this model's parameters."""
        theirs = {n: s for n, s in theirs.items() if not n.startswith(_KEPT)}
        if not theirs or theirs == mine:
            return
        missing = sorted(set(theirs) - set(mine))
        extra = sorted(set(mine) - set(theirs))
        shapes = sorted(n for n in set(mine) & set(theirs) if mine[n] != theirs[n])
        parts = []
        if missing:
            parts.append(f"the job has parameters this model lacks ({_some(missing)})")
        if extra:
            parts.append(f"this model has parameters the job lacks ({_some(extra)})")
        if shapes:
            n = shapes[0]
            parts.append(f"'{n}' is {theirs[n]} in the job but {mine[n]} in this model")
        raise Error("FAILED_PRECONDITION: the model does not match the job's parameters: " + "; ".join(parts))

    # The job's values start as rank 0's: it assigns them when the servers hold untouched chunks (a fresh job;
    # a rejoining or resumed worker finds trained values), and every rank waits until they are there.
    def _start_from_rank_zero(self, timeout_s):
        names = self.names + self.buffer_names
        scratch = [v.copy() for v in self._weights] + [b.copy() for b in self._buffer_host]
        self._client.pull(names, scratch)
        fresh = all(self._client.pulled_version(n) == 0 for n in names)
        if self.script and self._sync and not fresh and self._client.clock > 0:
            # The values are the workers' own (the servers hold the rounds' mean gradients): DistributedOptimizer
            # takes rank 0's, with the optimizer's state.
            self._joining = True
            self._take_buffers()
            return
        if self.rank == 0 and fresh:
            self._client.assign(self.names, [v.copy() for v in self._weights] if self._mirror else self._weights)
            if self._buffers:
                self._client.assign(self.buffer_names, self._buffer_host)
        deadline = time.time() + timeout_s
        while True:
            self._client.pull(self.names, self._weights, if_changed=True)  # untouched while it waits
            if all(self._client.pulled_version(n) > 0 for n in self.names):
                break
            if time.time() > deadline:
                raise Error(f"DEADLINE_EXCEEDED: rank 0's initial values did not reach the servers in {timeout_s} s")
            time.sleep(0.05)
        if self._mirror is not None:
            self._mirror.load_values(range(len(self._params)))
        self._take_buffers()

    def _send_buffers(self):
        for host, (_, b) in zip(self._buffer_host, self._buffers):
            np.copyto(host, b.detach().cpu().numpy())
        self._client.assign(self.buffer_names, self._buffer_host)

    def _take_buffers(self):
        if not self._buffers:
            return
        self._client.pull(self.buffer_names, self._buffer_host)
        with torch.no_grad():
            for host, (_, b) in zip(self._buffer_host, self._buffers):
                b.copy_(torch.from_numpy(host))

    def _begin(self, batch_size, scaler=None):
        if self._current is not None:
            raise Error("FAILED_PRECONDITION: a step is already open")
        if self._pending_rollback is not None:
            raise Error(f"ABORTED: the job went back to the checkpoint of clock {self._pending_rollback}")
        # Checked before the step changes anything (a refused block leaves none open).
        factors = self._server_optimizer.factors() if self._server_optimizer is not None else None
        if self._exchange.open_own_block():
            return
        if self._buffers and self.rank != self._keeper and self._steps % self._buffer_every == 0:
            self._take_buffers()
        if self._exchange.open_block(batch_size):
            return
        # The set of two steps ago: that step's exchange has settled (_finish), so its bytes have left.
        self._set = self._steps % 2
        self._grads = self._grad_sets[self._set]
        self._steps += 1
        if self._mirror is None:
            for (_, p), g in zip(self._params, self._grads):
                g.fill(0)
                p.grad = torch.from_numpy(g)
        else:
            self._mirror.values_free()
            for (_, p), g in zip(self._params, self._grads):
                g.fill(0)  # what a parameter without a gradient this step sends
                p.grad = None
        if self._flags_inf:
            self._grads[len(self._params)][0] = 0.0
        self._waited = 0.0
        self._sent = [False] * len(self._params)
        self._fired = [0] * len(self._params)
        self._hooked = [False] * len(self._params)
        self._resent = []  # parameters a backward reached again after their gradient left (overlap)
        # Each .grad as the step last saw it (the tensor and its version): at the start, then after each backward
        # that reached it. A change since is the script's edit.
        self._seen = [self._grad_state(p) for _, p in self._params]
        self._current = self._plan.begin(self._set, batch_size)
        if factors is not None:
            self._current.set_lr_factors(factors)
        self._scaling = None
        if scaler is not None and scaler.is_enabled():
            self._scaling = self._scalings.setdefault(id(scaler), _Scaling(scaler))

    @staticmethod
    def _grad_state(p):
        grad = p.grad
        return (grad, grad._version if grad is not None else 0)

    def _edited(self, i):
        """Whether .grad of parameter i changed since the step last saw it (after its last backward, or at the
        step's start when none reached it: a .grad set to None then counts as zeros)."""
        p = self._params[i][1]
        seen, version = self._seen[i]
        grad = p.grad
        if grad is seen and grad._version == version:
            return False
        # No backward reached it: None or zeros (zero_grad before backward) is still no gradient.
        return self._fired[i] > 0 or (grad is not None and bool(grad.any()))

    def _gradient_ready(self, i):
        if self._current is None or self._current is _LOCAL_BLOCK or self._current is _REPLAY_BLOCK:
            return
        p = self._params[i][1]
        self._fired[i] += 1
        self._seen[i] = self._grad_state(p)
        if not self._hooked[i]:
            # Read without a forward of a module of its own, so without waiting for the last step's values: from
            # the next step on the model's forward waits for it first.
            self._outside.add(i)
        if not self._ready[i]:
            return  # leaves when the block ends, after the last step's values (an older reply must not land last)
        if self._no_sync or not self.overlap or self._scaling is not None:
            return  # leaves when the block ends (with a scaler: once every gradient is unscaled and checked)
        if self._sent[i]:
            # Raised when the block ends: an exception out of an autograd hook leaves the engine holding tensors
            # that the interpreter's exit then waits on for ever.
            self._resent.append(i)
            return
        self._send(i)

    def _send_the_rest(self, batch_size):
        """At the block's end: refuses the step when the script edited a gradient after backward (before anything
        more leaves), then sends the embedding tables' row gradients and the dense gradients backward made that
        have not left."""
        if self._resent:
            raise Error(f"FAILED_PRECONDITION: a second backward() outside no_sync() reached "
                        f"{_some([self.names[i] for i in self._resent])} after its gradient had left for the servers "
                        "(overlap=True sends on the step's last backward): run the earlier micro-batches inside "
                        "model.no_sync(), or leave overlap off")
        edited = [self.names[i] for i in range(len(self._params)) if self._edited(i)]
        if edited:
            sent = any(self._sent)
            raise Error(
                f"FAILED_PRECONDITION: the gradient of {_some(edited)} was changed after backward (clipping, "
                "unscaling, masking or a new .grad): the servers' optimizer steps on the workers' sum of the "
                "gradients as backward made them and cannot honour an edit on one worker (clip with the job's "
                "optimizer { clip_global_norm }, or run your own optimizer: kind SCRIPT)" +
                (" (with overlap=True, the unedited gradients had already left)" if sent else
                 "; nothing of this step was sent"))
        unscaled = False
        if self._tables:
            inv, skip = 1.0, False
            if self._scaling is not None:
                # One decision for the rows and the dense gradients, before anything leaves: an inf or NaN in either
                # skips the whole step (the rows' round too, in SYNC), as GradScaler skips one process's step.
                inv = float(np.float32(1.0 / float(self._scaling.scaler.get_scale())))
                rows_bad = any(t._found_inf() for t in self._tables)
                skip = self._unscale(force_skip=rows_bad)
                unscaled = True
            for table in self._tables:
                table._push(batch_size, inv_scale=inv, skip=skip)
        # A parameter this step did not read (an unused branch) may still await the last step's values: they land
        # before its gradient (zeros, or what backward made) leaves, so that this step's values land after them.
        self._need(range(len(self._params)))
        if self._scaling is not None and not unscaled:
            self._unscale()
        for i in range(len(self._params)):
            if self._fired[i] and not self._sent[i]:
                self._send(i)

    def _unscale(self, force_skip=False):
        """The servers' path with a scaler: the gradients leave divided by its scale; with an inf or NaN in any of
        them (or `force_skip`: in the rows), zeros leave and the step is skipped (in SYNC by every worker: no server
        applies its round). Returns whether it is skipped."""
        grads = [p.grad for i, (_, p) in enumerate(self._params) if self._fired[i] and p.grad is not None]
        if self._scaling.unscale(grads) or force_skip:
            for g in grads:
                g.zero_()
            self._current.skip()
            return True
        return False

    def _update_scaler(self):
        """After a block with a scaler: waits for its values, and updates the scale from whether the step (any
        worker's, in SYNC) was skipped. Returns that."""
        scaling, self._scaling = self._scaling, None
        step = self._previous
        self._need(range(len(self._params)))
        skipped = step is not None and step.skipped
        scaling.update(skipped)
        return skipped

    def _send(self, i):
        if self._mirror is not None:
            self._sent[i] = True
            self._mirror.copy_gradient(i, self._mirror.grads[self._set])
            for j in self._mirror.copied(wait=False):
                self._send_copied(self._current, j)
            return
        p = self._params[i][1]
        if p.grad.data_ptr() != self._grad_pointers[self._set][i]:
            np.copyto(self._grads[i], p.grad.numpy())  # autograd put the sum in a new tensor: one copy into ours
        self._sent[i] = True
        self._send_copied(self._current, i)

    def _send_copied(self, step, i):
        """Sends gradient i from our memory; SYNC with SCRIPT: an inf or NaN leaves as zeros and flags the round."""
        if self._flags_inf:
            g = self._grads[i]
            if not np.isfinite(g).all():
                np.nan_to_num(g, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
                self._grads[len(self._params)][0] = 1.0
        step.send(i)

    def _after(self, step):
        """The step whose values the next step waits for (None: nothing to wait for)."""
        self._previous = step
        self._ready = [step is None] * len(self._params)

    def _need(self, indices):
        """Waits for the last step's values of `indices` (those not waited for yet)."""
        indices = list(indices)
        for i in indices:
            self._hooked[i] = True
        indices = [i for i in indices if not self._ready[i]]
        if not indices:
            return
        started = time.perf_counter()
        try:
            for i in indices:
                self._previous.wait_values(i)
                self._ready[i] = True
        except Error as e:
            if not self._previous.stopped:
                raise
            # The job ended while this round was open: the forward runs on the values there are, and the step
            # block ends with the job's stop.
            self._gate = dict(self._gate, stop=True, stop_reason=self._gate["stop_reason"] or str(e))
            self._after(None)
        if self._mirror is not None and self._values is self._weights:
            self._mirror.load_values(indices)
        self._waited += time.perf_counter() - started

    def _settle(self):
        if self._previous is None:
            return
        if self._gate["stop"]:
            # Rounds the job stopped in may never close, and the values may be partly written: the servers' own,
            # while they still answer (a stopping job's calls are given up on, not waited out).
            self._after(None)
            if self._values is not self._weights:
                return  # SYNC with SCRIPT: the values are the workers' own
            try:
                self._client.pull(self.names, self._values)
            except Error as e:
                print(f"tessera: worker {self.rank}: the job is over and its servers' values could not be pulled "
                      f"({e}); the parameters keep this worker's last values", flush=True)
            if self._mirror is not None:
                self._mirror.load_values(range(len(self._params)))
            return
        self._need(range(len(self._params)))
        self._after(None)

    def _finish(self, batch_size, busy_seconds):
        step, self._current = self._current, None
        if self._mirror is not None:
            for j in self._mirror.copied(wait=True):
                self._send_copied(step, j)
        gate = step.finish()
        if self._gate["stop"]:  # the job ended during the step (its forward found it so)
            gate = dict(gate, stop=True, stop_reason=gate["stop_reason"] or self._gate["stop_reason"])
        self._gate = gate
        self._settle()
        self._after(step)
        self._samples += batch_size
        self._client.note_step(batch_size, max(0.0, busy_seconds))
        if self._buffers and self.rank == self._keeper and self._steps % self._buffer_every == 0:
            self._send_buffers()
        return self._gate

    def _take_rollback(self, in_block=True):
        """After a SYNC rollback (the job went back to a checkpoint): drops the open exchanges, takes the
        checkpoint's values (with SCRIPT in SYNC: _ScriptSyncExchange.roll_back) and goes on from its clock. False when there was
        none."""
        to, self._pending_rollback = self._pending_rollback, None
        if to is None:
            to = self._client.take_rollback()
        if to is None:
            return False
        print(f"tessera: worker {self.rank}: the job went back to clock {to} (from {self.clock}); training on "
              "from there", flush=True)
        self._current = None
        self._after(None)
        if self._exchange.roll_back(to, in_block):
            return True
        self._client.pull(self.names, self._values)
        if self._mirror is not None:
            self._mirror.load_values(range(len(self._params)))
        self._take_buffers()
        self._gate = {"clock": to, "stop": False, "stop_reason": "", "rolled_back": True}
        return True

    def _abandon(self):
        for table in self._tables:
            table._abandon()
        self._current = None
        self._scaling = None
        if self._mirror is not None:
            self._mirror.copying = []
