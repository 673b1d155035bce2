"""Fashion-MNIST through Tessera's servers: a small CNN (default) or the built-in MLP's shape, in PyTorch. The
launcher runs it once per worker, in the manner of torchrun:

    build/bin/tessera-launch --job=deploy/jobs/fashion_mnist_cnn.pbtxt -- \\
        python3 worker/python/examples/fashion_mnist.py
    build/bin/tessera-launch --job=deploy/jobs/fashion_mnist_cnn.pbtxt \\
        --job_override='consistency { mode: SSP staleness: 3 }' -- python3 worker/python/examples/fashion_mnist.py
    build/bin/tessera-launch --job=deploy/jobs/fashion_mnist_cnn_adamw.pbtxt -- \\
        python3 worker/python/examples/fashion_mnist.py --micro_batches=2
    build/bin/tessera-launch --job=deploy/jobs/fashion_mnist_cnn_script.pbtxt -- \\
        python3 worker/python/examples/fashion_mnist.py --micro_batches=2

The data is the job's (data { format: IDX }: Debian's dataset-fashion-mnist files), read by Tessera's own
loader; each worker trains on its slice of every step's global batch, as tessera-worker does. The consistency
and the stop rules are the job's; so is the optimizer, unless the job says optimizer { kind: SCRIPT }: then this
script's own runs (torch.optim.AdamW without decay on biases and norms, a linear warmup then a cosine decay to
the job's last step, clip_grad_norm_; see --lr, --weight_decay, --warmup_steps and --clip). Rank 0 scores the model on the test set every
eval_every_steps steps and reports it: the summary, metrics.jsonl, /metrics and the dashboard show it, and the
job ends at its target accuracy.
"""

import argparse
import contextlib
import math
import time

import torch
from torch import nn

import tessera.torch as tt


def cnn(classes):
    """Two 5x5 convolutions with batch normalisation and pooling, then one linear layer: 29k parameters."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, classes))


def mlp(features, hidden_sizes, classes):
    """The built-in model's shape (model { mlp { hidden_sizes } } of the job): ReLU layers, then the classes."""
    layers, width = [], features
    for h in hidden_sizes:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, classes))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's threads per worker (default 1)")
    parser.add_argument("--micro_batches", type=int, default=1,
                        help="backward calls per step, each on a part of the worker's slice (gradient accumulation; "
                             "all but the last inside model.no_sync()); default 1")
    parser.add_argument("--lr", type=float, default=0.003, help="optimizer { kind: SCRIPT }: AdamW's peak rate")
    parser.add_argument("--weight_decay", type=float, default=0.05,
                        help="optimizer { kind: SCRIPT }: AdamW's decay of the weights (not of biases and norms)")
    parser.add_argument("--warmup_steps", type=int, default=200,
                        help="optimizer { kind: SCRIPT }: steps of linear warmup before the cosine decay")
    parser.add_argument("--clip", type=float, default=1.0,
                        help="optimizer { kind: SCRIPT }: clip_grad_norm_'s largest norm of the step's mean "
                             "gradient (0: none)")
    parser.add_argument("--eval_every", type=int, default=0,
                        help="steps between rank 0's evaluations (default: the job's eval_every_steps)")
    args = parser.parse_args()
    if args.micro_batches < 1:
        parser.error("--micro_batches must be at least 1")
    torch.set_num_threads(args.threads)

    job = tt.init()
    spec = job.spec
    x, y, classes = tt.load_split(job, train=True)
    test_x, test_y, _ = tt.load_split(job, train=False) if job.rank == 0 else (None, None, None)
    torch.manual_seed(int(spec["seed"]))  # every rank builds the same model; rank 0's values start the job
    if args.model == "cnn" and x.shape[1] != 28 * 28:
        raise SystemExit(f"the CNN takes 28x28 images; the job's data has {x.shape[1]} features")

    def build():
        if args.model == "cnn":
            return cnn(classes)
        return mlp(x.shape[1], [int(h) for h in spec["model"]["mlp"]["hidden_sizes"]], classes)

    net = build()
    # One backward per step and no edit of its gradients: each may leave as backward computes it.
    model = tt.DistributedModel(net, job, overlap=True)
    eval_every = args.eval_every or int(spec["eval_every_steps"])
    sampler = model.sampler(len(x))
    own = model.script  # the job's optimizer is this script's (optimizer { kind: SCRIPT })
    if own:
        total = min(int(spec["stop"]["max_steps"]) or 1 << 40,
                    int(spec["stop"]["epochs"]) * sampler.steps_per_epoch or 1 << 40)
        if total == 1 << 40:
            raise SystemExit("the schedule needs the job's last step: stop { max_steps } or stop { epochs }")
        opt = tt.DistributedOptimizer(torch.optim.AdamW(
            [{"params": [p for p in net.parameters() if p.ndim > 1], "weight_decay": args.weight_decay},
             {"params": [p for p in net.parameters() if p.ndim <= 1], "weight_decay": 0.0}], lr=args.lr), model)

        def warmup_cosine(step):
            if step < args.warmup_steps:
                return (step + 1) / args.warmup_steps
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - args.warmup_steps) /
                                                     max(1, total - args.warmup_steps))))

        # From the job's clock: a restarted worker's schedule goes on where the job is.
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine, last_epoch=model.clock - 1)
    print(f"rank {job.rank}: {args.model}, {sum(p.numel() for p in net.parameters())} parameters, "
          f"{sampler.steps_per_epoch} steps per epoch, from clock {model.clock}", flush=True)
    # Rank 0 scores copies of the model on a thread of its own, so that it keeps pace with the other workers.
    scorer = tt.BackgroundEvaluator(build(), test_x, test_y) if job.rank == 0 else None
    started, losses = time.time(), []

    def report_scores(scores):
        for clock, accuracy, test_loss in scores:
            print(f"rank 0: clock {clock} (epoch {sampler.epochs(clock):.2f}, {time.time() - started:.1f} s): "
                  f"test accuracy {accuracy:.4f}", flush=True)
            model.report(accuracy=accuracy, test_loss=test_loss, clock=clock)

    for indices in sampler:
        parts = indices.chunk(args.micro_batches)
        if own:
            opt.zero_grad()
        with model.step(batch_size=len(indices)):
            loss = 0.0
            for k, part in enumerate(parts):
                # Each part's mean loss, weighted by its share: the sum of the gradients is the slice's mean.
                with model.no_sync() if k < len(parts) - 1 else contextlib.nullcontext():
                    part_loss = nn.functional.cross_entropy(model(x[part]), y[part]) * (len(part) / len(indices))
                    part_loss.backward()
                loss += part_loss.item()
        if own:  # .grad holds the step's gradient: the workers' mean in SYNC, this worker's in ASYNC and SSP
            if args.clip > 0:
                nn.utils.clip_grad_norm_(net.parameters(), args.clip)
            opt.step()
            schedule.step()
        losses.append(loss)
        if model.clock % eval_every == 0:
            model.report(loss=sum(losses) / len(losses))
            losses = []
            if scorer is not None:
                model.settle()
                scorer.offer(net, model.clock)
        if scorer is not None:
            report_scores(scorer.results())
    if scorer is not None:  # the final values, scored unless they were already
        model.settle()
        report_scores(scorer.drain())
        if scorer.last_clock != model.clock and scorer.offer(net, model.clock):
            report_scores(scorer.drain())
    print(f"rank {job.rank}: stopped at clock {model.clock}: {model.stop_reason}", flush=True)
    model.done()


if __name__ == "__main__":
    main()
