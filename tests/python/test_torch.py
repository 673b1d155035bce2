"""tessera.torch: a PyTorch model trained through real servers equals the same model trained in one process."""

import pytest

from conftest import run_workers

torch = pytest.importorskip("torch", reason="Debian's python3-torch is not installed")
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

STEPS = 50
GLOBAL_BATCH = 8
LR, MOMENTUM = 0.1, 0.9


def make_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, GLOBAL_BATCH, 8, generator=g), torch.randint(0, 3, (STEPS, GLOBAL_BATCH), generator=g)


def local_run():
    """The reference: one process, the union batch, torch's own SGD with momentum."""
    net = make_net()
    x, y = data()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[s]), y[s]).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("workers", [1, 2])
def test_sync_training_equals_one_process_on_the_union_batch(start_cluster, workers):
    torch.set_num_threads(1)
    share = GLOBAL_BATCH // workers
    cluster = start_cluster(mode="SYNC", servers=2, workers=workers, lr=LR, momentum=MOMENTUM, chunk_bytes=256,
                            batch_size=share)
    x, y = data()
    final = {}
    nets = [make_net() for _ in range(workers)]  # here: torch's seed is the process's, not a thread's

    def worker(rank):
        job = tt.init(scheduler=cluster.address, rank=rank)
        net = nets[rank]
        if rank > 0:
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(1.0)  # other ranks start elsewhere: rank 0's values must win
        model = tt.DistributedModel(net, job)
        for s in range(STEPS):
            xs, ys = x[s][rank * share:(rank + 1) * share], y[s][rank * share:(rank + 1) * share]
            with model.step(batch_size=share) as step:
                torch.nn.functional.cross_entropy(model(xs), ys).backward()
                assert model.gradients_sent == 4, "each gradient leaves as backward finishes it"
            assert step.gate["clock"] == s + 1 and not step.gate["stop"]
        model.done()
        final[rank] = [p.detach().clone() for p in net.parameters()]

    run_workers(workers, worker)
    reference = local_run()
    worst = 0.0
    for rank in range(workers):
        for got, want in zip(final[rank], reference):
            worst = max(worst, (got - want).abs().max().item())
    print(f"largest difference from the one-process run after {STEPS} steps, {workers} worker(s): {worst:.3g}")
    assert worst < 1e-5


def test_a_model_with_a_float64_parameter_is_refused_naming_it(start_cluster):
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1)
    job = tt.init(scheduler=cluster.address)
    net = torch.nn.Linear(2, 2).double()
    with pytest.raises(tessera.Error, match="'weight' is torch.float64; the servers hold float32"):
        tt.DistributedModel(net, job)
    job.client.done()
