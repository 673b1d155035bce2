"""tessera-launch with worker commands that never join the job: the launcher ends at once, non-zero, naming each
worker's error; a job whose workers all joined and then died ends by the scheduler's rule, in bounded time."""

import json
import sys
import time

import pytest

from conftest import BIN, launch_job

JOB = """
name: "launch-failures"
model {{ mlp {{ hidden_sizes: 8 }} }}
data {{ format: SYNTHETIC synthetic_train_examples: 512 synthetic_features: 8 synthetic_classes: 4 }}
optimizer {{ kind: SGD learning_rate: 0.05 }}
batch_size: 8
consistency {{ mode: ASYNC }}
stop {{ max_steps: {steps} }}
cluster {{ num_servers: 1 num_workers: 2 }}
"""

# What each failing worker command does, and what the launcher says of it.
BEHAVIOURS = {
    "not_found": (["/nonexistent/tessera-no-such-command"], "cannot execute"),
    "exits_1": ([sys.executable, "-c", "import sys; sys.exit('no model here')"], "no model here"),
    "exits_0": ([sys.executable, "-c", "pass"], "exited without joining"),
    "killed": ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], "signal 9"),
}


def job_file(tmp_path, steps=100):
    path = tmp_path / "job.pbtxt"
    path.write_text(JOB.format(steps=steps))
    return path


def only_rank_1(command):
    """A worker command: rank 1 runs `command`, rank 0 is a real tessera-worker that joins and trains."""
    script = ('import os, sys\n'
              'if os.environ["TESSERA_RANK"] == "1":\n'
              f'    os.execv({command[0]!r}, {command!r})\n'
              f'os.execv({str(BIN / "tessera-worker")!r}, ["tessera-worker", "--device=cpu", "--http_port=-1"])\n')
    return [sys.executable, "-c", script]


@pytest.mark.parametrize("every", [True, False], ids=["every_worker", "one_worker"])
@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_a_worker_that_can_never_join_ends_the_run_at_once(tmp_path, behaviour, every):
    command, said = BEHAVIOURS[behaviour]
    if not every:
        command = only_rank_1(command)
        if behaviour == "not_found":
            said = "No such file or directory"  # the wrapper's exec fails
    # Long enough that rank 0 is still training when rank 1 is found missing (it never finishes without it).
    start = time.monotonic()
    done = launch_job(tmp_path, job=job_file(tmp_path, steps=1000000), command=command, timeout_s=120)
    took = time.monotonic() - start
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert took < 30, f"the launcher took {took:.1f} s to give up:\n{output}"
    assert said in output, output
    if behaviour == "not_found" and every:
        # The launcher could not start the first: it says so before any job runs.
        assert "worker 0: cannot execute" in output, output
        return
    assert "worker 1" in output, output
    if every:
        assert "no worker could join the job" in output, output
        assert "worker 0 (" in output, output
    else:
        assert "a worker can never join the job" in output, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is False, summary
    assert said in summary["stop_reason"], summary


def test_workers_that_joined_and_died_end_the_job_by_the_schedulers_rule(tmp_path):
    # Each rank joins (a real tessera-worker), then is killed: the scheduler declares both lost after its heartbeat
    # timeout and ends the job, and the launcher exits with its verdict.
    script = ('import os, signal, subprocess, sys, time\n'
              f'worker = subprocess.Popen([{str(BIN / "tessera-worker")!r}, "--device=cpu", "--http_port=-1"])\n'
              'time.sleep(3)\n'
              'worker.kill()\n'
              'worker.wait()\n'
              'sys.exit(1)\n')
    start = time.monotonic()
    done = launch_job(tmp_path, "--heartbeat_timeout_ms=1500", job=job_file(tmp_path, steps=10000000),
                      command=[sys.executable, "-c", script], timeout_s=120)
    took = time.monotonic() - start
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert took < 40, f"the launcher took {took:.1f} s:\n{output}"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is False, summary
    assert summary["stop_reason"].startswith("every worker was lost"), summary
    assert sorted(summary["lost_workers"]) == [0, 1], summary
    assert "stopped_by" not in summary, "the scheduler ended the job, not the launcher"


def raising_script(marker):
    """A worker command: rank 0 is a real tessera-worker; rank 1 a script of the tessera package that advances its
    clock until the job's end, and raises at clock 15 unless `marker` exists (it creates it first: a restarted
    rank 1 goes on)."""
    script = ('import os, pathlib, sys\n'
              'if os.environ["TESSERA_RANK"] == "0":\n'
              f'    os.execv({str(BIN / "tessera-worker")!r}, ["tessera-worker", "--device=cpu", "--http_port=-1"])\n'
              'import tessera\n'
              'job = tessera.connect()\n'
              'stop = job.client.stop_clock(1 << 40)\n'
              f'marker = pathlib.Path({str(marker)!r})\n'
              'while job.client.clock < stop:\n'
              '    gate = job.client.advance_clock()\n'
              '    if gate["stop"]:\n'
              '        break\n'
              '    if gate["clock"] == 15 and not marker.exists():\n'
              '        marker.write_text("raised")\n'
              '        raise RuntimeError("a bug in the script at clock 15")\n'
              'job.client.done()\n')
    return [sys.executable, "-c", script]


def test_an_exception_a_script_raises_fails_the_job_naming_it(tmp_path):
    # The default policy (cluster.worker_errors FAIL_JOB): the job fails at once, not after a heartbeat timeout
    # and not as a success once the other worker finishes.
    start = time.monotonic()
    done = launch_job(tmp_path, job=job_file(tmp_path, steps=10000000),
                      command=raising_script(tmp_path / "raised"), timeout_s=120)
    took = time.monotonic() - start
    output = done.stdout + done.stderr
    assert (tmp_path / "raised").exists(), output
    assert done.returncode == 1, output
    assert "RuntimeError: a bug in the script at clock 15" in output, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is False, summary
    assert summary["stop_reason"].startswith(
        "worker 1 failed at clock 15: RuntimeError: a bug in the script at clock 15"), summary
    assert summary["lost_workers"] == [1], summary
    assert took < 60, f"the launcher took {took:.1f} s:\n{output}"


def test_with_worker_restarts_a_script_that_raised_is_awaited_and_the_job_completes(tmp_path):
    # tessera-launch --restart_workers makes the policy AWAIT_RESTART: rank 1 raises once, is started again,
    # rejoins and the job completes.
    done = launch_job(tmp_path, "--restart_workers=1", job=job_file(tmp_path, steps=400),
                      command=raising_script(tmp_path / "raised"), timeout_s=120)
    output = done.stdout + done.stderr
    assert (tmp_path / "raised").exists(), output
    assert done.returncode == 0, output
    assert "restarted worker 1" in output, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is True, summary
    assert "AWAIT_RESTART" in (tmp_path / "run" / "job.pbtxt").read_text()
