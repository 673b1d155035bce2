"""tessera-launch running a user's script as the workers, in the manner of torchrun."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import BIN, REPO, launch_job

pytest.importorskip("torch", reason="Debian's python3-torch is not installed")

EXAMPLE = REPO / "worker" / "python" / "examples" / "mlp_synthetic.py"
JOB = REPO / "deploy" / "jobs" / "python_mlp_synthetic.pbtxt"


def launch(tmp_path, *extra, command=None):
    return launch_job(tmp_path, *extra, job=JOB, command=command or [sys.executable, str(EXAMPLE)], timeout_s=120)


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC", "SSP"])
def test_the_script_runs_as_every_worker_and_the_job_completes(tmp_path, mode):
    override = f"consistency {{ mode: {mode} {'staleness: 2' if mode == 'SSP' else ''} }}"
    done = launch(tmp_path, f"--job_override={override}")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is True, summary
    assert summary["steps"] == 200
    assert summary["test_accuracy"] > 0.6, summary  # 4 classes: chance is 0.25
    assert "rank 0: test accuracy" in (tmp_path / "run" / "logs" / "worker-0.log").read_text()


def test_a_failing_script_is_named_and_the_launcher_fails(tmp_path):
    # As with tessera-worker: a worker that fails before it joins is named at once, and the launcher ends the run
    # (it can never join; test_launch_failures.py holds the class).
    done = launch(tmp_path, "--workers=1", "--timeout_s=8",
                  command=[sys.executable, "-c", "import sys; sys.exit('no model here')"])
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "worker 0" in output and "no model here" in output, output


def test_nothing_after_the_separator_is_refused(tmp_path):
    done = subprocess.run([str(BIN / "tessera-launch"), f"--job={JOB}", "--"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2
    assert "nothing after" in done.stderr


def test_a_killed_scheduler_is_started_again_and_the_script_rides_through(tmp_path):
    # --restart_scheduler: the launcher starts a scheduler that died again on its port; the scripts' clients wait
    # for it, come back, and the job goes on where it was.
    launcher = launch_job(tmp_path, "--restart_scheduler=1", "--job_override=stop { max_steps: 6000 }",
                          job=JOB, command=[sys.executable, str(EXAMPLE)], wait=False, timeout_s=180)
    try:
        log = tmp_path / "run" / "logs" / "scheduler.log"
        deadline = time.monotonic() + 60
        def started():  # the parameters placed and both scripts registered
            text = log.read_text() if log.exists() else ""
            return "parameters in" in text and all(re.search(rf"worker {r} .*registered", text) for r in (0, 1))

        while not started():
            assert time.monotonic() < deadline and launcher.poll() is None, "the job did not start"
            time.sleep(0.1)
        time.sleep(1)  # training under way
        scheduler = subprocess.run(["pgrep", "-P", str(launcher.pid), "-f", "tessera-scheduler"],
                                   capture_output=True, text=True).stdout.split()
        assert len(scheduler) == 1, scheduler
        os.kill(int(scheduler[0]), signal.SIGKILL)
        output = launcher.stdout.read()
        assert launcher.wait(timeout=240) == 0, output
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert "starting it again" in output, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is True, summary
    assert summary["steps"] == 6000
    events = [e["event"] for e in summary["events"]]
    assert "scheduler restarted, job taken back" in events, events
    assert "worker lost" not in events and "worker failed" not in events, events
