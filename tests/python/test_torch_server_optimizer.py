"""The servers' path (the job's optimizer runs on the servers) driven by the script: tt.ServerOptimizer lets the
script's torch.optim.lr_scheduler set each parameter group's learning rate, and model.step(scaler=...) unscales the
gradients before they leave and skips a step with an inf or NaN on every worker alike. Each equals one process
running torch's own optimizer on the union batch."""

import pytest

from conftest import TRANSPORTS, run_workers

torch = pytest.importorskip("torch", reason="Debian's python3-torch is not installed")
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
from test_torch import GLOBAL_BATCH, data, make_net, micro_batches  # noqa: E402
from test_torch_script_optimizer import STEPS, LossScaler, largest_difference, warmup_cosine  # noqa: E402

LR, DECAY, BIAS_LR = 0.01, 0.05, 3.0
# The servers' AdamW: decay on weights only, through the job; the rate is the script's to set.
ADAMW_JOB = f'kind: ADAMW learning_rate: {LR} weight_decay: {DECAY} no_decay: "bias"'


def groups(net, decay=True):
    """Weights at the job's rate, biases at BIAS_LR times it without decay."""
    weights = [p for n, p in net.named_parameters() if "bias" not in n]
    biases = [p for n, p in net.named_parameters() if "bias" in n]
    first = {"params": weights, "weight_decay": DECAY} if decay else {"params": weights}
    return [first, {"params": biases, "lr": LR * BIAS_LR, "weight_decay": 0.0}]


def local_run(steps=STEPS, clip=0.0):
    """The reference: torch.optim.AdamW in the same groups, the same LambdaLR, one process, the union batch
    (with clip_grad_norm_ at `clip` when it is not 0)."""
    net = make_net()
    x, y = data(steps)
    opt = torch.optim.AdamW(groups(net), lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    for s in range(steps):
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(net(x[s]), y[s]).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        schedule.step()
    return [p.detach().clone() for p in net.parameters()]


def train(start_cluster, workers, mode="SYNC", accumulate=micro_batches, overlap=False, extra="", clip=0.0):
    torch.set_num_threads(1)
    share = GLOBAL_BATCH // workers
    cluster = start_cluster(mode=mode, servers=2, workers=workers, chunk_bytes=256, batch_size=share,
                            optimizer=ADAMW_JOB + f" clip_global_norm: {clip}", extra=extra)
    x, y = data(STEPS)
    nets = [make_net() for _ in range(workers)]
    final = {}

    def worker(rank):
        net = nets[rank]
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank), overlap=overlap)
        opt = tt.ServerOptimizer(model, groups(net))
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
        for s in range(STEPS):
            xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
            opt.zero_grad()
            with model.step(batch_size=share):
                accumulate(model, xs, ys)
            opt.step()
            schedule.step()
        model.done()
        final[rank] = [p.detach().clone() for p in net.parameters()]

    run_workers(workers, worker)
    return final


@pytest.mark.parametrize("workers,mode", [(1, "SYNC"), (2, "SYNC"), (1, "ASYNC")], ids=["sync1", "sync2", "async1"])
def test_the_scripts_schedule_and_group_rates_drive_the_servers_adamw_as_torch(start_cluster, workers, mode):
    final = train(start_cluster, workers, mode)
    worst = largest_difference(final, local_run())
    print(f"largest difference from torch.optim.AdamW (two groups, their own rates) + LambdaLR after {STEPS} "
          f"steps, {workers} worker(s), {mode}, two micro-batches: {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_scripts_schedule_drives_the_servers_over_each_transport(start_cluster, transport):
    final = train(start_cluster, 2, accumulate=lambda m, x, y: micro_batches(m, x, y, no_sync=True), overlap=True,
                  extra=TRANSPORTS[transport])
    worst = largest_difference(final, local_run())
    print(f"largest difference from one process after {STEPS} SYNC steps over {transport}, the script's "
          f"schedule: {worst:.3g}")
    assert worst < 1e-5


CLIP = 0.2  # below the gradient's norm on most steps of this run: the clipping shows


@pytest.mark.parametrize("workers,mode", [(1, "SYNC"), (2, "SYNC"), (1, "ASYNC")], ids=["sync1", "sync2", "async1"])
def test_the_jobs_global_norm_clipping_is_torchs_clip_grad_norm_on_the_union_batch(start_cluster, workers, mode):
    """optimizer.clip_global_norm with the script's schedule and group rates, two micro-batches: the servers'
    AdamW steps on the round's mean gradient clipped by its norm over every chunk of both servers."""
    final = train(start_cluster, workers, mode, clip=CLIP)
    worst = largest_difference(final, local_run(clip=CLIP))
    unclipped = largest_difference(final, local_run())
    print(f"largest difference from torch.optim.AdamW + LambdaLR + clip_grad_norm_({CLIP}) after {STEPS} steps, "
          f"{workers} worker(s), {mode}: {worst:.3g} (from the run without clipping: {unclipped:.3g})")
    assert worst < 1e-5
    assert unclipped > 1e-3, "the clipping changed nothing: CLIP is too large for this test"


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_jobs_clipping_holds_over_each_transport_with_overlap_and_no_sync(start_cluster, transport):
    final = train(start_cluster, 2, accumulate=lambda m, x, y: micro_batches(m, x, y, no_sync=True), overlap=True,
                  extra=TRANSPORTS[transport], clip=CLIP)
    worst = largest_difference(final, local_run(clip=CLIP))
    print(f"largest difference from one process with clip_grad_norm_({CLIP}) after {STEPS} SYNC steps over "
          f"{transport}: {worst:.3g}")
    assert worst < 1e-5


def test_a_group_setting_the_servers_cannot_honour_is_refused_naming_it(start_cluster):
    cluster = start_cluster(mode="SYNC", servers=1, workers=1, optimizer=ADAMW_JOB)
    net = make_net()
    model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=0))
    weights = [p for n, p in net.named_parameters() if "bias" not in n]
    biases = [p for n, p in net.named_parameters() if "bias" in n]
    with pytest.raises(tessera.Error, match="weight decay 0.0, the job 0.05"):
        tt.ServerOptimizer(model, [{"params": weights, "weight_decay": 0.0}, {"params": biases}])
    with pytest.raises(tessera.Error, match="sets betas"):
        tt.ServerOptimizer(model, [{"params": weights, "betas": (0.8, 0.9)}, {"params": biases}])
    with pytest.raises(tessera.Error, match="in no parameter group"):
        tt.ServerOptimizer(model, [{"params": weights}])
    tt.ServerOptimizer(model, groups(net, decay=False))  # what the job gives each parameter: taken
    model.done()


def test_a_job_with_its_own_schedule_or_the_scripts_optimizer_refuses_a_server_optimizer(start_cluster):
    cluster = start_cluster(mode="SYNC", servers=1, workers=1,
                            optimizer=ADAMW_JOB + " schedule { kind: COSINE warmup_steps: 5 }")
    model = tt.DistributedModel(make_net(), tt.init(scheduler=cluster.address, rank=0))
    with pytest.raises(tessera.Error, match="schedules its own learning rate"):
        tt.ServerOptimizer(model)
    model.done()


BAD_STEP = 7  # the step at which rank 1's loss is infinite


def test_a_scaler_unscales_and_skips_a_step_with_an_inf_on_every_worker_alike(start_cluster):
    """SYNC, the servers' SGD: gradients leave divided by the scale; at one step rank 1's loss is infinite, the
    servers apply no round for anyone, both blocks say skipped, both scales back off alike, and the values equal
    one process whose scaler skipped that step."""
    torch.set_num_threads(1)
    steps, share, lr, momentum = 30, GLOBAL_BATCH // 2, 0.1, 0.9
    cluster = start_cluster(mode="SYNC", servers=2, workers=2, chunk_bytes=256, batch_size=share, lr=lr,
                            momentum=momentum)
    x, y = data(steps)
    nets = [make_net() for _ in range(2)]
    final, skipped, scales = {}, {}, {}

    def loss_at(net, xs, ys, s, bad):
        loss = torch.nn.functional.cross_entropy(net(xs), ys)
        return loss * float("inf") if bad and s == BAD_STEP else loss

    def worker(rank):
        net = nets[rank]
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank), overlap=True)
        scaler = LossScaler(growth_interval=10)
        skipped[rank] = []
        for s in range(steps):
            xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
            with model.step(batch_size=share, scaler=scaler) as step:
                scaler.scale(loss_at(model, xs, ys, s, rank == 1)).backward()
            if step.skipped:
                skipped[rank].append(s)
        model.done()
        final[rank], scales[rank] = [p.detach().clone() for p in net.parameters()], scaler.get_scale()

    run_workers(2, worker)
    net = make_net()
    opt, scaler = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum), LossScaler(growth_interval=10)
    for s in range(steps):
        opt.zero_grad()
        scaler.scale(loss_at(net, x[s], y[s], s, True)).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    assert skipped == {0: [BAD_STEP], 1: [BAD_STEP]} and scaler.skipped == 1
    assert scales[0] == scales[1] == scaler.get_scale() == 1024.0 / 2 * 2 ** 2  # backed off once, grew twice
    worst = largest_difference(final, [p.detach() for p in net.parameters()])
    print(f"largest difference from one process with the same scaler, step {BAD_STEP} skipped: {worst:.3g}")
    assert worst < 1e-5


def test_a_scaler_in_async_skips_only_its_own_step(start_cluster):
    torch.set_num_threads(1)
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1, chunk_bytes=256, batch_size=GLOBAL_BATCH, lr=0.1)
    x, y = data(3)
    net = make_net()
    model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=0))
    scaler = LossScaler()
    before = [p.detach().clone() for p in net.parameters()]
    with model.step(batch_size=GLOBAL_BATCH, scaler=scaler) as step:
        (torch.nn.functional.cross_entropy(model(x[0]), y[0]) * float("nan")).backward()
    model.settle()
    assert step.skipped and scaler.get_scale() == 512.0
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    with model.step(batch_size=GLOBAL_BATCH, scaler=scaler) as step:
        scaler.scale(torch.nn.functional.cross_entropy(model(x[1]), y[1])).backward()
    model.settle()
    assert not step.skipped and not all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    model.done()


def autocast_run(start_cluster, workers, steps=50):
    """The servers' SGD with momentum; each worker's forward under torch.autocast in bfloat16 on float32
    parameters (the servers hold float32 master values). Returns the workers' final values, and those of one
    process that computes each worker's half of the batch under autocast and averages them (what the workers
    compute) and of one process on the union batch."""
    torch.set_num_threads(1)
    share, lr, momentum = GLOBAL_BATCH // workers, 0.1, 0.9
    cluster = start_cluster(mode="SYNC", servers=2, workers=workers, chunk_bytes=256, batch_size=share, lr=lr,
                            momentum=momentum)
    x, y = data(steps)
    nets = [make_net() for _ in range(workers)]
    final = {}

    def loss_of(net, xs, ys):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(xs)
        assert out.dtype == torch.bfloat16
        return torch.nn.functional.cross_entropy(out.float(), ys)

    def worker(rank):
        net = nets[rank]
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        for s in range(steps):
            xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
            with model.step(batch_size=share):
                loss_of(model, xs, ys).backward()
        model.done()
        final[rank] = [p.detach().clone() for p in net.parameters()]

    run_workers(workers, worker)
    references = []
    for parts in (workers, 1):
        net = make_net()
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
        size = GLOBAL_BATCH // parts
        for s in range(steps):
            opt.zero_grad()
            for k in range(parts):
                (loss_of(net, x[s][k * size:(k + 1) * size], y[s][k * size:(k + 1) * size]) / parts).backward()
            opt.step()
        references.append([p.detach() for p in net.parameters()])
    assert all(p.dtype == torch.float32 for params in final.values() for p in params)
    return final, references[0], references[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_autocast_bf16_trains_as_one_process_over_the_same_slices(start_cluster, workers):
    """bfloat16 rounds each worker's forward on its own slice; the exchange adds nothing to that: the workers
    equal one process that computes the same slices under autocast. Against one process on the union batch the
    rounding of the slices shows (printed, not asserted: it is autocast's, not the exchange's)."""
    final, same_slices, union = autocast_run(start_cluster, workers)
    worst = largest_difference(final, same_slices)
    print(f"bf16 autocast, {workers} worker(s), 50 steps: largest difference from one process over the same slices "
          f"{worst:.3g}, from one process on the union batch {largest_difference(final, union):.3g}")
    assert worst < 1e-5


def test_a_rate_of_zero_leaves_the_values_and_a_negative_one_is_refused(start_cluster):
    """A schedule that reaches 0 (a warmup from 0, a cosine to eta_min=0) means no step, not the job's rate."""
    torch.set_num_threads(1)
    cluster = start_cluster(mode="SYNC", servers=2, workers=1, chunk_bytes=256, batch_size=GLOBAL_BATCH, lr=0.1)
    x, y = data(3)
    net = make_net()
    model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=0))
    opt = tt.ServerOptimizer(model)
    opt.param_groups[0]["lr"] = 0.0
    before = [p.detach().clone() for p in net.parameters()]
    with model.step(batch_size=GLOBAL_BATCH):
        torch.nn.functional.cross_entropy(model(x[0]), y[0]).backward()
    model.settle()
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    opt.param_groups[0]["lr"] = -0.1
    with pytest.raises(tessera.Error, match="learning rate -0.1"):
        with model.step(batch_size=GLOBAL_BATCH):
            pass
    opt.param_groups[0]["lr"] = 0.1
    with model.step(batch_size=GLOBAL_BATCH):  # the refused step left no block open
        torch.nn.functional.cross_entropy(model(x[1]), y[1]).backward()
    model.settle()
    assert not all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    model.done()
