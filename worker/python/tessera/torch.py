"""tessera.torch: a PyTorch model trained through the servers.

    import torch, tessera.torch as tt

    job = tt.init()                                   # joins from the environment tessera-launch sets
    x, y, classes = tt.load_split(job, train=True)    # the job's data (Fashion-MNIST's IDX files by default)
    model = tt.DistributedModel(net, job)             # declares every parameter; rank 0's values start the job
    for indices in model.sampler(len(x)):             # this worker's slice of each step's global batch
        with model.step(batch_size=len(indices)):     # no local optimizer: the job's runs on the servers
            loss_fn(model(x[indices]), y[indices]).backward()
        if job.rank == 0 and model.clock % 100 == 0:
            model.report(accuracy=score(net), loss=...)   # the summary, metrics.jsonl, /metrics, the dashboard
    model.done()

How a step runs: the step's gradients are what its backward() calls accumulated, sent when the block ends; with
overlap=True each parameter's gradient leaves as soon as the step's last backward has accumulated it (a hook on
its gradient accumulator). The forward of each module waits for the new values of that module's own parameters
only (a forward pre-hook), which arrive while the modules before it compute; a parameter read outside a forward of
its own module (a child's weight used by its parent) is seen when its gradient comes, and from the next step on
the model's forward waits for it first.

What a step block may do with gradients (the servers' optimizer takes each step's gradient as backward made it):
- several backward() calls (gradient accumulation over micro-batches): the step sends the sum of their
  gradients, as PyTorch's .grad holds it. With overlap=True, run every backward but the last inside
  model.no_sync() (as with DDP): those accumulate here only, and the last one's gradients leave as it computes
  them; a second backward outside no_sync() that reaches a gradient already sent makes the block raise
  tessera.Error when it ends.
- a parameter that no backward reached (an unused branch) sends zeros: the servers' optimizer steps on a zero
  gradient, as torch.optim does when .grad holds zeros (zero_grad(set_to_none=False)): momentum still moves it.
- an edit of a gradient after backward (clip_grad_norm_, unscaling, masking, a new .grad) cannot be honoured by
  an optimizer that runs on the servers over the workers' sum: the block raises tessera.Error naming the
  parameter, and without overlap nothing of the step has left (with overlap, the edited gradient had already
  left as backward made it). Edits through .data or the NumPy memory are not seen. What the servers' path does
  honour: a gradient scaler passed to model.step(batch_size, scaler=...) (the block unscales, and skips a step with
  an inf or NaN on every worker alike) and a learning rate the script's lr_scheduler sets through ServerOptimizer.
  Global-norm clipping there is the job's: optimizer { clip_global_norm: ... } (clip_grad_norm_ on the round's
  mean gradient, over every server's chunks). Any other recipe needs optimizer { kind: SCRIPT } and
  DistributedOptimizer. On the CPU the values are
written straight into the parameters' memory and the gradients are read from memory the parameters' .grad views:
nothing is copied. A CUDA model keeps a pinned host copy of each parameter: each gradient is copied there on a
side stream as backward finishes it and sent once its copy is in; each parameter's values are copied back to the
GPU before the forward that reads them.

The loop ends when the job does (the clock gate says stop: max_steps, the target accuracy, the scheduler's own
stop), when this worker reaches the job's max_steps or max_epochs, or after SIGTERM or Ctrl-C: init() makes
those finish the open step, after which done() tells the scheduler this worker stopped (as tessera-worker does)
and the script exits 0 after SIGTERM, 130 after Ctrl-C. A second signal ends the process at once.

Module buffers (BatchNorm's running statistics) follow rank 0: rank 0 (while it is away, the lowest-ranked worker
there) sends its floating-point buffers to the servers every `buffer_every` steps (and at done()), and the other
ranks take them before their next step, so every worker normalises with the same statistics, a checkpoint holds
them, and a restarted worker starts from them.
Integer buffers (num_batches_tracked) stay each worker's own. buffers="local" keeps every buffer local.
"""

import contextlib
import gc
import math
import signal
import time
import types

import numpy as np
import torch

from . import Error, connect

__all__ = ["BackgroundEvaluator", "DistributedModel", "DistributedOptimizer", "Sampler", "ServerOptimizer", "evaluate",
           "init", "load_split", "match_blas_threads", "stop_signal"]

_signal = 0  # the SIGTERM or SIGINT that asked this worker to stop (0: none)


def stop_signal():
    """The signal (signal.SIGTERM or signal.SIGINT) that asked this worker to stop, or 0."""
    return _signal


def _on_signal(number, frame):
    global _signal
    _signal = number
    # A second signal acts at once, as Python's defaults do.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"tessera: {signal.Signals(number).name}: stopping after this step", flush=True)


def init(handle_signals=True, **overrides):
    """Joins the job as a worker (see tessera.connect for the settings and their TESSERA_ variables); returns the
    Job. With handle_signals (the main thread only), SIGTERM and Ctrl-C stop training gracefully after the open
    step (see the module's documentation)."""
    job = connect(**overrides)
    if handle_signals:
        try:
            signal.signal(signal.SIGTERM, _on_signal)
            signal.signal(signal.SIGINT, _on_signal)
        except ValueError:
            pass  # not the main thread: the caller handles signals
    return job


def match_blas_threads(threads=None):
    """Gives OpenBLAS (the BLAS of Debian's PyTorch) `threads` threads, default torch.get_num_threads(); returns
    the number set, or None when this process has no OpenBLAS. torch.set_num_threads does not reach it, and its
    idle threads yield the CPU in a loop: on a worker they take it from the exchange's threads and from the
    servers beside it (a fifth of a worker's CPU on 2 cores, measured). DistributedModel calls it."""
    import ctypes

    threads = torch.get_num_threads() if threads is None else int(threads)
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libopenblas" in line}
    except OSError:
        return None
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            library = ctypes.CDLL(path)  # the copy already loaded
            library.openblas_set_num_threads(ctypes.c_int(threads))
            return threads
        except (OSError, AttributeError):
            continue
    return None


def load_split(job, train=True):
    """The job's training or test split, read as tessera-worker reads it (data { ... } of the job: Debian's
    Fashion-MNIST IDX files by default, or the seeded synthetic problem): (x float32 [n, features] in [0, 1],
    y int64 [n], classes). Raises tessera.Error NOT_FOUND naming a missing file."""
    x, y, classes = job.client.load_split(train)
    return torch.from_numpy(x), torch.from_numpy(y), classes


def evaluate(module, x, y, batch_size=1000):
    """(accuracy, mean cross-entropy loss) of a classifier `module` on (x, y), in eval mode and without gradients
    (BatchNorm uses its running statistics); the module's mode is restored. Score a DistributedModel's module
    after settle()."""
    was_training = module.training
    module.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            logits = module(x[start:start + batch_size])
            target = y[start:start + batch_size]
            correct += (logits.argmax(1) == target).sum().item()
            loss += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
    module.train(was_training)
    return correct / max(1, len(x)), loss / max(1, len(x))


class BackgroundEvaluator:
    """Scores copies of a model on a thread of its own while training goes on, as tessera-worker's evaluator does:
    an evaluating worker does not fall behind the others (in ASYNC it would push ever staler gradients). `copy`
    is a module of the same architecture that receives the values (and buffers) offered; PyTorch releases the
    GIL in its kernels, so the thread computes beside the training loop.

        scorer = tt.BackgroundEvaluator(make_net(), test_x, test_y)
        ...
        if model.clock % 200 == 0:
            model.settle()
            scorer.offer(net, model.clock)       # skipped while the previous copy is still being scored
        for clock, accuracy, loss in scorer.results():
            model.report(accuracy=accuracy, test_loss=loss, clock=clock)
        ...
        scorer.drain()                           # at the end: waits for the last score
    """

    def __init__(self, copy, x, y, threads=1):
        import threading

        self._copy = copy
        self._x, self._y = x, y
        self._threads = threads
        self._lock = threading.Lock()
        self._done = []
        self._thread = None
        self.last_clock = -1  # the clock of the last values offered and taken

    def offer(self, module, clock):
        """Copies `module`'s state and scores it on the thread; False (and nothing copied) while it is busy."""
        import threading

        if self._thread is not None and self._thread.is_alive():
            return False
        self._copy.load_state_dict(module.state_dict())
        self.last_clock = clock
        self._thread = threading.Thread(target=self._score, args=(clock,), daemon=True)
        self._thread.start()
        return True

    def _score(self, clock):
        torch.set_num_threads(self._threads)
        accuracy, loss = evaluate(self._copy, self._x, self._y)
        with self._lock:
            self._done.append((clock, accuracy, loss))

    def results(self):
        """The scores finished since the last call: [(clock, accuracy, loss)]."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def drain(self):
        """Waits for the copy being scored, then returns results()."""
        if self._thread is not None:
            self._thread.join()
        return self.results()


def _some(names, most=5):
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


class Sampler:
    """This worker's example indices for each step, from the model's clock on (a restarted worker goes on where
    the job is), until the job stops: worker r takes the r-th batch_size examples of every step's global batch
    (batch_size * workers examples, reshuffled every epoch from the job's seed, the order tessera-worker uses),
    or the slice the scheduler gives it when the job balances the split (consistency { balance: THROUGHPUT })."""

    def __init__(self, model, examples):
        from ._tessera import BatchSchedule

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
        if model._current is _REPLAY_BLOCK:
            model._end_replay()
            self.gate = model._gate
            return False
        busy = time.perf_counter() - self._started - model._waited
        if model.script and not model._sync:
            model._end_local_block(self.batch_size, busy)
            self.gate = model._gate
            return False
        try:
            model._send_the_rest()
        except Error:
            model._abandon()
            raise
        try:
            self.gate = model._finish(self.batch_size, busy)
        except Error:
            if not model._take_rollback():
                raise
            self.gate = model._gate
            return False
        if model._take_rollback():
            self.gate = model._gate
        elif model.script:
            try:
                model._install_mean_gradients()
            except Error:
                if not model._take_rollback():  # the job went back to a checkpoint while the mean was awaited
                    raise
                self.gate = model._gate
        elif model._scaling is not None:
            self.skipped = model._update_scaler()
        return False


class _HostMirror:
    """A CUDA model's parameters in pinned host memory: the values the exchange writes and the gradients it reads,
    and the copies between them and the GPU (gradients on a side stream, collected as each copy finishes)."""

    def __init__(self, params):
        self.params = params
        self.values = [torch.empty(p.shape, dtype=torch.float32, pin_memory=True) for p in params]
        for v, p in zip(self.values, params):
            v.copy_(p.detach())
        self.grads = [[torch.zeros(p.shape, dtype=torch.float32, pin_memory=True) for p in params] for _ in range(2)]
        self.stream = torch.cuda.Stream(device=params[0].device)
        self.copying = []  # (event, index) of gradients on their way to the host
        self.values_copied = None  # an event after the last copies of values to the GPU

    def copy_gradient(self, i, grads):
        """Starts the copy of params[i].grad into grads[i] once the computing stream has produced it."""
        p = self.params[i]
        self.stream.wait_stream(torch.cuda.current_stream(p.device))
        with torch.cuda.stream(self.stream):
            grads[i].copy_(p.grad.detach(), non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        p.grad.record_stream(self.stream)
        self.copying.append((event, i))

    def copied(self, wait):
        """Indices whose gradient copies are in (all of them with wait)."""
        done, pending = [], []
        for event, i in self.copying:
            if wait:
                event.synchronize()
            (done if wait or event.query() else pending).append((event, i))
        self.copying = pending
        return [i for _, i in done]

    def load_values(self, indices):
        for i in indices:
            self.params[i].data.copy_(self.values[i], non_blocking=True)
        self.values_copied = torch.cuda.Event()
        self.values_copied.record()

    def values_free(self):
        """Waits until the GPU has read the last values copied (the next exchange writes over them)."""
        if self.values_copied is not None:
            self.values_copied.synchronize()


_STEP_STATE = frozenset({
    "_replay", "_saved_for", "_pending_rollback", "_current", "_scaling", "_previous", "_ready", "_outside",
    "_hooked", "_script_push", "_digests", "_gate", "_waited", "_sent", "_set", "_grads", "_steps", "_samples",
    "_reported", "_seen", "_fired", "_no_sync", "_resent"})


_LOCAL_BLOCK = object()  # the open step of ASYNC or SSP with SCRIPT: nothing leaves until the optimizer steps
# SYNC with SCRIPT: the open step of a worker that took the values of the clock before its own (a checkpoint's): its
# gradients stay here, and the block ends with the checkpoint's mean gradient of that step in .grad.
_REPLAY_BLOCK = object()
_DIGEST = "script:digest"  # SYNC with SCRIPT: the keeper's [clock, digest of its values]
_FOUND_INF = "script:found_inf"  # SYNC with SCRIPT: exchanged every round, > 0 when a worker's gradient was not finite
_OPTIMIZER_STATE = "script:optimizer:"  # + owner: the state of a script's optimizer, kept on the servers
_VALUES = "script:values:"  # + parameter index. SYNC with SCRIPT: the keeper's values (joiners, checkpoints)
_LRS = "script:lrs"  # SYNC with SCRIPT: the keeper's learning rate of each parameter group (two float32s each)
_SAVED_CLOCK = "script:saved_clock"  # SYNC with SCRIPT: the clock of the keeper's last saved values and state
_KEPT = (_OPTIMIZER_STATE, _VALUES, _LRS, _SAVED_CLOCK)  # names of what the servers keep for a script


class _OptimizerState:
    """A script optimizer's state (Adam's moments and step, SGD's momentum, ...) as state entries on the servers,
    so that checkpoints hold it and a restarted worker continues with it. Its layout is found by stepping a copy
    of the optimizer once, over copies of the parameters, on zero gradients. With `values` (SYNC, where the values
    are the workers' own) the parameters' values and the groups' learning rates go with it, and then the clock
    they are of: the keeper (the gate's values_keeper, rank 0 while it is there) sends them at the start of a step,
    before that step's gradients leave, so a checkpoint cut at clock c holds those of c - 1 beside the mean
    gradient of step c - 1 (the chunks at version c); a joiner takes the keeper's of its start clock."""

    def __init__(self, optimizer, model, owner, values=False):
        self.optimizer = optimizer
        self.model = model
        self.value_names = [f"{_VALUES}{j}" for j in range(len(model._params))] if values else []
        self.value_host = [np.zeros(max(1, p.numel()), np.float32) for _, p in model._params] if values else []
        if values:  # a learning rate as a float32 and the float32 of what that leaves: 48 bits of the double
            self.value_names.append(_LRS)
            self.value_host.append(np.zeros(2 * len(optimizer.param_groups), np.float32))
        params = [p for group in optimizer.param_groups for p in group["params"]]
        copies = {id(p): p.detach().clone().requires_grad_(True) for p in params}
        groups = [dict(group, params=[copies[id(p)] for p in group["params"]]) for group in optimizer.param_groups]
        try:
            probe = type(optimizer)(groups)
            for c in copies.values():
                c.grad = torch.zeros_like(c)
            probe.step()
        except Exception as e:  # noqa: BLE001: any optimizer's own complaint
            raise Error(f"INVALID_ARGUMENT: the layout of {type(optimizer).__name__}'s state could not be found by "
                        f"stepping a copy of it ({e}); pass state_every=0 to keep its state in this process only")
        self.entries = []  # (name, parameter, key, like): `like` a tensor of the state's dtype, shape, device
        for j, p in enumerate(params):
            for key, value in sorted(probe.state.get(copies[id(p)], {}).items()):
                if torch.is_tensor(value) and value.is_floating_point():
                    self.entries.append((f"{_OPTIMIZER_STATE}{owner}:{j}:{key}", p, key, value))
        self.names = [name for name, *_ in self.entries]
        self.host = [np.zeros(max(1, like.numel()), np.float32) for *_, like in self.entries]
        state = [(name, [len(h)]) for name, h in zip(self.names + self.value_names, self.host + self.value_host)]
        if values:
            state.append((_SAVED_CLOCK, [2]))
        if state:
            model._client.declare([], state=state)

    def save(self, clock, values=False):
        """Sends the optimizer's state; with `values` (SYNC) the parameters' values and the groups' learning rates
        too, and then the clock they are of."""
        state = self.optimizer.state
        for (name, p, key, like), host in zip(self.entries, self.host):
            value = state.get(p, {}).get(key)
            if value is not None:
                np.copyto(host, value.detach().reshape(-1).float().cpu().numpy())
        values = values and bool(self.value_names)
        if values:
            with torch.no_grad():
                for (_, p), host in zip(self.model._params, self.value_host):
                    np.copyto(host, p.detach().reshape(-1).cpu().numpy())
            lrs = np.array([float(group["lr"]) for group in self.optimizer.param_groups], np.float64)
            high = lrs.astype(np.float32)
            self.value_host[-1][0::2], self.value_host[-1][1::2] = high, (lrs - high).astype(np.float32)
        names, hosts = self.names + (self.value_names if values else []), self.host + (self.value_host if values else [])
        if names:
            self.model._client.assign(names, hosts)
        if values:  # after the rest has landed: a joiner that sees this clock takes all of it
            self.model._client.assign([_SAVED_CLOCK], [_clock_parts(clock)])

    def saved_clock(self):
        """The clock of the values and state on the servers (-1: none)."""
        client, saved = self.model._client, np.zeros(2, np.float32)
        client.pull([_SAVED_CLOCK], [saved])
        return _clock_of(saved) if client.pulled_version(_SAVED_CLOCK) > 0 else -1

    def take_values(self, clock, timeout_s=300.0):
        """SYNC: takes the keeper's values, optimizer state and learning rates of `clock`, waiting until they are
        on the servers (the keeper sends them at the start of that step, which cannot end without this worker), or
        those of clock - 1 where the chunks hold the mean gradient of that step (a checkpoint cut at `clock`: a
        resumed job, a rollback), which then is in the model's exchange buffers. Returns the clock of the values
        taken. Raises tessera.Error UNAVAILABLE when none come within `timeout_s`."""
        model, client = self.model, self.model._client
        started = told = time.time()
        while True:
            held = self.saved_clock()
            if held == clock or (held == clock - 1 and model._pull_means(clock)):
                client.pull(self.value_names, self.value_host)
                client.pull(self.names, self.host)
                if self.saved_clock() == held:
                    break  # not overwritten while this worker read them
                continue
            now = time.time()
            # Newer values than wanted are waited out too: after a rollback a server may still be restoring.
            if now - started > timeout_s or client.job_stopped():
                raise Error(f"UNAVAILABLE: the values and optimizer state of clock {clock} (or of clock {clock - 1} "
                            f"with that step's mean gradient, as a checkpoint holds them) are not on the servers "
                            f"(they hold those of clock {held}; -1: none): the keeper (rank 0, or while it is away "
                            "the lowest-ranked worker there) sends them every state_every steps and for a joiner")
            if now - told > 10:
                told = now
                print(f"tessera: worker {model.rank}: waiting for the values of clock {clock} (the servers hold "
                      f"those of clock {held}), {now - started:.0f} s", flush=True)
            time.sleep(0.05)
        with torch.no_grad():
            for (_, p), host in zip(model._params, self.value_host):
                p.copy_(torch.from_numpy(host).reshape(p.shape))
        if model._mirror is not None:
            for (_, p), mirror in zip(model._params, model._weights):
                np.copyto(mirror, p.detach().cpu().numpy())
        if client.pulled_version(_LRS) > 0:  # a checkpoint of a job before the rates were kept has none
            lrs = self.value_host[-1][0::2].astype(np.float64) + self.value_host[-1][1::2].astype(np.float64)
            for group, lr in zip(self.optimizer.param_groups, lrs):
                group["lr"] = float(lr)
        self._take_pulled()
        return held

    def restore(self):
        """Takes the saved state when there is one (False when none was saved yet)."""
        if not self.entries:
            return False
        self.model._client.pull(self.names, self.host)
        if not all(self.model._client.pulled_version(n) > 0 for n in self.names):
            return False
        self._take_pulled()
        return True

    def _take_pulled(self):
        """The optimizer's state from what was pulled into the host buffers."""
        for (name, p, key, like), host in zip(self.entries, self.host):
            value = torch.from_numpy(host.copy()).reshape(like.shape).to(dtype=like.dtype, device=like.device)
            self.optimizer.state[p][key] = value


def _clock_parts(clock):
    """A clock as two float32s exact up to 2^44 (the low 20 bits and the rest)."""
    return np.array([clock % (1 << 20), clock >> 20], np.float32)


def _clock_of(parts):
    return int(parts[0]) + (int(parts[1]) << 20)


def DistributedOptimizer(optimizer, model, check_every=100, state_every=1):
    """Keeps the script's own torch.optim optimizer (any, with its parameter groups, lr_scheduler, clipping and
    GradScaler) in a job whose servers only combine (optimizer { kind: SCRIPT }). Returns `optimizer` itself,
    its step() extended; the loop is a DDP script's:

        opt = tt.DistributedOptimizer(torch.optim.AdamW(net.parameters(), lr=1e-3), model)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, ...)
        for indices in model.sampler(len(x)):
            opt.zero_grad()
            with model.step(batch_size=len(indices)):
                loss_fn(model(x[indices]), y[indices]).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)   # on the round's mean gradient (SYNC)
            opt.step()
            sched.step()

    SYNC: each gradient leaves as the step block sends it (overlap as the model says); when the block ends,
    .grad holds the workers' mean gradient, and every worker's optimizer makes the same step. Every
    `check_every` clocks each worker compares a digest of its values with the keeper's; a mismatch fails the job
    naming the worker. ASYNC and SSP: the block's gradients stay here; step() steps on them, sends the change
    it made to the values (the servers add it, times the staleness-aware scale) and takes the servers' values,
    with everyone's changes, before the next forward. A step the script skips (GradScaler after inf) sends no
    change.

    The optimizer's state (moments, step counts, momentum) is sent to the servers every `state_every` steps (in
    ASYNC and SSP by every worker; 0: the state stays in this process): checkpoints hold it, and a worker that
    restarts takes it here and continues with it. In SYNC, where the values are the workers' own and every
    worker's state is the same, one worker, the keeper (rank 0, or while it is away the lowest-ranked worker
    there), sends the values, the state and the groups' learning rates at the start of every `state_every`-th
    step and of a step a worker joins at. A worker that joins the running job, rank 0 included, waits here for
    the keeper's values of its start clock. A resumed job, and a job that went back to a checkpoint (a lost server
    without backups), take the checkpoint's values of the step before its clock and that step's mean gradient: a
    resumed worker's first block runs on that step's data and ends with that mean in .grad, so the script's
    optimizer makes the checkpoint's step again (exact with state_every=1; otherwise UNAVAILABLE names the clocks
    there are). Make the schedule after this call with last_epoch=model.clock - 1, so that a restarted worker's
    schedule starts where the job is (the base rate is kept as each group's initial_lr); after a rollback the
    schedulers of this optimizer are set back to the checkpoint's clock here.

    Raises tessera.Error FAILED_PRECONDITION when the job's servers run an optimizer of their own, and
    INVALID_ARGUMENT for an optimizer over parameters the model does not train."""
    if not model.script:
        raise Error(f"FAILED_PRECONDITION: the job's servers run its optimizer ({model.job.spec['optimizer']['kind']}"
                    "); a script's own optimizer needs optimizer { kind: SCRIPT } in the job")
    if getattr(optimizer, "_tessera_model", None) is not None:
        raise Error("FAILED_PRECONDITION: this optimizer is already a DistributedOptimizer")
    trained = {id(p) for _, p in model._params}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in trained:
                raise Error("INVALID_ARGUMENT: the optimizer holds a parameter the model does not train (frozen, "
                            "or of another module)")
    model._check_every = int(check_every)
    model._state_every = int(state_every)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    if model._state_every > 0 or model._sync:  # SYNC: the keeper also saves for a worker that joins
        model._optimizer_state = _OptimizerState(optimizer, model, "all" if model._sync else f"rank{model.rank}",
                                                 values=model._sync)
        if model._joining:
            model._take_kept_values()
        elif model.clock > 0 and model._optimizer_state.restore():
            print(f"tessera: worker {model.rank}: the optimizer's state continues from the servers' copy at clock "
                  f"{model.clock}", flush=True)
    step = optimizer.step

    def distributed_step(self, *args, **kwargs):
        if model._current is not None:
            raise Error("FAILED_PRECONDITION: optimizer.step() inside a step block: call it after the block, once "
                        "the block's gradients are complete")
        result = step(*args, **kwargs)
        model._note_script_step()
        return result

    if getattr(step, "_with_counter", False):
        distributed_step._with_counter = True  # an lr_scheduler made before: its order check still holds
    # A bound method, as torch.optim.lr_scheduler expects of an optimizer's step when it wraps it.
    optimizer.step = types.MethodType(distributed_step, optimizer)
    optimizer._tessera_model = model
    return optimizer


class ServerOptimizer(torch.optim.Optimizer):
    """The servers' optimizer as a torch.optim.Optimizer, so that the script's torch.optim.lr_scheduler drives the
    learning rate the servers step with (the servers' path: the job's optimizer runs there, sharded). Each block
    sends every parameter's group["lr"] as a factor of the job's learning_rate with its gradient:

        model = tt.DistributedModel(net, job)
        opt = tt.ServerOptimizer(model)                      # or parameter groups, each with its own "lr"
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)   # any schedule over group["lr"]
        for indices in model.sampler(len(x)):
            with model.step(batch_size=len(indices)):
                loss_fn(model(x[indices]), y[indices]).backward()
            opt.step()                                         # nothing to do: the servers stepped
            sched.step()

    Parameter groups (`params`, as torch.optim takes them) may set "lr" and "weight_decay"; every parameter the
    model trains must be in one; each keeps its base rate as initial_lr, so a restarted script makes its schedule
    with last_epoch=model.clock - 1. A group's weight decay must be what the job gives its parameters (the job's
    weight_decay, 0 for names matching its no_decay): the servers apply the job's. zero_grad() does nothing (each
    step block starts from zeros, and a step's gradients may still be leaving when the block ends).

    Raises tessera.Error FAILED_PRECONDITION in a job whose optimizer is the script's (SCRIPT: use
    DistributedOptimizer) or that schedules its own learning rate (optimizer.schedule: one schedule, not two), and
    INVALID_ARGUMENT for a group setting the servers cannot honour or a parameter left out or not trained."""

    def __init__(self, model, params=None):
        spec = model.job.spec["optimizer"]
        if model.script:
            raise Error("FAILED_PRECONDITION: the job's optimizer is the script's (kind: SCRIPT): wrap it in "
                        "tt.DistributedOptimizer instead")
        schedule = spec.get("schedule") or {}
        if int(schedule.get("warmup_steps", 0) or 0) or schedule.get("kind", "CONSTANT") not in ("CONSTANT", 0):
            raise Error("FAILED_PRECONDITION: the job schedules its own learning rate (optimizer.schedule); a "
                        "script's schedule through ServerOptimizer would multiply it: keep one of the two")
        self.base_lr = float(spec["learning_rate"])
        if not self.base_lr > 0:
            raise Error(f"FAILED_PRECONDITION: the job's learning_rate is {self.base_lr}: a schedule's rates are "
                        "factors of it")
        groups = params if params is not None else [p for _, p in model._params]
        super().__init__(groups, {"lr": self.base_lr})
        allowed = {"params", "lr", "weight_decay", "initial_lr"}
        decay = float(spec.get("weight_decay") or 0.0)
        no_decay = list(spec.get("no_decay") or [])
        group_of = {}
        for g, group in enumerate(self.param_groups):
            unknown = sorted(set(group) - allowed)
            if unknown:
                raise Error(f"INVALID_ARGUMENT: parameter group {g} sets {', '.join(unknown)}: the servers run the "
                            f"job's optimizer ({spec['kind']}) with its own settings; a group may set lr and "
                            "weight_decay only")
            for p in group["params"]:
                i = model._index.get(id(p))
                if i is None:
                    raise Error(f"INVALID_ARGUMENT: parameter group {g} holds a parameter the model does not train "
                                "(frozen, or of another module)")
                group_of[i] = g
                name = model.names[i]
                job_decay = 0.0 if any(s in name for s in no_decay) else decay
                if "weight_decay" in group and float(group["weight_decay"]) != job_decay:
                    raise Error(f"INVALID_ARGUMENT: parameter group {g} gives '{name}' weight decay "
                                f"{group['weight_decay']}, the job {job_decay} (weight_decay {decay}, no_decay "
                                f"{no_decay}): the servers apply the job's; set it in the job's optimizer")
        missing = [name for i, name in enumerate(model.names) if i not in group_of]
        if missing:
            raise Error(f"INVALID_ARGUMENT: {_some(missing)} in no parameter group: every parameter the model trains "
                        "needs a learning rate")
        self._group_of = [group_of[i] for i in range(len(model.names))]
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])  # a restarted script's schedule with last_epoch continues
        model._server_optimizer = self

    def factors(self):
        """Each parameter's learning rate now, as a factor of the job's. Raises tessera.Error INVALID_ARGUMENT for a
        group's rate that is negative or not finite."""
        rates = [float(group["lr"]) for group in self.param_groups]
        bad = [g for g, lr in enumerate(rates) if not math.isfinite(lr) or lr < 0]
        if bad:
            raise Error(f"INVALID_ARGUMENT: parameter group {bad[0]} has learning rate {rates[bad[0]]}: the servers "
                        "take a finite rate of 0 or more")
        return [rates[g] / self.base_lr for g in self._group_of]

    def step(self, closure=None):
        """Nothing to do: the servers stepped when the block's gradients arrived."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none=False):
        """Nothing to do: each step block starts from zeros."""


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
        self._params = []
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue  # frozen: stays as each worker has it
            if p.dtype != torch.float32:
                raise Error(f"INVALID_ARGUMENT: parameter '{name}' is {p.dtype}; the servers hold float32")
            if not p.is_contiguous():
                raise Error(f"INVALID_ARGUMENT: parameter '{name}' is not contiguous")
            self._params.append((name, p))
        if not self._params:
            raise Error("INVALID_ARGUMENT: the module has no trainable parameters")
        devices = {p.device for _, p in self._params}
        if len(devices) > 1:
            raise Error(f"INVALID_ARGUMENT: the parameters are on several devices ({sorted(map(str, devices))})")
        self.device = devices.pop()
        if self.device.type not in ("cpu", "cuda"):
            raise Error(f"INVALID_ARGUMENT: parameters on {self.device} (CPU or CUDA only)")
        self.names = [name for name, _ in self._params]
        self._index = {id(p): i for i, (_, p) in enumerate(self._params)}
        tensors = [p for _, p in self._params]
        # optimizer { kind: SCRIPT }: the script's own optimizer steps (DistributedOptimizer); the servers only
        # combine: in SYNC the exchange brings the workers' mean gradient, in ASYNC and SSP it takes this worker's
        # change to the values and brings the servers' values.
        self.script = job.spec["optimizer"]["kind"] == "SCRIPT"
        self._sync = job.mode == "SYNC"
        self._script_push = None  # ASYNC and SSP with SCRIPT: (batch size, values before the optimizer's step)
        self._digests = {}  # SYNC with SCRIPT: this worker's digest of its values, by clock
        self._check_every = 100
        self._state_every = 0
        self._optimizer_state = None
        self._joining = False  # SYNC with SCRIPT, joined after the start: the values come with DistributedOptimizer
        # SYNC with SCRIPT: (clock, clock of the values taken) when the next block replays a checkpoint's step
        # (_end_replay), else None.
        self._replay = None
        self._pending_rollback = None  # a rollback heard of by the optimizer's step: taken as the next block begins
        self._saved_for = -1  # SYNC with SCRIPT: the clock of the last values known to be on the servers
        self._server_optimizer = None  # ServerOptimizer: the script's schedule drives the servers' learning rate
        self._scaling = None  # the open step's gradient scaler (_Scaling), in the servers' path
        self._scalings = {}  # by id(scaler): each scaler's count of steps since it last changed
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
        # Two gradient sets, one per step in turn: a step's pushes may still be on the wire while the next step's
        # backward runs, and a set is reused only once its step's exchange has settled.
        self._steps = 0
        self._grads = self._grad_sets[0]
        self._buffers = []
        if buffers == "rank0":
            self._buffers = [(name, b) for name, b in module.named_buffers() if b.dtype == torch.float32]
        self._buffer_every = max(1, int(buffer_every))
        self._buffer_host = [np.ascontiguousarray(b.detach().cpu().numpy()) for _, b in self._buffers]
        self.buffer_names = ["buffer:" + name for name, _ in self._buffers]
        params = [(name, list(p.shape)) for name, p in self._params]
        if self._flags_inf:
            params.append((_FOUND_INF, [1]))
        state = [(name, list(b.shape)) for name, (_, b) in zip(self.buffer_names, self._buffers)]
        if self.script and self._sync:
            state.append((_DIGEST, [4]))
        mine = dict(params + state)
        self._check_matches_job(mine, self._client.job_parameters())
        self._client.declare([(name, shape, 0.0, 0) for name, shape in params], state=state)
        self._check_matches_job(mine, self._client.job_parameters())  # a worker of another model declared first
        self._plan = self._client.step_plan(exchanged, self._grad_sets, self._values)
        self._grad_pointers = [[g.ctypes.data for g in grads] for grads in self._grad_sets]
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
        the module's documentation for several backward calls and for gradient edits).

        `scaler` (a torch.cuda.amp.GradScaler, in the servers' path): the block divides the gradients by its scale
        before they leave (they leave when the block ends), a step whose gradients hold an inf or NaN on any
        worker is skipped by every worker alike (the block's `skipped` says so), and the scaler's scale is updated
        as GradScaler.update() would; call neither scaler.step() nor scaler.update(). A disabled scaler (no CUDA)
        is ignored. With optimizer { kind: SCRIPT } use the scaler with the script's optimizer instead."""
        if scaler is not None and self.script:
            raise Error("FAILED_PRECONDITION: with optimizer { kind: SCRIPT } the scaler goes with the script's "
                        "optimizer (scaler.unscale_(opt), scaler.step(opt), scaler.update() after the block), not "
                        "to model.step()")
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
        return bool(self._gate["stop"]) or self.clock >= self._stop_clock or _signal != 0

    @property
    def stop_reason(self):
        if _signal:
            return f"stopped by {signal.Signals(_signal).name}"
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
        if self._script_push is not None and not self._gate["stop"]:
            self._push_script_update()
        self._settle()
        if self._buffers and self.rank == self._keeper:
            try:
                self._send_buffers()
            except Error:
                if not self._gate["stop"]:
                    raise  # a job that is over may no longer take them
        if _signal:
            why = f"{self.stop_reason}: worker {self.rank} stopped at clock {self.clock}"
            self._client.fail(why)
            if _signal == signal.SIGINT:
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
        if self._joining:
            raise Error(f"FAILED_PRECONDITION: this worker joined the SYNC job at clock {self.clock}, whose values "
                        "are the workers' own: wrap the optimizer in tt.DistributedOptimizer before the first step, "
                        "so that it takes the keeper's values and optimizer state")
        if self._replay is not None:
            for _, p in self._params:
                p.grad = None  # backward's gradients go to memory of their own, and are not used
            self._current = _REPLAY_BLOCK
            self._waited = 0.0
            return
        if self._buffers and self.rank != self._keeper and self._steps % self._buffer_every == 0:
            self._take_buffers()
        if (self.script and self._sync and self.rank == self._keeper and self._optimizer_state is not None
                and self._saved_for != self.clock
                and (self.clock in self._gate.get("joining_clocks", ())
                     or (self._state_every > 0 and self.clock % self._state_every == 0))):
            # Before this step's gradients leave: a worker joining at this clock (the gate names it) waits for
            # them, and a checkpoint cut at the next clock holds them beside this step's mean gradient.
            self._optimizer_state.save(self.clock, values=True)
            self._saved_for = self.clock
        if self.script and not self._sync:
            if self._script_push is not None:
                self._push_script_update()  # the last block's optimizer step was skipped (GradScaler): no change
            self._current = _LOCAL_BLOCK
            self._waited = 0.0
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

    def _send_the_rest(self):
        """At the block's end: refuses the step when the script edited a gradient after backward (before anything
        more leaves), then sends the gradients backward made that have not left."""
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
        # A parameter this step did not read (an unused branch) may still await the last step's values: they land
        # before its gradient (zeros, or what backward made) leaves, so that this step's values land after them.
        self._need(range(len(self._params)))
        if self._scaling is not None:
            self._unscale()
        for i in range(len(self._params)):
            if self._fired[i] and not self._sent[i]:
                self._send(i)

    def _unscale(self):
        """The servers' path with a scaler: the gradients leave divided by its scale; with an inf or NaN in any of
        them, zeros leave and the step is skipped (in SYNC by every worker: no server applies its round)."""
        grads = [p.grad for i, (_, p) in enumerate(self._params) if self._fired[i] and p.grad is not None]
        if self._scaling.unscale(grads):
            for g in grads:
                g.zero_()
            self._current.skip()

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

    # optimizer { kind: SCRIPT } (see DistributedOptimizer).
    def _install_mean_gradients(self):
        """SYNC: once the round's mean gradient is in, it becomes each parameter's .grad (the script's optimizer
        steps on it); then the keeper's digest of the values two blocks back is compared with this worker's."""
        n = len(self._params)
        if self._previous is not None:
            try:
                for i in range(n + 1):  # the parameters' means and the round's flag
                    self._previous.wait_values(i)
            except Error:
                if not self._previous.stopped:
                    raise
                self._after(None)
                for _, p in self._params:
                    p.grad = None  # the optimizer makes no step on a mean that did not arrive
                print(f"tessera: worker {self.rank}: the job stopped before the round's mean gradient arrived; the "
                      "optimizer's last step is skipped", flush=True)
                return
        self._after(None)
        self._install_means()
        self._compare_digest()

    def _install_means(self):
        """The round's mean gradient, in the exchange's buffers, becomes each parameter's .grad (NaN when a
        worker's gradient was not finite: so is the round's, on every worker)."""
        if self._values[-1][0] > 0:
            for mean in self._values[:-1]:
                mean.fill(np.nan)
        for (_, p), mean in zip(self._params, self._values):
            p.grad = torch.from_numpy(mean).to(p.device) if self._mirror is not None else torch.from_numpy(mean)

    def _pull_means(self, clock):
        """Pulls the chunks' mean gradient of step clock - 1 into the exchange's buffers (a checkpoint's, cut at
        `clock`). False when the chunks do not all hold that step's (their round is not `clock`)."""
        for _, p in self._params:
            p.grad = None  # the last round's mean, over these buffers: no backward may add into them now
        self._client.pull([_FOUND_INF], [self._values[-1]])
        if self._client.pulled_clock(_FOUND_INF) != clock:
            return False
        names = self.names + [_FOUND_INF]
        self._client.pull(names, self._values)
        return all(self._client.pulled_clock(n) == clock for n in names)

    def _take_kept_values(self):
        """SYNC with SCRIPT, a worker that started where the job is (joined, rejoined, resumed): takes the
        keeper's values, optimizer state and rates; with a checkpoint's, of the clock before, its first block
        replays that step (_end_replay)."""
        clock = self.clock
        took = self._optimizer_state.take_values(clock)
        self._joining = False
        self._saved_for = took
        if took == clock:
            print(f"tessera: worker {self.rank}: joined at clock {clock} with the keeper's values and optimizer "
                  "state", flush=True)
            return
        self._replay = (clock, took)
        self._gate = dict(self._gate, clock=took)
        print(f"tessera: worker {self.rank}: took the checkpoint's values of clock {took}: its first step ends with "
              f"that step's mean gradient, so that the optimizer makes it again, then it goes on at {clock}",
              flush=True)

    def _end_replay(self):
        """The end of a replayed block: the gradients backward made stay unused; .grad holds the checkpoint's mean
        gradient of this step (pulled when the values were taken; None when the values taken were of the job's
        clock already: the optimizer's step changes nothing), and the clock is the job's again."""
        (clock, took), self._replay = self._replay, None
        self._current = None
        self._install_means_or_none(clock, took)
        self._gate = dict(self._gate, clock=clock)

    def _install_means_or_none(self, clock, took):
        if took == clock - 1:
            self._install_means()
        else:
            for _, p in self._params:
                p.grad = None

    def _values_digest(self):
        """The mean, the root mean square and the mean of every 7th of all the parameters' values: equal on every
        worker of a SYNC job with SCRIPT (the same mean gradient, the same optimizer); means, so that a 16-bit
        wire carries them unclamped."""
        total, squares, strided, count, strided_count = 0.0, 0.0, 0.0, 0, 0
        with torch.no_grad():
            for _, p in self._params:
                flat = p.detach().reshape(-1).double()
                total += flat.sum().item()
                squares += flat.dot(flat).item()
                strided += flat[::7].sum().item()
                count += flat.numel()
                strided_count += flat[::7].numel()
        return np.array([total / count, (squares / count) ** 0.5, strided / strided_count], np.float64)

    def _note_script_step(self):
        """After the script's optimizer stepped. SYNC: every check_every clocks, this worker's digest of its values
        is kept, and the keeper sends its own to the servers. ASYNC and SSP: the change leaves."""
        if not self._sync:
            self._push_script_update()
            if (self._optimizer_state is not None and self._state_every > 0
                    and self.clock % self._state_every == 0):
                self._optimizer_state.save(self.clock)
            return
        clock = self.clock
        if self._gate["stop"]:
            return  # the job is over: its servers may be leaving
        if self._check_every <= 0 or clock % self._check_every:
            return
        digest = self._values_digest()
        if self.rank == self._keeper:
            try:
                self._client.assign([_DIGEST], [np.array([clock, *digest], np.float32)])
            except Error:
                self._pending_rollback = self._client.take_rollback()
                if self._pending_rollback is None:
                    raise
        else:
            self._digests = {clock: digest}

    def _compare_digest(self):
        """A round after a digest clock c (the keeper sent its digest of c before it pushed this round): a worker
        whose values differ from the keeper's fails the job naming itself."""
        if self.rank == self._keeper or not self._digests:
            return
        (clock, mine), = self._digests.items()
        if self.clock <= clock:
            return
        self._digests = {}
        theirs = np.zeros(4, np.float32)
        self._client.pull([_DIGEST], [theirs])
        if int(theirs[0]) != clock:
            return  # the keeper changed, stopped or restarted in between: nothing to compare
        mine32 = mine.astype(np.float32)
        # The digest travels at the wire's precision for values: 8 bits of mantissa in BF16, 11 in FP16.
        rtol = {"BF16": 2.0 ** -7, "FP16": 2.0 ** -10}.get(self.job.spec.get("wire", {}).get("values"), 1e-5)
        if np.allclose(mine32, theirs[1:], rtol=rtol, atol=1e-6):
            return
        why = (f"worker {self.rank}'s parameters differ from worker {self._keeper}'s at clock {clock} (digest "
               f"{mine32.tolist()} against {theirs[1:].tolist()}): with optimizer {{ kind: SCRIPT }} in SYNC every worker's optimizer "
               "must make the same step from the same mean gradient (the same optimizer, settings and schedule, "
               "and no change to the values outside it)")
        self._client.fail(why, program_error=True)
        raise Error("FAILED_PRECONDITION: " + why)

    def _end_local_block(self, batch_size, busy):
        """ASYNC and SSP with SCRIPT: the block's gradients stay here for the script's optimizer; the values it
        starts from are kept to make its change."""
        self._current = None
        self._settle()
        self._script_push = (batch_size, busy, [p.detach().clone() for _, p in self._params])

    def _push_script_update(self):
        """Sends the change the optimizer made since the block ended (the servers add it) and takes the clock."""
        if self._script_push is None:
            raise Error("FAILED_PRECONDITION: optimizer.step() without a step block before it")
        batch_size, busy, before = self._script_push
        self._script_push = None
        self._set = self._steps % 2
        self._grads = self._grad_sets[self._set]
        self._steps += 1
        with torch.no_grad():
            for (_, p), b, g in zip(self._params, before, self._grads):
                torch.sub(p.detach(), b, out=b)
                torch.from_numpy(g).copy_(b)
        self._current = self._plan.begin(self._set, batch_size)
        for i in range(len(self._params)):
            self._current.send(i)
        try:
            self._finish(batch_size, busy)
        except Error:
            self._abandon()
            raise

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
        checkpoint's values (with SCRIPT: _roll_script_back) and goes on from its clock. False when there was
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
        if self._values is not self._weights:
            self._roll_script_back(to, in_block)
            return True
        self._client.pull(self.names, self._values)
        if self._mirror is not None:
            self._mirror.load_values(range(len(self._params)))
        self._take_buffers()
        self._gate = {"clock": to, "stop": False, "stop_reason": "", "rolled_back": True}
        return True

    def _roll_script_back(self, to, in_block):
        """SYNC with SCRIPT: the checkpoint holds the keeper's values, optimizer state and rates of clock to - 1
        and that step's mean gradient: they become the parameters, the optimizer's state and .grad, so that the
        script's clipping and optimizer step after this block (`in_block`; else after the block that begins now,
        a replay) make the checkpoint's step again, and the schedulers of the optimizer go back to it. (Values of
        `to` itself, which the keeper saved after the cut: .grad is None, the step changes nothing.)"""
        if self._optimizer_state is None:
            raise Error(f"FAILED_PRECONDITION: the job went back to the checkpoint of clock {to}; with optimizer "
                        "{ kind: SCRIPT } in SYNC the values are the workers' own, and only tt.DistributedOptimizer "
                        "takes them back")
        self._digests = {}
        took = self._optimizer_state.take_values(to, timeout_s=60.0)
        self._saved_for = took
        self._take_buffers()
        self._gate = {"clock": to, "stop": False, "stop_reason": "", "rolled_back": True}
        if in_block:
            self._install_means_or_none(to, took)
        else:
            self._replay = (to, took)
            self._gate["clock"] = took
        optimizer = self._optimizer_state.optimizer
        scheduler = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler
        for o in gc.get_objects():  # rare (a rollback) and found without the script's help
            if isinstance(o, scheduler) and o.optimizer is optimizer:
                o.last_epoch = to - 1  # its next step() makes the rate of step `to`

    def _abandon(self):
        self._current = None
        self._scaling = None
        if self._mirror is not None:
            self._mirror.copying = []
