"""tessera.torch: a PyTorch model trained through real servers equals the same model trained in one process, for
the ways a step block may accumulate gradients; edits the servers' optimizer cannot honour raise."""

import pytest

from conftest import TRANSPORTS, run_workers, seeded

torch = pytest.importorskip("torch", reason="Debian's python3-torch is not installed")
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

STEPS = 50
GLOBAL_BATCH = 8
LR, MOMENTUM = 0.1, 0.9


class BranchyNet(torch.nn.Module):
    """A head used on even steps only (the other steps leave its parameters without a gradient)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        self.extra = torch.nn.Linear(8, 3)
        self.use_extra = True

    def forward(self, x):
        out = self.body(x)
        return out + self.extra(x) if self.use_extra else out


class ParentReadsChildNet(torch.nn.Module):
    """The head's parameters read by the parent's forward (F.linear on self.head.weight), never by a forward of
    the head itself."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return torch.nn.functional.linear(self.body(x), self.head.weight, self.head.bias)


NETS = {"branchy": BranchyNet, "parent_reads_child": ParentReadsChildNet}


def make_net(kind=None):
    with seeded(0):
        if kind is not None:
            return NETS[kind]()
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def data(steps=STEPS):
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, GLOBAL_BATCH, 8, generator=g), torch.randint(0, 3, (steps, GLOBAL_BATCH), generator=g)


def sgd(net):
    return torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM), None


def local_run(kind=None, recipe=sgd):
    """The reference: one process, the union batch, torch's own optimizer (SGD with momentum by default;
    gradients zeroed, not set to None, as a step block leaves a parameter no backward reached) and schedule."""
    net = make_net(kind)
    x, y = data()
    opt, schedule = recipe(net)
    for s in range(STEPS):
        opt.zero_grad(set_to_none=False)
        if kind == "branchy":
            net.use_extra = s % 2 == 0
        torch.nn.functional.cross_entropy(net(x[s]), y[s]).backward()
        opt.step()
        if schedule is not None:
            schedule.step()
    return [p.detach().clone() for p in net.parameters()]


# The servers' AdamW with decay on weights only, warmup then cosine, against torch.optim.AdamW in two parameter
# groups driven by a LambdaLR of the same schedule.
ADAMW_LR, DECAY, WARMUP, MIN_FACTOR = 0.01, 0.05, 5, 0.1
ADAMW_JOB = (f"kind: ADAMW learning_rate: {ADAMW_LR} weight_decay: {DECAY} no_decay: \"bias\" "
             f"schedule {{ kind: COSINE warmup_steps: {WARMUP} total_steps: {STEPS} min_factor: {MIN_FACTOR} }}")


def warmup_cosine(step):
    import math

    if step < WARMUP:
        return (step + 1) / WARMUP
    done = min(1.0, (step - WARMUP) / (STEPS - WARMUP))
    return MIN_FACTOR + (1 - MIN_FACTOR) * 0.5 * (1 + math.cos(math.pi * done))


def adamw(net):
    decay = [p for n, p in net.named_parameters() if "bias" not in n]
    rest = [p for n, p in net.named_parameters() if "bias" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": DECAY}, {"params": rest, "weight_decay": 0.0}],
                            lr=ADAMW_LR)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)


def one_backward(model, xs, ys):
    torch.nn.functional.cross_entropy(model(xs), ys).backward()


def micro_batches(model, xs, ys, no_sync=False):
    """Two backward calls, each on half the slice (the loss halved: the sum is the slice's mean gradient)."""
    half = len(xs) // 2
    with model.no_sync() if no_sync else _nothing():
        (torch.nn.functional.cross_entropy(model(xs[:half]), ys[:half]) / 2).backward()
    (torch.nn.functional.cross_entropy(model(xs[half:]), ys[half:]) / 2).backward()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *unused):
        return False


RECIPES = {
    # name: (how a step's gradients are made, overlap, gradients sent inside the block after it)
    "one_backward": (one_backward, False, 0),
    "one_backward_overlapped": (one_backward, True, 4),
    "two_micro_batches": (micro_batches, False, 0),
    "two_micro_batches_no_sync_overlapped": (lambda m, x, y: micro_batches(m, x, y, no_sync=True), True, 4),
    "two_micro_batches_no_sync": (lambda m, x, y: micro_batches(m, x, y, no_sync=True), False, 0),
}


def train_through_servers(start_cluster, workers, recipe, kind=None, overlap=False, sent_inside=None,
                          optimizer=None, reference=sgd, extra=""):
    torch.set_num_threads(1)
    share = GLOBAL_BATCH // workers
    cluster = start_cluster(mode="SYNC", servers=2, workers=workers, lr=LR, momentum=MOMENTUM, chunk_bytes=256,
                            batch_size=share, optimizer=optimizer, extra=extra)
    x, y = data()
    final = {}
    nets = [make_net(kind) for _ in range(workers)]  # here: torch's seed is the process's, not a thread's

    def worker(rank):
        job = tt.init(scheduler=cluster.address, rank=rank)
        net = nets[rank]
        if rank > 0:
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(1.0)  # other ranks start elsewhere: rank 0's values must win
        model = tt.DistributedModel(net, job, overlap=overlap)
        for s in range(STEPS):
            xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
            if kind == "branchy":
                net.use_extra = s % 2 == 0
            with model.step(batch_size=share) as step:
                recipe(model, xs, ys)
                if sent_inside is not None:
                    assert model.gradients_sent == sent_inside
            assert step.gate["clock"] == s + 1 and not step.gate["stop"]
        model.done()
        final[rank] = [p.detach().clone() for p in net.parameters()]

    run_workers(workers, worker)
    expected = local_run(kind, reference)
    worst = 0.0
    for rank in range(workers):
        for got, want in zip(final[rank], expected):
            worst = max(worst, (got - want).abs().max().item())
    return worst


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("workers", [1, 2])
def test_sync_training_equals_one_process_on_the_union_batch(start_cluster, workers, recipe):
    make, overlap, sent_inside = RECIPES[recipe]
    worst = train_through_servers(start_cluster, workers, make, overlap=overlap, sent_inside=sent_inside)
    print(f"largest difference from the one-process run after {STEPS} steps, {workers} worker(s), {recipe}: "
          f"{worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("workers", [1, 2])
def test_the_servers_adamw_with_a_no_decay_group_and_warmup_cosine_equals_torch(start_cluster, workers):
    worst = train_through_servers(start_cluster, workers, micro_batches, optimizer=ADAMW_JOB, reference=adamw)
    print(f"largest difference from torch.optim.AdamW + LambdaLR after {STEPS} steps, {workers} worker(s), two "
          f"micro-batches: {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_servers_adamw_equals_torch_over_each_transport(start_cluster, transport):
    worst = train_through_servers(start_cluster, 2, lambda m, x, y: micro_batches(m, x, y, no_sync=True),
                                  overlap=True, optimizer=ADAMW_JOB, reference=adamw, extra=TRANSPORTS[transport])
    print(f"largest difference from torch.optim.AdamW + LambdaLR after {STEPS} steps over {transport}: {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("overlap", [False, True], ids=["at_the_end", "overlapped"])
def test_parameters_an_unused_branch_leaves_without_gradient_train_as_torch_with_zeroed_gradients(
        start_cluster, overlap):
    worst = train_through_servers(start_cluster, 2, one_backward, kind="branchy", overlap=overlap)
    print(f"largest difference from the one-process run, a head used every other step: {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("overlap", [False, True], ids=["at_the_end", "overlapped"])
def test_parameters_read_outside_a_forward_of_their_module_train_as_torch(start_cluster, overlap):
    worst = train_through_servers(start_cluster, 2, one_backward, kind="parent_reads_child", overlap=overlap)
    print(f"largest difference from the one-process run, a head read by its parent: {worst:.3g}")
    assert worst < 1e-5


def one_worker_model(start_cluster, overlap):
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1, lr=LR)
    job = tt.init(scheduler=cluster.address)
    return job, tt.DistributedModel(make_net(), job, overlap=overlap)


def pulled(job, model):
    import numpy as np

    values = [np.zeros(v.shape, np.float32) for v in model._values]
    job.client.pull(model.names, values)
    return values


@pytest.mark.parametrize("edit", ["clip_grad_norm_", "scale_in_place", "new_grad"])
def test_an_edit_after_backward_raises_before_anything_of_the_step_leaves(start_cluster, edit):
    job, model = one_worker_model(start_cluster, overlap=False)
    x, y = data()
    before = pulled(job, model)
    with pytest.raises(tessera.Error, match=r"was changed after backward .*nothing of this step was sent"):
        with model.step(batch_size=GLOBAL_BATCH):
            one_backward(model, x[0], y[0])
            p = next(model.module.parameters())
            if edit == "clip_grad_norm_":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            elif edit == "scale_in_place":
                p.grad.mul_(0.5)
            else:
                p.grad = p.grad * 0.5
    for a, b in zip(before, pulled(job, model)):
        assert (a == b).all(), "a refused step changed the servers' values"
    job.client.done()


def test_a_second_backward_outside_no_sync_with_overlap_raises_naming_the_parameter(start_cluster):
    job, model = one_worker_model(start_cluster, overlap=True)
    x, y = data()
    with pytest.raises(tessera.Error, match=r"a second backward\(\) outside no_sync\(\) reached [02]\.(weight|bias)"):
        with model.step(batch_size=GLOBAL_BATCH):
            micro_batches(model, x[0], y[0])
    job.client.done()


def test_a_model_with_a_float64_parameter_is_refused_naming_it(start_cluster):
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1)
    job = tt.init(scheduler=cluster.address)
    net = torch.nn.Linear(2, 2).double()
    with pytest.raises(tessera.Error, match="'weight' is torch.float64; the servers hold float32"):
        tt.DistributedModel(net, job)
    job.client.done()
