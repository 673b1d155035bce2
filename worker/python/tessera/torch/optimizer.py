"""tessera.torch's optimizers: ServerOptimizer (the servers' optimizer as a torch.optim.Optimizer, so that a script's
lr_scheduler drives it) and DistributedOptimizer (the script's own optimizer in a job with optimizer { kind: SCRIPT }),
with the names of what the servers keep for a script's optimizer and that optimizer's state there (_OptimizerState).

DistributedModel (model.py) imports from here, never the other way: this module knows the model by its attributes.
"""

import math
import time
import types

import numpy as np
import torch

from .. import Error
from .runtime import _some

# The names of what a script's optimizer exchanges and keeps on the servers (DistributedModel declares the
# first two).
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
        if values:
            # Marked as being written before any of them changes: a worker reading them (take_values) reads the
            # clock before and after its reads, and takes them only when both say the same clock, so that it
            # never takes this clock's values, or a mix, as those of the clock before.
            self.model._client.assign([_SAVED_CLOCK], [_clock_parts(-1)])
        if names:
            self.model._client.assign(names, hosts)
        if values:  # after the rest has landed: a joiner that sees this clock takes all of it
            self.model._client.assign([_SAVED_CLOCK], [_clock_parts(clock)])

    def saved_clock(self):
        """The clock of the values and state on the servers (-1: none, or being written)."""
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
            if held == clock or (held == clock - 1 and model._exchange.pull_means(clock)):
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
                            "the lowest-ranked worker there) sends them for each checkpoint's cut and for a joiner")
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


def DistributedOptimizer(optimizer, model, check_every=100, state_every=None):
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

    The optimizer's state (moments, step counts, momentum) goes to the servers, so that checkpoints hold it and a
    worker that restarts takes it here and continues with it. In SYNC, where the values are the workers' own and
    every worker's state is the same, one worker, the keeper (rank 0, or while it is away the lowest-ranked worker
    there), sends the values, the state and the groups' learning rates only when something needs them: at the
    start of the step before a checkpoint's clock (the scheduler announces the cut as the workers enter that
    step) and of a step a worker joins at; `state_every` > 0 also sends them every so many steps. In ASYNC and
    SSP every worker sends its state every `state_every` steps (default 1; 0: the state stays in this process).
    A worker that joins the running job, rank 0 included, waits here for the keeper's values of its start clock.
    A resumed job, and a job that went back to a checkpoint (a lost server without backups), take the
    checkpoint's values of the step before its clock and that step's mean gradient: a resumed worker's first
    block runs on that step's data and ends with that mean in .grad, so the script's optimizer makes the
    checkpoint's step again, exactly (a checkpoint from a run without the announced cuts may lack them:
    UNAVAILABLE then names the clocks there are). Make the schedule after this call with last_epoch=model.clock - 1, so that a restarted worker's
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
    model._state_every = int(state_every) if state_every is not None else 0 if model._sync else 1
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    if model._state_every > 0 or model._sync:  # SYNC: the keeper also saves for a worker that joins
        model._optimizer_state = _OptimizerState(optimizer, model, "all" if model._sync else f"rank{model.rank}",
                                                 values=model._sync)
        if model._joining:
            model._exchange.take_kept_values()
        elif model.clock > 0 and model._optimizer_state.restore():
            print(f"tessera: worker {model.rank}: the optimizer's state continues from the servers' copy at clock "
                  f"{model.clock}", flush=True)
    step = optimizer.step

    def distributed_step(self, *args, **kwargs):
        if model._current is not None:
            raise Error("FAILED_PRECONDITION: optimizer.step() inside a step block: call it after the block, once "
                        "the block's gradients are complete")
        result = step(*args, **kwargs)
        model._exchange.after_optimizer_step()
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
