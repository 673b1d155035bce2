"""Tessera for Python: a worker's side of a Tessera job, over the C++ client library.

    import numpy as np
    import tessera

    job = tessera.connect()                 # from TESSERA_SCHEDULER, TESSERA_RANK, ... (or arguments)
    w = np.zeros(10, np.float32)
    job.client.declare([("w", [10], 0.0, 0)])
    job.client.pull(["w"], [w])
    g = compute_gradient(w)
    job.client.push(["w"], [g], batch_size=32)
    gate = job.client.advance_clock()       # {"clock": 1, "stop": False, ...}
    job.client.done()

Values and gradients are float32, C-contiguous arrays, read and written in place. Failures raise
tessera.Error with the daemon's message ("UNAVAILABLE: ...").

A script that ends on an exception it did not catch tells the scheduler so, with the exception's last line
("ValueError: ..."): an error of the worker's own program fails the whole job at once (exit status 3, the
summary naming the worker, its clock and the error), unless the job's cluster.worker_errors is AWAIT_RESTART
(tessera-launch --restart_workers sets it), where the worker leaves and its rank may come back. A worker whose
process or machine is lost (no heartbeats) is another case: the others go on without it.
"""

import json
import os
import sys
import traceback
import weakref

from ._tessera import BatchSchedule, Client, Error, Step, load_idx, resolve_join

__all__ = ["BatchSchedule", "Client", "Error", "Job", "Step", "connect", "load_idx"]


def _setting(name, given, default, kind=str):
    """`given` when not None, else the TESSERA_<NAME> variable tessera-worker reads for --<name>, else `default`."""
    if given is not None:
        return given
    text = os.environ.get("TESSERA_" + name.upper())
    if text is None or text == "":
        return default
    if kind is bool:
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise Error(f"INVALID_ARGUMENT: TESSERA_{name.upper()}={text!r} is not a boolean")
    try:
        return kind(text)
    except ValueError:
        raise Error(f"INVALID_ARGUMENT: TESSERA_{name.upper()}={text!r} is not a {kind.__name__}") from None


# The jobs this process joined and still holds, told when the script ends on an uncaught exception. Weak: a job
# the script let go closes its client as before (one kept alive here would be closed only while the interpreter
# shuts down, which can wait for ever on the client's threads).
_joined = weakref.WeakSet()
_excepthook = None  # the hook ours calls first (Python's own prints the traceback)


def _report_uncaught(kind, error, trace):
    """sys.excepthook while a job is joined: the traceback as before, then each joined client leaves the job on
    the exception's last line (a program error; KeyboardInterrupt is a stop, not a bug)."""
    try:
        _excepthook(kind, error, trace)
    finally:
        lines = "".join(traceback.format_exception_only(kind, error)).strip().splitlines()
        why = lines[-1] if lines else kind.__name__
        for job in list(_joined):
            job.client.fail(why, program_error=not issubclass(kind, KeyboardInterrupt))


def _watch(job):
    global _excepthook
    if _excepthook is None:
        _excepthook = sys.excepthook
        sys.excepthook = _report_uncaught
    _joined.add(job)
    return job


class Job:
    """A joined job: the client, this worker's rank and the job's spec as a dict (JobSpec's field names)."""

    def __init__(self, client):
        self.client = client
        self.rank = client.worker_id
        self.spec = json.loads(client.job_json)

    @property
    def mode(self):
        return self.spec["consistency"]["mode"]


def connect(scheduler=None, rank=None, device=None, token_file=None, tls_cert=None, tls_key=None, tls_ca=None,
            insecure=None, connect_timeout_s=None, scheduler_port=None, rank_offset=None):
    """Joins the job as a worker, configured as tessera-worker is: each argument left None comes from its
    TESSERA_ variable (TESSERA_SCHEDULER, TESSERA_RANK, TESSERA_DEVICE, TESSERA_TOKEN_FILE, TESSERA_TLS_CERT,
    TESSERA_TLS_KEY, TESSERA_TLS_CA, TESSERA_INSECURE, TESSERA_CONNECT_TIMEOUT_S, TESSERA_SCHEDULER_PORT,
    TESSERA_RANK_OFFSET), and under Slurm or an indexed Kubernetes Job the scheduler's host and the rank come from
    the cluster manager when not given. Raises tessera.Error when no scheduler answers or it refuses."""
    join = resolve_join(
        _setting("scheduler", scheduler, ""),
        _setting("scheduler_port", scheduler_port, 7070, int),
        _setting("rank", rank, -1, int),
        _setting("rank_offset", rank_offset, 0, int),
    )
    client = Client.connect(
        join["scheduler"],
        rank=join["rank"],
        device=_setting("device", device, "cpu"),
        token_file=_setting("token_file", token_file, ""),
        tls_cert=_setting("tls_cert", tls_cert, ""),
        tls_key=_setting("tls_key", tls_key, ""),
        tls_ca=_setting("tls_ca", tls_ca, ""),
        insecure=_setting("insecure", insecure, False, bool),
        connect_timeout_s=_setting("connect_timeout_s", connect_timeout_s, 120.0, float),
    )
    return _watch(Job(client))
