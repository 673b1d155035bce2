#!/usr/bin/env python3
"""The data-plane benchmark's PyTorch rows (section h): one MLP (784-256-128-10, the Quick start's shape) on
Fashion-MNIST, batch 64, SGD with momentum 0.9, one CPU thread per process (torch's and OpenBLAS's), trained for --steps steps four ways
in one run, each timed over the same span (from the end of the first step to the end of the last, so start-up,
data loading and declaration are left out, and nothing evaluates inside the span):

  1. a plain PyTorch loop in one process (torch.optim.SGD): the reference;
  2. the same model as a tessera.torch worker through 1 tessera-server + 1 worker, SYNC (tessera-launch; the span
     is the scheduler's, summary.json "training"), once per --transports (gRPC; UCX with trusted_network);
  3. the same model against a hand-written parameter server on torch.distributed.rpc: one server process holding
     the values and the momentum, the worker pulling the values, computing and pushing the gradients every step;
  4. Tessera's C++ worker (the built-in MLP, the same shape) through 1 server + 1 worker, SYNC, timed as 2 (once
     per transport), against its own local baseline (tessera-worker --local, its summary's "training").

And, for each of --models (the MLP; torchvision's ResNet-18 with random initialisation, its first convolution
taking Fashion-MNIST's one channel, when Debian's python3-torchvision is installed), a SYNC step through 1 server +
1 worker in each optimizer path over the same model's plain loop with its own optimizer step (SGD, momentum 0.9):
the servers' optimizer (the job's SGD; the script has no optimizer) and the script's (optimizer { kind: SCRIPT }:
the servers only average, tt.DistributedOptimizer steps torch.optim.SGD on the mean gradient), once per transport.

Prints Markdown rows in the data-plane table's columns. The Python layer's cost: what the exchange adds to a
tessera.torch step (2 - 1) against what it adds to a C++ worker's step (4 - its local baseline), since the two
models compute at different speeds (PyTorch's kernels against the C++ worker's own).

    python3 deploy/bench/pytorch_bench.py --bin=build/bin [--steps=1000] [--work=runs/bench/pytorch]
"""

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

FASHION = "/usr/share/datasets/fashion-mnist"
JOB = """
name: "bench-pytorch"
model {{ mlp {{ hidden_sizes: [256, 128] }} }}
data {{ format: IDX }}
optimizer {{ kind: SGD learning_rate: 0.05 momentum: 0.9 }}
batch_size: {batch}
consistency {{ mode: SYNC }}
stop {{ max_steps: {steps} }}
eval_every_steps: {steps}
seed: 42
chunk_bytes: {chunk_bytes}
cluster {{ num_servers: 1 num_workers: 1 }}
{transport}
"""
TRANSPORTS = {"grpc": ("gRPC", ""), "ucx": ("UCX", "transport: UCX trusted_network: true")}
LR, MOMENTUM, SEED = 0.05, 0.9, 42


def mlp(torch):
    torch.manual_seed(SEED)
    nn = torch.nn
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def resnet18(torch):
    """torchvision's ResNet-18, random initialisation (nothing downloaded), 10 classes, one input channel; the
    examples as 1x28x28 images."""
    import torchvision
    torch.manual_seed(SEED)
    net = torchvision.models.resnet18(weights=None, num_classes=10)
    net.conv1 = torch.nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 28, 28)), net)


MODELS = {"mlp": ("MLP 784-256-128-10", mlp), "resnet18": ("ResNet-18 (torchvision, 11.2M parameters)", resnet18)}


def has_torchvision():
    try:
        import torchvision  # noqa: F401
        return True
    except ImportError:
        return False


def data(tessera, torch):
    x, y, _ = tessera.load_idx(f"{FASHION}/train-images-idx3-ubyte.gz", f"{FASHION}/train-labels-idx1-ubyte.gz")
    return torch.from_numpy(x), torch.from_numpy(y)


def steady(first_end, last_end, steps):
    """Seconds per step between the end of the first step and the end of the last."""
    return (last_end - first_end) / max(1, steps - 1)


# ---- 1. the plain loop -------------------------------------------------------------------------------------------

def one_thread(torch):
    """One CPU thread: torch's and OpenBLAS's (which torch.set_num_threads does not reach), in every run."""
    import tessera.torch as tt
    torch.set_num_threads(1)
    tt.match_blas_threads(1)


def plain_loop(args, model="mlp", steps=None):
    import tessera
    import torch
    one_thread(torch)
    x, y = data(tessera, torch)
    net = MODELS[model][1](torch)
    steps = steps or args.steps
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    schedule = tessera.BatchSchedule(len(x), args.batch, 1, 0, SEED)
    first = None
    for step in range(steps):
        idx = torch.from_numpy(schedule.batch(step))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
        opt.step()
        if step == 0:
            first = time.perf_counter()
    return steady(first, time.perf_counter(), steps)


# ---- 2. the tessera.torch worker (run by tessera-launch) ---------------------------------------------------------

def tessera_worker(model_name, state_every=None):
    """The worker: the servers' optimizer (no optimizer here) or, in a SCRIPT job, torch.optim.SGD stepping on the
    round's mean gradient."""
    import torch
    import tessera.torch as tt
    one_thread(torch)
    job = tt.init()
    x, y, _ = tt.load_split(job, train=True)
    net = MODELS[model_name][1](torch)
    model = tt.DistributedModel(net, job)
    opt = None
    if job.spec["optimizer"]["kind"] == "SCRIPT":
        opt = tt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM), model,
                                      state_every=state_every)
    for idx in model.sampler(len(x)):
        if opt is not None:
            opt.zero_grad()
        with model.step(batch_size=len(idx)):
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        if opt is not None:
            opt.step()
    model.done()


def launch(args, name, command, transport="grpc", steps=None, script=False):
    """Runs the job through tessera-launch, its chunks over `transport`; the scheduler's training span per step."""
    work = pathlib.Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    job = work / "job.pbtxt"
    text = JOB.format(batch=args.batch, steps=steps or args.steps, chunk_bytes=args.chunk_bytes,
                      transport=TRANSPORTS[transport][1])
    if script:
        text = text.replace(f"optimizer {{ kind: SGD learning_rate: {LR} momentum: {MOMENTUM} }}",
                            "optimizer { kind: SCRIPT }")
    job.write_text(text)
    env = dict(os.environ)
    env.pop("TESSERA_BIN_DIR", None)
    argv = [str(pathlib.Path(args.bin) / "tessera-launch"), f"--job={job}", f"--run_dir={work / 'run'}",
            "--overwrite", "--linger_s=0", "--timeout_s=900"]
    if command:
        argv += ["--", *command]
    with open(work / "launch.log", "w") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: tessera-launch exited {done.returncode} (log: {work / 'launch.log'})")
    summary = json.loads((work / "run" / "summary.json").read_text())
    span = summary["training"]
    return span["seconds"] / max(1, span["to_clock"] - span["from_clock"])


def cpp_local(args):
    """tessera-worker --local on the same job: the C++ model's own step time (its summary's "training")."""
    work = pathlib.Path(args.work) / "cpp-local"
    work.mkdir(parents=True, exist_ok=True)
    job = work / "job.pbtxt"
    job.write_text(JOB.format(batch=args.batch, steps=args.steps, chunk_bytes=args.chunk_bytes, transport=""))
    env = dict(os.environ)
    env.pop("TESSERA_BIN_DIR", None)
    with open(work / "run.log", "w") as log:
        done = subprocess.run([str(pathlib.Path(args.bin) / "tessera-worker"), "--local", f"--job={job}",
                               f"--run_dir={work / 'run'}", "--overwrite", "--http_port=-1", "--device=cpu"],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"tessera-worker --local exited {done.returncode} (log: {work / 'run.log'})")
    span = json.loads((work / "run" / "summary.json").read_text())["training"]
    return span["seconds"] / max(1, span["to_clock"] - span["from_clock"])


# ---- 3. the torch.distributed.rpc parameter server ---------------------------------------------------------------

_PS = {}


def _ps_pull():
    return _PS["values"]


def _ps_push(grads):
    with _PS["lock"]:
        for w, v, g in zip(_PS["values"], _PS["momentum"], grads):
            v.mul_(MOMENTUM).add_(g)
            w.sub_(LR * v)
    return True


def rpc_role(role, port, steps, batch, out):
    import threading

    import torch
    import torch.distributed.rpc as rpc
    one_thread(torch)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", num_worker_threads=2,
                                              rpc_timeout=600)
    if role == "server":
        net = mlp(torch)
        _PS["values"] = [p.detach().clone() for p in net.parameters()]
        _PS["momentum"] = [torch.zeros_like(p) for p in _PS["values"]]
        _PS["lock"] = threading.Lock()
        rpc.init_rpc("ps", rank=0, world_size=2, rpc_backend_options=options)
        rpc.shutdown()  # waits for the worker
        return
    import tessera
    x, y = data(tessera, torch)
    net = mlp(torch)
    params = list(net.parameters())
    schedule = tessera.BatchSchedule(len(x), batch, 1, 0, SEED)
    rpc.init_rpc("worker", rank=1, world_size=2, rpc_backend_options=options)
    first = None
    for step in range(steps):
        values = rpc.rpc_sync("ps", _ps_pull)
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        net.zero_grad()
        idx = torch.from_numpy(schedule.batch(step))
        torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
        rpc.rpc_sync("ps", _ps_push, args=([p.grad for p in params],))
        if step == 0:
            first = time.perf_counter()
    seconds = steady(first, time.perf_counter(), steps)
    rpc.shutdown()
    pathlib.Path(out).write_text(json.dumps({"seconds_per_step": seconds}))


def rpc_server_run(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = pathlib.Path(args.work) / "rpc.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), f"--steps={args.steps}", f"--batch={args.batch}"]
    server = subprocess.Popen(me + ["--rpc_role=server", f"--rpc_port={port}"])
    worker = subprocess.run(me + ["--rpc_role=worker", f"--rpc_port={port}", f"--rpc_out={out}"], timeout=1800)
    server.wait(timeout=60)
    if worker.returncode != 0:
        raise RuntimeError(f"torch.distributed.rpc worker exited {worker.returncode}")
    return json.loads(out.read_text())["seconds_per_step"]


# ---- the table ---------------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the table has the medians")
    parser.add_argument("--chunk_bytes", type=int, default=1 << 20,
                        help="the Tessera job's chunk_bytes (default 1 MiB: one chunk per tensor of this model, as "
                             "the RPC server moves whole tensors)")
    parser.add_argument("--bin", default="build/bin", help="folder of tessera-launch and the daemons")
    parser.add_argument("--work", default="runs/bench/pytorch", help="job files, logs and run folders")
    parser.add_argument("--transports", default="grpc,ucx",
                        help="the Tessera rows' data-plane transports, each with rows of its own (grpc, ucx)")
    parser.add_argument("--models", default="mlp,resnet18",
                        help="models with rows per optimizer path (mlp, resnet18: needs python3-torchvision)")
    parser.add_argument("--resnet_steps", type=int, default=60, help="steps of each ResNet-18 run")
    parser.add_argument("--as_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker_model", default="mlp", help=argparse.SUPPRESS)
    parser.add_argument("--worker_state_every", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rpc_role", choices=["server", "worker"], help=argparse.SUPPRESS)
    parser.add_argument("--rpc_port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rpc_out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_worker:
        return tessera_worker(args.worker_model, args.worker_state_every)
    if args.rpc_role:
        return rpc_role(args.rpc_role, args.rpc_port, args.steps, args.batch, args.rpc_out)

    def progress(text):
        print(f"pytorch_bench: {text}", file=sys.stderr, flush=True)

    transports = [t for t in args.transports.split(",") if t]
    for t in transports:
        if t not in TRANSPORTS:
            parser.error(f"--transports: '{t}' is neither grpc nor ucx")
    me = [sys.executable, os.path.abspath(__file__), "--as_worker"]
    runs = [("plain", "plain PyTorch loop", lambda: plain_loop(args)),
            ("rpc", "torch.distributed.rpc parameter server (1 server process), pull-compute-push",
             lambda: rpc_server_run(args)),
            ("local", "C++ local baseline (tessera-worker --local, built-in MLP)", lambda: cpp_local(args))]
    for t in transports:
        over = TRANSPORTS[t][0]
        runs.append((f"tessera-{t}", f"tessera.torch worker, 1 server + 1 worker, sync, {over}",
                     lambda t=t: launch(args, f"tessera-torch-{t}", me, t)))
        runs.append((f"cpp-{t}", f"Tessera C++ worker (built-in MLP), 1 server + 1 worker, sync, {over}",
                     lambda t=t: launch(args, f"cpp-{t}", None, t)))
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            parser.error(f"--models: '{m}' is neither mlp nor resnet18")
    if "resnet18" in models and not has_torchvision():
        progress("ResNet-18 rows skipped: Debian's python3-torchvision is not installed")
        models.remove("resnet18")
    path_runs = []  # (model, plain key, [(key, label)])
    for m in models:
        steps = args.resnet_steps if m == "resnet18" else args.steps
        name = MODELS[m][0]
        plain_key = "plain" if m == "mlp" else f"plain-{m}"
        if m != "mlp":
            runs.append((plain_key, f"{name}: plain PyTorch loop (torch.optim.SGD)",
                         lambda m=m, steps=steps: plain_loop(args, m, steps)))
        rows = []
        for t in transports:
            over = TRANSPORTS[t][0]
            worker = me + [f"--worker_model={m}"]
            if m != "mlp":
                key = f"server-{m}-{t}"
                runs.append((key, f"{name}: tessera.torch, the servers' SGD, 1 server + 1 worker, sync, {over}",
                             lambda t=t, m=m, w=worker, s=steps: launch(args, f"server-{m}-{t}", w, t, s)))
                rows.append(key)
            else:
                rows.append(f"tessera-{t}")
            key = f"script-{m}-{t}"
            runs.append((key, f"{name}: tessera.torch, the script's torch.optim.SGD (kind: SCRIPT), 1 server + 1 "
                              f"worker, sync, {over}",
                         lambda t=t, m=m, w=worker, s=steps: launch(args, f"script-{m}-{t}", w, t, s, script=True)))
            rows.append(key)
            if t == transports[0]:
                # What the keeper's upload of its values and the optimizer's state at every step would cost
                # (state_every=1); by default it sends them only for a checkpoint's cut or a joiner.
                key = f"script-everystep-{m}-{t}"
                runs.append((key, f"{name}: as the row above, state_every=1 (the keeper uploads its values and "
                                  "the optimizer's state at every step)",
                             lambda t=t, m=m, w=worker + ["--worker_state_every=1"], s=steps:
                             launch(args, f"script-everystep-{m}-{t}", w, t, s, script=True)))
                rows.append(key)
        path_runs.append((m, plain_key, rows))
    samples = {key: [] for key, _, _ in runs}
    for repeat in range(args.repeats):  # interleaved, so that a slow moment of the machine touches every run
        for key, label, run in runs:
            progress(f"{label} (repeat {repeat + 1} of {args.repeats})")
            try:
                samples[key].append(run())
            except Exception as e:  # noqa: BLE001 - the row says it failed
                progress(f"{label} failed: {e}")
    seconds = {key: statistics.median(v) if v else None for key, v in samples.items()}
    labels = {key: label for key, label, _ in runs}
    what = f"MLP 784-256-128-10, batch {args.batch}: s per 1000 steps"
    note = (f"median of {args.repeats}, {args.steps} steps each, timed from the end of the first; chunk_bytes "
            f"{args.chunk_bytes}")

    def cell(s):
        return f"{1000 * s:.2f} s" if s else "failed"

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "n/a"

    def row(key, ref_key, target=""):
        s, ref = seconds[key], seconds.get(ref_key)
        reference = "(reference)" if ref_key is None else f"{labels[ref_key]}: {cell(ref)}"
        r = ("1.00x" if s else "n/a") if ref_key is None else ratio(s, ref)
        print(f"| h | {labels[key]}; {what} | {cell(s)} | {reference} | {r} | {target} | {note} |")

    row("plain", None)
    row("rpc", "plain")
    for t in transports:
        row(f"tessera-{t}", "plain", f"<= {ratio(seconds['rpc'], seconds['plain'])} (the RPC server's)")
    row("local", None)
    for t in transports:
        row(f"cpp-{t}", "local")
    # The Python layer: what the exchange adds to a step through tessera.torch, against what it adds to a step of
    # the C++ worker (each over its own model's local step), as a share of the C++ worker's step.
    for t in transports:
        if all(seconds[k] for k in (f"tessera-{t}", "plain", f"cpp-{t}", "local")):
            python_cost = seconds[f"tessera-{t}"] - seconds["plain"]
            cpp_cost = seconds[f"cpp-{t}"] - seconds["local"]
            share = (python_cost - cpp_cost) / seconds[f"cpp-{t}"]
            print(f"| h | Python layer, {TRANSPORTS[t][0]}: the exchange's cost per step through tessera.torch over "
                  f"the C++ worker's | {1000 * python_cost:.2f} ms | C++ worker: {1000 * cpp_cost:.2f} ms per step | "
                  f"{100 * share:+.1f}% of the C++ worker's step | < 5% | {note} |")
    # Each optimizer path over its model's plain loop (with the loop's own optimizer step), ms per step.
    for m, plain_key, keys in path_runs:
        steps = args.resnet_steps if m == "resnet18" else args.steps
        for key in [plain_key] + keys:
            s, ref = seconds[key], seconds[plain_key]
            ms = f"{1000 * s:.1f} ms per step" if s else "failed"
            reference = "(reference)" if key == plain_key else f"plain loop: {1000 * ref:.1f} ms" if ref else "n/a"
            print(f"| h | {labels[key]}; batch {args.batch} | {ms} | {reference} | "
                  f"{'1.00x' if key == plain_key else ratio(s, ref)} |  | median of {args.repeats}, {steps} steps "
                  "each, timed from the end of the first |")
    return 0 if all(seconds.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
