"""A PyTorch model trained through Tessera's servers: the smallest complete worker script. The launcher runs it
once per worker, in the manner of torchrun:

    build/bin/tessera-launch --job=deploy/jobs/python_mlp_synthetic.pbtxt --linger_s=0 -- \\
        python3 worker/python/examples/mlp_synthetic.py

The data is a seeded synthetic problem (4 Gaussian clusters in 32 dimensions), so the script needs no files:
worker r takes the r-th slice of every step's global batch. Rank 0 scores the final model on held-out examples
and reports it, which the summary and metrics.jsonl record.
"""

import torch

import tessera.torch as tt

FEATURES, CLASSES = 32, 4


def examples(generator, count, centers):
    labels = torch.randint(0, CLASSES, (count,), generator=generator)
    return centers[labels] + torch.randn(count, FEATURES, generator=generator), labels


def main():
    torch.set_num_threads(1)
    job = tt.init()
    spec = job.spec
    seed = int(spec["seed"])
    steps = int(spec["stop"]["max_steps"])
    batch = int(spec["batch_size"])
    workers = int(spec["cluster"]["num_workers"])
    centers = 0.35 * torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(seed))

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    model = tt.DistributedModel(net, job, overlap=True)  # one backward per step, gradients not edited
    loss = torch.tensor(0.0)
    for step in range(job.client.clock, steps):
        # The global batch of this step is a function of the step: worker r takes its r-th slice.
        x, y = examples(torch.Generator().manual_seed(seed * 1000003 + step), batch * workers, centers)
        x, y = x[job.rank * batch:(job.rank + 1) * batch], y[job.rank * batch:(job.rank + 1) * batch]
        with model.step(batch_size=batch) as done:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
        if done.gate["stop"]:
            break
    if job.rank == 0:
        model.settle()
        with torch.no_grad():
            x, y = examples(torch.Generator().manual_seed(seed + 1), 2000, centers)
            logits = net(x)
            accuracy = (logits.argmax(1) == y).float().mean().item()
            test_loss = torch.nn.functional.cross_entropy(logits, y).item()
        job.client.report(train_loss=loss.item(), test_accuracy=accuracy, test_loss=test_loss,
                          eval_clock=job.client.clock, samples=batch * job.client.clock)
        print(f"rank 0: test accuracy {accuracy:.4f} after {job.client.clock} steps")
    model.done()


if __name__ == "__main__":
    main()
