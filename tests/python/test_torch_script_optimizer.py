"""tessera.torch.DistributedOptimizer: the script's own torch.optim optimizer, schedule and clipping over servers
that only combine (optimizer { kind: SCRIPT }). SYNC equals one process on the union batch; ASYNC with one worker
equals one process; ASYNC and SSP with two workers train; a worker whose values drift fails the job."""

import math
import time

import pytest

from conftest import TRANSPORTS, run_workers

torch = pytest.importorskip("torch", reason="Debian's python3-torch is not installed")
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
from test_torch import GLOBAL_BATCH, data, make_net, micro_batches, one_backward  # noqa: E402

STEPS = 100
LR, WARMUP, MIN_FACTOR, DECAY, CLIP = 0.01, 10, 0.1, 0.05, 0.5


def warmup_cosine(step):
    if step < WARMUP:
        return (step + 1) / WARMUP
    done = min(1.0, (step - WARMUP) / (STEPS - WARMUP))
    return MIN_FACTOR + (1 - MIN_FACTOR) * 0.5 * (1 + math.cos(math.pi * done))


def adamw_recipe(net, lr=LR):
    """AdamW in two parameter groups (no decay on biases) and a warmup-then-cosine LambdaLR."""
    decay = [p for n, p in net.named_parameters() if "bias" not in n]
    rest = [p for n, p in net.named_parameters() if "bias" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": DECAY}, {"params": rest, "weight_decay": 0.0}], lr=lr)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)


def local_run(steps=STEPS):
    """The reference: one process, the union batch, the same optimizer, schedule and clipping."""
    net = make_net()
    x, y = data(steps)
    opt, schedule = adamw_recipe(net)
    for s in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[s]), y[s]).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        opt.step()
        schedule.step()
    return [p.detach().clone() for p in net.parameters()]


def learnable_data(steps):
    """Examples whose class is the argmax of a fixed linear map of them: a loss that training lowers."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(steps, GLOBAL_BATCH, 8, generator=g)
    return x, (x @ torch.randn(8, 3, generator=g)).argmax(-1)


def train(start_cluster, workers, mode, accumulate=micro_batches, overlap=False, steps=STEPS, lr_of_rank=None,
          consistency="", examples=data, extra=""):
    """Trains make_net() with the AdamW recipe through `workers` workers; returns their final parameters and the
    per-rank losses of the first and last steps."""
    torch.set_num_threads(1)
    share = GLOBAL_BATCH // workers
    cluster = start_cluster(mode=mode, servers=2, workers=workers, chunk_bytes=256, batch_size=share,
                            optimizer="kind: SCRIPT", consistency=consistency, extra=extra)
    x, y = examples(steps)
    nets = [make_net() for _ in range(workers)]
    final, losses = {}, {}

    def worker(rank):
        job = tt.init(scheduler=cluster.address, rank=rank)
        net = nets[rank]
        model = tt.DistributedModel(net, job, overlap=overlap)
        lr = LR if lr_of_rank is None else lr_of_rank(rank)
        opt, schedule = adamw_recipe(net, lr)
        opt = tt.DistributedOptimizer(opt, model, check_every=10)
        seen = []
        for s in range(steps):
            xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
            opt.zero_grad()
            with model.step(batch_size=share):
                accumulate(model, xs, ys)
            with torch.no_grad():
                seen.append(torch.nn.functional.cross_entropy(net(x[s]), y[s]).item())
            torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            opt.step()
            schedule.step()
        model.done()
        final[rank] = [p.detach().clone() for p in net.parameters()]
        losses[rank] = (sum(seen[:5]) / 5, sum(seen[-5:]) / 5)

    run_workers(workers, worker)
    return final, losses


def largest_difference(final, expected):
    return max((got - want).abs().max().item() for params in final.values() for got, want in zip(params, expected))


@pytest.mark.parametrize("accumulate", ["one_backward", "two_micro_batches", "two_micro_batches_no_sync"])
@pytest.mark.parametrize("workers", [1, 2])
def test_sync_with_the_scripts_adamw_schedule_and_clipping_equals_one_process(start_cluster, workers, accumulate):
    how = {"one_backward": one_backward, "two_micro_batches": micro_batches,
           "two_micro_batches_no_sync": lambda m, x, y: micro_batches(m, x, y, no_sync=True)}[accumulate]
    final, _ = train(start_cluster, workers, "SYNC", accumulate=how, overlap=accumulate.endswith("no_sync"))
    worst = largest_difference(final, local_run())
    print(f"largest difference from torch.optim.AdamW + LambdaLR + clip_grad_norm_ in one process after {STEPS} "
          f"steps, {workers} worker(s), {accumulate}: {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_sync_over_each_transport_equals_one_process(start_cluster, transport):
    final, _ = train(start_cluster, 2, "SYNC", overlap=True,
                     accumulate=lambda m, x, y: micro_batches(m, x, y, no_sync=True), extra=TRANSPORTS[transport])
    worst = largest_difference(final, local_run())
    print(f"largest difference from one process after {STEPS} SYNC steps over {transport}, 2 workers: {worst:.3g}")
    assert worst < 1e-5


# Over wire { gradients: BF16 values: BF16 } each worker's gradient leaves rounded to 8 bits of mantissa (what
# rounding left out follows in the next step's, error feedback) and the round's mean comes back rounded again;
# AdamW's normalised step carries a relative error of up to 2^-8 into every update. After 100 steps of this
# model at lr 0.01 that is at most about 0.03 (measured: 0.0147), against 1e-5 in float32.
BF16_TOLERANCE = 3e-2


def test_sync_over_the_bf16_wire_stays_within_its_tolerance(start_cluster):
    final, _ = train(start_cluster, 2, "SYNC", accumulate=one_backward, extra="wire { gradients: BF16 values: BF16 }")
    worst = largest_difference(final, local_run())
    print(f"largest difference from one process after {STEPS} SYNC steps over the bf16 wire: {worst:.3g}")
    assert worst < BF16_TOLERANCE


def test_async_with_one_worker_equals_one_process(start_cluster):
    final, _ = train(start_cluster, 1, "ASYNC", accumulate=one_backward)
    worst = largest_difference(final, local_run())
    print(f"largest difference from one process after {STEPS} ASYNC steps, 1 worker: {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("mode", ["ASYNC", "SSP"])
def test_async_and_ssp_with_two_workers_lower_the_loss(start_cluster, mode):
    _, losses = train(start_cluster, 2, mode, accumulate=one_backward, lr_of_rank=lambda rank: 0.05,
                          consistency="staleness: 2" if mode == "SSP" else "", examples=learnable_data)
    for rank, (first, last) in losses.items():
        print(f"{mode} rank {rank}: mean loss of the first 5 steps {first:.3f}, of the last 5 {last:.3f}")
        assert last < 0.7 * first


def test_a_worker_whose_values_drift_from_the_keepers_fails_the_job_naming_it(start_cluster):
    with pytest.raises(tessera.Error, match=r"worker 1's parameters differ from worker 0's at clock 10"):
        train(start_cluster, 2, "SYNC", accumulate=one_backward, steps=30,
              lr_of_rank=lambda rank: LR * (1 + rank))


def test_the_scripts_optimizer_needs_a_script_job_and_steps_after_the_block(start_cluster):
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1)
    job = tt.init(scheduler=cluster.address)
    net = make_net()
    model = tt.DistributedModel(net, job)
    with pytest.raises(tessera.Error, match=r"servers run its optimizer \(SGD\).*kind: SCRIPT"):
        tt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), model)
    job.client.done()


def test_a_step_inside_the_block_is_refused(start_cluster):
    cluster = start_cluster(mode="SYNC", servers=1, workers=1, optimizer="kind: SCRIPT")
    job = tt.init(scheduler=cluster.address)
    net = make_net()
    model = tt.DistributedModel(net, job)
    opt = tt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), model)
    x, y = data()
    with pytest.raises(tessera.Error, match=r"optimizer.step\(\) inside a step block"):
        with model.step(batch_size=GLOBAL_BATCH):
            one_backward(model, x[0], y[0])
            opt.step()
    with pytest.raises(tessera.Error, match="the model does not train"):
        tt.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1), model)
    job.client.done()


def restart_setup(start_cluster, mode):
    """A SCRIPT job of 2 workers, 4 examples each; its data, three nets (rank 0, rank 1, rank 1 again) and an event
    for the restarted rank to set."""
    import threading

    torch.set_num_threads(1)
    cluster = start_cluster(mode=mode, servers=2, workers=2, chunk_bytes=256, batch_size=4, optimizer="kind: SCRIPT")
    x, y = learnable_data(40)
    return cluster, x, y, [make_net() for _ in range(3)], threading.Event()


def step_until(model, opt, x, y, rank, until, share=4):
    """Trains from the model's clock up to clock `until`, each step on this rank's slice of x[clock]."""
    while model.clock < until:
        s = model.clock
        xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
        opt.zero_grad()
        with model.step(batch_size=share):
            one_backward(model, xs, ys)
        opt.step()


def test_a_restarted_worker_continues_with_its_optimizers_state(start_cluster):
    """ASYNC: rank 1 steps AdamW 20 times and is lost; a new rank 1 (a fresh model and optimizer, as a restarted
    script makes them) starts at the job's clock with the moments and step count the lost one had."""
    cluster, x, y, nets, rejoined = restart_setup(start_cluster, "ASYNC")
    seen = {}

    def snapshot(opt):
        return {k: {n: v.clone() for n, v in state.items()} for k, state in opt.state_dict()["state"].items()}

    def start(rank):
        net = nets.pop()
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        return net, model, tt.DistributedOptimizer(adamw_recipe(net)[0], model)

    def worker(rank):
        net, model, opt = start(rank)
        if rank == 0:
            step_until(model, opt, x, y, rank, model.clock + 10)
            assert rejoined.wait(120)
            step_until(model, opt, x, y, rank, model.clock + 10)
            model.done()
            return
        step_until(model, opt, x, y, rank, model.clock + 20)
        seen["lost"] = snapshot(opt)
        model.job.client.fail("rank 1 lost (the test's stand-in for a dead process)")
        net, model, opt = start(rank)
        seen["clock"] = model.clock
        seen["restored"] = snapshot(opt)
        rejoined.set()
        step_until(model, opt, x, y, rank, model.clock + 5)
        model.done()

    run_workers(2, worker)
    assert seen["clock"] == 20
    lost, restored = seen["lost"], seen["restored"]
    assert sorted(lost) == sorted(restored) and lost
    for k in lost:
        assert sorted(lost[k]) == sorted(restored[k]) == ["exp_avg", "exp_avg_sq", "step"]
        for name in lost[k]:
            assert torch.equal(lost[k][name], restored[k][name]), (k, name)


@pytest.mark.parametrize("lost", [1, 0], ids=["rank_1_lost", "rank_0_lost"])
@pytest.mark.parametrize("state_every", [1, 0], ids=["saved_every_step", "saved_for_the_joiner_only"])
def test_a_worker_rejoining_a_sync_job_takes_the_keepers_values_and_optimizer_state(start_cluster, state_every, lost):
    """SYNC: one rank makes 10 steps and is lost; the other goes on alone; a new process of the lost rank (a
    fresh model with other values, a fresh optimizer) joins and takes the other's values and AdamW moments of its
    start clock (saved every step, or only at the clock the scheduler names for the joiner). Rank 0 is no
    exception: while it is away rank 1 keeps the values. From there both make the same steps, and end with the
    same values and moments, bit for bit (the digest check agrees)."""
    cluster, x, y, nets, registered = restart_setup(start_cluster, "SYNC")
    seen = {}
    with torch.no_grad():
        for p in nets[0].parameters():
            p.add_(1.0)  # the new process starts elsewhere: only the keeper's values may make it equal

    def optimizer(net, model):
        return tt.DistributedOptimizer(adamw_recipe(net)[0], model, check_every=5, state_every=state_every)

    def state(opt, net):
        moments = {k: {n: v.clone() for n, v in s.items()} for k, s in opt.state_dict()["state"].items()}
        return [p.detach().clone() for p in net.parameters()], moments

    def worker(rank):
        net = nets.pop()
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        opt = optimizer(net, model)
        step_until(model, opt, x, y, rank, 10)
        if rank != lost:
            assert registered.wait(120)
            step_until(model, opt, x, y, rank, 30)
        else:
            model.job.client.fail(f"rank {rank} lost (the test's stand-in for a dead process)")
            net = nets.pop()
            model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
            seen["clock"] = model.clock
            registered.set()
            opt = optimizer(net, model)  # waits for the keeper's values and moments of its clock
            step_until(model, opt, x, y, rank, 30)
        model.done()
        seen[rank] = state(opt, net)

    run_workers(2, worker)
    assert seen["clock"] == 11
    (values0, moments0), (values1, moments1) = seen[0], seen[1]
    assert all(torch.equal(a, b) for a, b in zip(values0, values1))
    assert sorted(moments0) == sorted(moments1) and moments0
    for k in moments0:
        for name in moments0[k]:
            assert torch.equal(moments0[k][name], moments1[k][name]), (k, name)


def test_the_keeper_uploads_its_values_only_for_a_checkpoints_cut(start_cluster, tmp_path):
    """SYNC with the script's optimizer and checkpoints every 10 clocks: the keeper sends its values and the
    optimizer's state at the start of the step before each cut the scheduler announces, not at every step; the
    other worker never sends them; and each checkpoint holds the keeper's values of the clock before its own."""
    share = GLOBAL_BATCH // 2
    checkpoints = tmp_path / "checkpoints"
    cluster = start_cluster(mode="SYNC", servers=1, workers=2, batch_size=share, optimizer="kind: SCRIPT",
                            extra=f'checkpoint {{ dir: "{checkpoints}" every_steps: 10 }}')
    x, y = data(STEPS)
    saved = {0: [], 1: []}

    def worker(rank):
        net = make_net()
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        opt = tt.DistributedOptimizer(adamw_recipe(net)[0], model)
        save = model._optimizer_state.save

        def counted(clock, values=False):
            saved[rank].append(clock)
            return save(clock, values)

        model._optimizer_state.save = counted
        while model.clock < STEPS:
            s = model.clock
            opt.zero_grad()
            with model.step(batch_size=share):
                one_backward(model, x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share])
            opt.step()
        model.done()

    run_workers(2, worker)
    taken = len(list(checkpoints.glob("ckpt-*/scheduler.state")))
    print(f"keeper's uploads at clocks {saved[0]}; {taken} checkpoints")
    assert taken >= 1
    assert saved[1] == []
    assert 1 <= len(saved[0]) <= STEPS // 10 + 1, saved[0]
    assert len(set(saved[0])) == len(saved[0])


def test_a_sync_rollback_replays_the_checkpoints_step_and_ends_as_one_process(start_cluster, tmp_path):
    """SYNC, 2 servers without backups, checkpoints every 10 clocks: at clock 35 (or once a checkpoint is complete)
    a server is killed; the job goes back to the last checkpoint. Each worker's block ends with the checkpoint's values, AdamW moments and rate of
    the step before its clock and that step's mean gradient in .grad; the script's own clipping and optimizer step
    make that step again, its LambdaLR goes back to the checkpoint's clock, and the run ends equal to one process
    that was never interrupted (AdamW, warmup-cosine, clip_grad_norm_)."""
    torch.set_num_threads(1)
    share = GLOBAL_BATCH // 2
    cluster = start_cluster(mode="SYNC", servers=2, workers=2, chunk_bytes=256, batch_size=share,
                            optimizer="kind: SCRIPT",
                            extra=f'checkpoint {{ dir: "{tmp_path / "checkpoints"}" every_steps: 10 }}',
                            scheduler_flags=["--heartbeat_timeout_ms=1500"])
    x, y = data(STEPS)
    nets = [make_net() for _ in range(2)]
    final, rolled_back, killed = {}, {}, []
    complete = tmp_path / "checkpoints"  # a checkpoint's folder is complete once its scheduler.state is written

    def worker(rank):
        net = nets[rank]
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        opt, schedule = adamw_recipe(net)
        opt = tt.DistributedOptimizer(opt, model, check_every=10)
        while model.clock < STEPS:
            s = model.clock
            opt.zero_grad()
            with model.step(batch_size=share) as step:
                one_backward(model, x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share])
            rolled_back[rank] = rolled_back.get(rank, False) or bool(step.gate.get("rolled_back"))
            torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            opt.step()
            schedule.step()
            if rank == 0 and model.clock >= 35 and not killed:
                if any(complete.glob("ckpt-*/scheduler.state")):
                    cluster.processes[2].kill()  # server 1, without a backup: its chunks come from the checkpoint
                    killed.append(model.clock)
                else:
                    time.sleep(0.05)  # the steps outran the checkpoints' cadence: give the scheduler time
        model.done()
        final[rank] = [p.detach().clone() for p in net.parameters()]

    run_workers(2, worker)
    assert killed, "no checkpoint was complete before the last step"
    assert rolled_back == {0: True, 1: True}
    worst = largest_difference(final, local_run())
    print(f"largest difference from one uninterrupted process after a rollback: {worst:.3g}")
    assert worst < 1e-5


class LossScaler:
    """What a step relies on of torch.cuda.amp.GradScaler, which turns itself off without CUDA: the loss is
    multiplied by the scale; unscale_ divides every .grad by it and notes an inf or NaN; step() then skips the
    optimizer's step; update() halves the scale after such a step and doubles it after growth_interval steps
    without one, or takes update(new_scale); and GradScaler's getters."""

    def __init__(self, scale=1024.0, growth_interval=2000):
        self.scale_value, self.found_inf, self.skipped = scale, False, 0
        self.growth_interval, self.good_steps = growth_interval, 0

    def is_enabled(self):
        return True

    def get_scale(self):
        return self.scale_value

    def get_backoff_factor(self):
        return 0.5

    def get_growth_factor(self):
        return 2.0

    def get_growth_interval(self):
        return self.growth_interval

    def scale(self, loss):
        return loss * self.scale_value

    def unscale_(self, opt):
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(self.scale_value)
                    self.found_inf |= not bool(torch.isfinite(p.grad).all())

    def step(self, opt):
        if self.found_inf:
            self.skipped += 1
        else:
            opt.step()

    def update(self, new_scale=None):
        if new_scale is not None:
            self.scale_value = new_scale
        elif self.found_inf:
            self.scale_value *= self.get_backoff_factor()
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.get_growth_factor()
                self.good_steps = 0
        self.found_inf = False


BAD_STEP = 7  # the step at which one worker's loss is infinite


def test_a_gradient_scaler_skips_a_step_with_an_inf_on_every_worker_alike(start_cluster):
    """SYNC: rank 1's loss is infinite at one step; every worker's scaler sees the round's mean as not finite and
    skips that step, as one process's scaler skips it on the union batch, and they go on equal to it."""
    torch.set_num_threads(1)
    steps, share = 30, GLOBAL_BATCH // 2
    cluster = start_cluster(mode="SYNC", servers=2, workers=2, chunk_bytes=256, batch_size=share,
                            optimizer="kind: SCRIPT")
    x, y = data(steps)
    final, skipped = {}, {}
    nets = [make_net() for _ in range(2)]  # here: torch's seed is the process's, not a thread's

    def loss_at(net, xs, ys, s, bad):
        loss = torch.nn.functional.cross_entropy(net(xs), ys)
        return loss * float("inf") if bad and s == BAD_STEP else loss

    def worker(rank):
        net = nets[rank]
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        opt = tt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), model, check_every=5)
        scaler = LossScaler()
        for s in range(steps):
            xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
            opt.zero_grad()
            with model.step(batch_size=share):
                scaler.scale(loss_at(model, xs, ys, s, rank == 1)).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        model.done()
        final[rank], skipped[rank] = [p.detach().clone() for p in net.parameters()], scaler.skipped

    run_workers(2, worker)
    net = make_net()
    opt, scaler = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), LossScaler()
    for s in range(steps):
        opt.zero_grad()
        scaler.scale(loss_at(net, x[s], y[s], s, True)).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    assert skipped == {0: 1, 1: 1} and scaler.skipped == 1
    worst = largest_difference(final, [p.detach() for p in net.parameters()])
    print(f"largest difference from one process with the same scaler, a step skipped: {worst:.3g}")
    assert worst < 1e-5


def test_a_job_that_stops_at_max_steps_makes_every_optimizer_step(start_cluster):
    """The round that reaches stop.max_steps still brings its mean gradient: the script's optimizer makes its last
    step (the loop ends on the sampler, as a real script's does)."""
    torch.set_num_threads(1)
    steps, share = 12, GLOBAL_BATCH // 2
    cluster = start_cluster(mode="SYNC", servers=2, workers=2, chunk_bytes=256, batch_size=share, max_steps=steps,
                            optimizer="kind: SCRIPT")
    x, y = data(steps)
    final = {}
    nets = [make_net() for _ in range(2)]

    def worker(rank):
        net = nets[rank]
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        opt, schedule = adamw_recipe(net)
        opt = tt.DistributedOptimizer(opt, model)
        while not model.stopped:
            s = model.clock
            opt.zero_grad()
            with model.step(batch_size=share):
                one_backward(model, x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share])
            torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            opt.step()
            schedule.step()
        model.done()
        final[rank] = [p.detach().clone() for p in net.parameters()]

    run_workers(2, worker)
    worst = largest_difference(final, local_run(steps))
    print(f"largest difference from one process after a job of {steps} steps: {worst:.3g}")
    assert worst < 1e-5
