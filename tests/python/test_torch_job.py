"""tessera.torch in a job: the sampler, module buffers, a model that does not match, refused credentials, SIGTERM
and Ctrl-C, a killed worker that rejoins, and the CNN example on Fashion-MNIST."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import REPO, child_environment, launch_job, run_workers

torch = pytest.importorskip("torch", reason="Debian's python3-torch is not installed")
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

EXAMPLE = REPO / "worker" / "python" / "examples" / "fashion_mnist.py"
CNN_JOB = REPO / "deploy" / "jobs" / "fashion_mnist_cnn.pbtxt"
SYNTHETIC_MLP = ('data { format: SYNTHETIC synthetic_train_examples: 4000 synthetic_test_examples: 500 } '
                 'model { mlp { hidden_sizes: [16] } } eval_every_steps: 50')


def test_the_workers_slices_are_one_process_batch_of_the_global_size():
    """The sampler's schedule is tessera-worker's: at every step the workers' slices, together, are exactly the
    batch of a single process whose batch is the global one (the sync-equals-local property)."""
    workers, batch = 3, 5
    ranks = [tessera.BatchSchedule(200, batch, workers, r, 9) for r in range(workers)]
    single = tessera.BatchSchedule(200, batch * workers, 1, 0, 9)
    for step in range(30):  # more than an epoch: the order is reshuffled
        slices = [s.batch(step) for s in ranks]
        assert sum(len(s) for s in slices) == batch * workers
        np.testing.assert_array_equal(np.concatenate(slices), single.batch(step))
    with pytest.raises(tessera.Error, match="fewer than one global batch"):
        tessera.BatchSchedule(10, batch, workers, 0, 9)


def test_throughput_balance_gives_a_slow_script_a_smaller_slice(start_cluster):
    """balance: THROUGHPUT with scripts: each step's compute time reaches the scheduler, and the sampler hands each
    worker the slice the scheduler decided (worker 1 computes 20 ms longer a step from step 20 on)."""
    cluster = start_cluster(mode="SYNC", servers=1, workers=2, lr=0.01, batch_size=32, max_steps=160,
                            consistency="balance: THROUGHPUT")
    slices = {}

    def worker(rank):
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 2)
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=rank))
        g = torch.Generator().manual_seed(5)
        x, y = torch.randn(4096, 8, generator=g), torch.randint(0, 2, (4096,), generator=g)
        sizes = []
        for indices in model.sampler(len(x)):
            with model.step(batch_size=len(indices)):
                torch.nn.functional.cross_entropy(model(x[indices]), y[indices]).backward()
                if rank == 1 and model.clock >= 20:
                    time.sleep(0.02)
            sizes.append(len(indices))
        slices[rank] = sizes
        model.done()

    run_workers(2, worker)
    assert len(slices[0]) == len(slices[1]) == 160
    assert all(a + b == 64 for a, b in zip(slices[0], slices[1]))  # every round is the whole global batch
    assert slices[1][-1] * 4 < slices[0][-1], (slices[0][-20:], slices[1][-20:])


def test_module_buffers_follow_rank_0_and_the_servers_hold_them(start_cluster):
    cluster = start_cluster(mode="SYNC", servers=2, workers=2, lr=0.1, chunk_bytes=64)
    finished = threading.Barrier(2)
    buffers = {}

    def worker(rank):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                  torch.nn.Linear(8, 2))
        job = tt.init(scheduler=cluster.address, rank=rank)
        model = tt.DistributedModel(net, job)
        assert model.buffer_names == ["buffer:1.running_mean", "buffer:1.running_var"]
        g = torch.Generator().manual_seed(rank)  # each rank's data differ: so would its own statistics
        for _ in range(10):
            x, y = torch.randn(4, 6, generator=g) * (rank + 1) + rank, torch.randint(0, 2, (4,), generator=g)
            with model.step(batch_size=4):
                torch.nn.functional.cross_entropy(model(x), y).backward()
        model.settle()
        if rank == 0:
            model.sync_buffers()
        finished.wait()
        if rank != 0:
            model.sync_buffers()
        buffers[rank] = [b.clone() for b in (net[1].running_mean, net[1].running_var)]
        held = [np.empty(8, np.float32) for _ in range(2)]
        job.client.pull(model.buffer_names, held)
        buffers[("servers", rank)] = [torch.from_numpy(h) for h in held]
        finished.wait()
        model.done()

    run_workers(2, worker)
    for got, want in zip(buffers[1] + buffers[("servers", 1)], buffers[0] + buffers[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(buffers[0][0], torch.zeros(8))  # they did move from the initial statistics


def test_a_model_that_does_not_match_the_job_raises_naming_the_difference(start_cluster):
    cluster = start_cluster(mode="ASYNC", servers=1, workers=2)
    first = tt.init(scheduler=cluster.address, rank=0)
    tt.DistributedModel(torch.nn.Linear(4, 2), first)
    other = tt.init(scheduler=cluster.address, rank=1)
    with pytest.raises(tessera.Error, match=r"FAILED_PRECONDITION: .*'bias' is \[2\] in the job but \[3\] in this model"):
        tt.DistributedModel(torch.nn.Linear(4, 3), other)
    with pytest.raises(tessera.Error, match=r"the job has parameters this model lacks \(bias, weight\)"):
        tt.DistributedModel(torch.nn.Sequential(torch.nn.Linear(4, 2)), other)


def test_refused_credentials_raise_with_the_schedulers_message(start_cluster, tmp_path):
    token = tmp_path / "token"
    token.write_text("a" * 32 + "\n")
    token.chmod(0o600)
    wrong = tmp_path / "wrong"
    wrong.write_text("b" * 32 + "\n")
    wrong.chmod(0o600)
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1, token_file=token)
    with pytest.raises(tessera.Error, match="UNAUTHENTICATED: .*wrong job token"):
        tt.init(scheduler=cluster.address, token_file=str(wrong), connect_timeout_s=20)
    with pytest.raises(tessera.Error, match="UNAVAILABLE"):
        tt.init(scheduler="127.0.0.1:1", connect_timeout_s=1)


def start_script(cluster, rank, output, *args):
    """The example as worker `rank` of `cluster`, its output going to the file `output`."""
    env = child_environment(TESSERA_SCHEDULER=cluster.address, TESSERA_RANK=rank)
    with open(output, "w") as out:
        return subprocess.Popen([sys.executable, str(EXAMPLE), "--model=mlp", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True)


def wait_for_text(process, output, text, timeout=60):
    """Waits until the file `output` holds `text`; fails when the process ends first or the deadline passes."""
    deadline = time.time() + timeout
    while text not in output.read_text():
        assert process.poll() is None and time.time() < deadline, f"no {text!r}: " + output.read_text()
        time.sleep(0.1)


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_stops_the_script_after_its_step_and_tells_the_scheduler(start_cluster, tmp_path, sig, status):
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1, max_steps=10 ** 6)
    log = tmp_path / "script.log"
    script = start_script(cluster, 0, log, "--eval_every=100")
    wait_for_text(script, log, "clock 200")
    script.send_signal(sig)
    script.wait(timeout=30)
    output = log.read_text()
    assert script.returncode == status, output
    name = signal.Signals(sig).name
    assert f"stopped by {name}" in output, output
    deadline = time.time() + 10
    while f"stopped by {name}" not in cluster.log("scheduler") and time.time() < deadline:
        time.sleep(0.1)
    assert f"stopped by {name}" in cluster.log("scheduler")


def launch(tmp_path, *extra, job=CNN_JOB, command=None, wait=True):
    return launch_job(tmp_path, *extra, job=job, command=command or [sys.executable, str(EXAMPLE)], wait=wait)


def summary(tmp_path):
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_the_cnn_example_trains_on_fashion_mnist_through_the_launcher(tmp_path):
    done = launch(tmp_path, "--job_override=stop { max_steps: 60 } eval_every_steps: 30")
    assert done.returncode == 0, done.stdout + done.stderr
    s = summary(tmp_path)
    assert s["completed"] is True and s["steps"] == 60, s
    assert s["test_accuracy"] > 0.5, s  # 10 classes: chance is 0.1
    log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert "cnn, 29" in log and "test accuracy" in log, log


def test_a_sync_job_that_reaches_its_target_ends_every_script_cleanly(tmp_path):
    # Rank 0's score stops the job while the other worker's last round can never close: every script still ends
    # with exit 0 and the summary names the target.
    done = launch(tmp_path, f"--job_override={SYNTHETIC_MLP} stop {{ target_accuracy: 0.5 epochs: 1000 }}",
                  command=[sys.executable, str(EXAMPLE), "--model=mlp"])
    assert done.returncode == 0, done.stdout + done.stderr
    s = summary(tmp_path)
    assert s["completed"] is True and "reached the target 0.5" in s["stop_reason"], s
    for rank in range(2):
        assert "stopped at clock" in (tmp_path / "run" / "logs" / f"worker-{rank}.log").read_text()


def test_sigterm_to_the_launcher_stops_the_scripts_and_writes_the_summary(tmp_path):
    launcher = launch(tmp_path, f"--job_override={SYNTHETIC_MLP} stop {{ epochs: 100000 }}",
                      command=[sys.executable, str(EXAMPLE), "--model=mlp"], wait=False)
    log = tmp_path / "run" / "logs" / "worker-1.log"
    deadline = time.time() + 90
    while not (log.exists() and "from clock" in log.read_text()):
        assert launcher.poll() is None and time.time() < deadline, launcher.stdout.read()
        time.sleep(0.2)
    time.sleep(1)
    launcher.send_signal(signal.SIGTERM)
    output = launcher.communicate(timeout=60)[0]
    assert launcher.returncode == 0, output
    s = summary(tmp_path)
    assert "SIGTERM" in s["stop_reason"], s
    assert s["steps"] > 0
    for rank in range(2):
        assert "stopped at clock" in (tmp_path / "run" / "logs" / f"worker-{rank}.log").read_text()


def child_of(launcher_pid, needle, variable=None):
    """The pid of the launcher's child whose command line holds `needle` (and whose environment holds
    `variable`, "NAME=VALUE", when given), or None."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid or needle.encode() not in (entry / "cmdline").read_bytes():
                continue
            if variable is None or variable.encode() in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def wait_for_clock(launcher, tmp_path, clock, timeout=120):
    """Waits until rank 0's output names a clock >= `clock` (its scores print "rank 0: clock N")."""
    log = tmp_path / "run" / "logs" / "worker-0.log"
    deadline = time.time() + timeout
    while True:
        text = log.read_text() if log.exists() else ""
        clocks = [int(w.split()[3]) for w in text.splitlines() if w.startswith("rank 0: clock ")]
        if clocks and max(clocks) >= clock:
            return
        assert launcher.poll() is None and time.time() < deadline, launcher.stdout.read()
        time.sleep(0.2)


def kill_and_finish(launcher, tmp_path, pid, steps):
    """SIGKILLs the launcher's child `pid`; the job still completes its `steps` and the launcher exits 0."""
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    output = launcher.communicate(timeout=240)[0]
    assert launcher.returncode == 0, output
    s = summary(tmp_path)
    assert s["completed"] is True and s["steps"] == steps, s


def test_a_killed_script_is_restarted_and_rejoins_where_the_job_is(tmp_path):
    launcher = launch(tmp_path, "--restart_workers=3",
                      f"--job_override={SYNTHETIC_MLP} stop {{ max_steps: 3000 epochs: 1000 }}", command=[sys.executable, str(EXAMPLE), "--model=mlp"], wait=False)
    wait_for_clock(launcher, tmp_path, 200)
    kill_and_finish(launcher, tmp_path, child_of(launcher.pid, "fashion_mnist.py", "TESSERA_RANK=1"), 3000)
    log = tmp_path / "run" / "logs" / "worker-1.log"
    starts = [line for line in log.read_text().splitlines() if "from clock" in line]
    assert len(starts) == 2, log.read_text()
    assert not starts[1].endswith("from clock 0"), starts  # it went on where the job was


@pytest.mark.parametrize("optimizer", ["servers", "script"])
def test_a_stopped_script_job_resumes_from_its_checkpoint(tmp_path, optimizer):
    """The servers' optimizer, or the script's own (kind: SCRIPT: the checkpoint holds the values of the step
    before its clock, that step's mean gradient and AdamW's state; the first step after the resume makes that step
    again)."""
    override = f"--job_override={SYNTHETIC_MLP} stop {{ max_steps: 2500 epochs: 1000 }}"
    command = [sys.executable, str(EXAMPLE), "--model=mlp"]
    job = CNN_JOB if optimizer == "servers" else REPO / "deploy" / "jobs" / "fashion_mnist_cnn_script.pbtxt"
    first = launch(tmp_path, "--checkpoint_every_steps=100", override, job=job, command=command, wait=False)
    wait_for_clock(first, tmp_path, 400)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0, first.stdout.read()
    stopped_at = summary(tmp_path)["steps"]
    assert 0 < stopped_at < 2500
    again = launch(tmp_path, f"--resume={tmp_path / 'run'}", job=None, command=command)
    assert again.returncode == 0, again.stdout + again.stderr
    s = summary(tmp_path)
    assert s["completed"] is True and s["steps"] == 2500, s
    starts = [line for line in (tmp_path / "run" / "logs" / "worker-1.log").read_text().splitlines()
              if "from clock" in line]
    resumed_at = int(starts[-1].rsplit(" ", 1)[1])
    # The stop took a checkpoint at its clock (as for tessera-worker): the scripts go on from there (with the
    # script's optimizer, from the step before it, which the first step makes again).
    assert 400 <= resumed_at <= stopped_at, starts
    if optimizer == "script":
        # Rank 0, the keeper, replays the checkpoint's step; rank 1 does too, or, when it starts after rank 0 has
        # gone on, takes the values rank 0 saved for its clock.
        keeper = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
        keeper_from = int([line for line in keeper.splitlines() if "from clock" in line][-1].rsplit(" ", 1)[1])
        assert f"took the checkpoint's values of clock {keeper_from}" in keeper, keeper[-2000:]
        log = (tmp_path / "run" / "logs" / "worker-1.log").read_text()
        assert (f"took the checkpoint's values of clock {resumed_at}" in log
                or f"joined at clock {resumed_at} with the keeper's values" in log), log[-2000:]


def test_a_lost_server_rolls_the_scripts_back_to_the_checkpoint_and_they_go_on(tmp_path):
    launcher = launch(tmp_path, "--checkpoint_every_steps=100", "--restart_servers=2",
                      f"--job_override={SYNTHETIC_MLP} stop {{ max_steps: 2500 epochs: 1000 }}",
                      command=[sys.executable, str(EXAMPLE), "--model=mlp"], wait=False)
    wait_for_clock(launcher, tmp_path, 400)
    kill_and_finish(launcher, tmp_path, child_of(launcher.pid, "--id=0"), 2500)
    for rank in range(2):
        log = (tmp_path / "run" / "logs" / f"worker-{rank}.log").read_text()
        assert "the job went back to clock" in log, log[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU path is not exercised here")
def test_a_cuda_model_trains_as_the_same_model_on_the_cpu(start_cluster):
    results = {}
    for device in ("cpu", "cuda"):
        cluster = start_cluster(mode="SYNC", servers=1, workers=1, lr=0.1)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(device)
        model = tt.DistributedModel(net, tt.init(scheduler=cluster.address, rank=0))
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            x, y = torch.randn(4, 8, generator=g).to(device), torch.randint(0, 3, (4,), generator=g).to(device)
            with model.step(batch_size=4):
                torch.nn.functional.cross_entropy(model(x), y).backward()
        model.done()
        results[device] = [p.detach().cpu() for p in net.parameters()]
        cluster.stop()
    for a, b in zip(results["cpu"], results["cuda"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
