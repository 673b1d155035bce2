"""Fixtures for the Python package's tests: real tessera-scheduler and tessera-server processes on loopback."""

import contextlib
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", REPO / "build" / "bin"))

JOB = """
name: "python-test"
model {{ mlp {{ hidden_sizes: 4 }} }}
data {{ format: SYNTHETIC }}
optimizer {{ {optimizer} }}
batch_size: {batch_size}
consistency {{ mode: {mode} {consistency} }}
stop {{ max_steps: {max_steps} }}
cluster {{ num_servers: {servers} num_workers: {workers} }}
chunk_bytes: {chunk_bytes}
{extra}
"""


_SEEDED = threading.Lock()


@contextlib.contextmanager
def seeded(seed):
    """torch's global generator seeded for the block, one block at a time: the workers of a test are threads of one
    process, and a model built from the seed must not take draws another thread's model made meanwhile."""
    import torch
    with _SEEDED:
        torch.manual_seed(seed)
        yield


def run_workers(count, body, timeout=240):
    """Runs body(rank) on `count` threads (one client each, as separate workers would); re-raises the first
    failure in the caller's thread."""
    errors = []

    def run(rank):
        try:
            body(rank)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    if errors:
        raise errors[0]


def launch_job(tmp_path, *extra, job, command, wait=True, timeout_s=240):
    """tessera-launch with `job` (None: the job comes from --resume in `extra`), RUN_DIR tmp_path/run, and
    `command` as the workers. wait: the finished process (output captured), else the running one (output on
    its stdout pipe)."""
    argv = [str(BIN / "tessera-launch"), *([f"--job={job}"] if job else []), f"--run_dir={tmp_path / 'run'}",
            "--linger_s=0", f"--timeout_s={timeout_s}", *extra, "--", *command]
    if not wait:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=child_environment())
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 60, env=child_environment())


def child_environment(**extra):
    """This process's environment for a child, with `extra` added. The daemons read TESSERA_ variables as flags:
    the tests' own (the binaries' folder) is not one."""
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_BIN_DIR"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


# The job's fields for each way values travel that the tests compare.
TRANSPORTS = {"grpc": "", "ucx": "transport: UCX trusted_network: true"}


class Cluster:
    """A scheduler and its servers, each its own process; `address` is the scheduler's HOST:PORT."""

    def __init__(self, tmp, mode, servers, workers, lr, token_file=None, momentum=0.0, chunk_bytes=16, batch_size=4,
                 max_steps=1000, consistency="", optimizer=None, extra="", scheduler_flags=()):
        self.processes = []
        self.tmp = tmp
        job = tmp / "job.pbtxt"
        job.write_text(JOB.format(mode=mode, servers=servers, workers=workers, lr=lr, momentum=momentum,
                                  chunk_bytes=chunk_bytes, batch_size=batch_size, max_steps=max_steps,
                                  consistency=consistency, extra=extra,
                                  optimizer=optimizer or f"kind: SGD learning_rate: {lr} momentum: {momentum}"))
        address_file = tmp / "scheduler.address"
        address_file.unlink(missing_ok=True)  # a cluster started before in this folder
        security = [f"--token_file={token_file}"] if token_file else []
        self._start("scheduler", [BIN / "tessera-scheduler", f"--job={job}", "--port=0", "--http_port=-1",
                                  f"--address_file={address_file}", f"--run_dir={tmp / 'run'}", "--stop_grace_ms=1000"] + security +
                    list(scheduler_flags))
        deadline = time.time() + 30
        while not (address_file.exists() and address_file.read_text().strip()):
            if time.time() > deadline:
                raise RuntimeError("the scheduler did not start: " + self.log("scheduler"))
            time.sleep(0.05)
        self.address = address_file.read_text().strip()
        for i in range(servers):
            self._start(f"server{i}", [BIN / "tessera-server", f"--scheduler={self.address}", "--http_port=-1",
                                       f"--id={i}"] + security)

    def _start(self, name, argv):
        log = open(self.tmp / f"{name}.log", "w")
        self.processes.append(subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True, env=child_environment()))

    def log(self, name):
        return (self.tmp / f"{name}.log").read_text()

    def stop(self):
        for p in self.processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def start_cluster(tmp_path):
    """start_cluster(mode="SYNC", servers=2, workers=1, lr=0.5, ...) -> Cluster (see Cluster); optimizer: the
    job's optimizer { ... } text (default: SGD with `lr` and `momentum`); extra: more fields of the job;
    scheduler_flags: more flags of tessera-scheduler."""
    clusters = []

    def start(mode="SYNC", servers=2, workers=1, lr=0.5, token_file=None, momentum=0.0, chunk_bytes=16, batch_size=4,
              max_steps=1000, consistency="", optimizer=None, extra="", scheduler_flags=()):
        cluster = Cluster(tmp_path, mode, servers, workers, lr, token_file, momentum, chunk_bytes, batch_size,
                          max_steps, consistency, optimizer, extra, scheduler_flags)
        clusters.append(cluster)
        return cluster

    yield start
    for c in clusters:
        c.stop()
