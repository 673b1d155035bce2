"""tessera.torch's runtime: joining the job (init), the SIGTERM and Ctrl-C handling that stops training after the
open step (stop_signal), OpenBLAS's threads, the job's data, and small helpers the other modules share.

The signal that asked this worker to stop lives here only, as runtime._signal: read it through this module (or
stop_signal()), never as a copy taken by `from .runtime import _signal`, which would not see init()'s handler set it.
"""

import signal

import torch

from .. import connect

# The SIGTERM or SIGINT that asked this worker to stop (0: none): _on_signal sets it, stop_signal() and
# DistributedModel (as runtime._signal) read it.
_signal = 0


def stop_signal():
    """The signal (signal.SIGTERM or signal.SIGINT) that asked this worker to stop, or 0."""
    return _signal


def _on_signal(number, frame):
    global _signal
    _signal = number
    # A second signal acts at once, as Python's defaults do.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"tessera: {signal.Signals(number).name}: stopping after this step", flush=True)


def init(handle_signals=True, **overrides):
    """Joins the job as a worker (see tessera.connect for the settings and their TESSERA_ variables); returns the
    Job. With handle_signals (the main thread only), SIGTERM and Ctrl-C stop training gracefully after the open
    step (see tessera.torch's documentation)."""
    job = connect(**overrides)
    if handle_signals:
        try:
            signal.signal(signal.SIGTERM, _on_signal)
            signal.signal(signal.SIGINT, _on_signal)
        except ValueError:
            pass  # not the main thread: the caller handles signals
    return job


def match_blas_threads(threads=None):
    """Gives OpenBLAS (the BLAS of Debian's PyTorch) `threads` threads, default torch.get_num_threads(); returns
    the number set, or None when this process has no OpenBLAS. torch.set_num_threads does not reach it, and its
    idle threads yield the CPU in a loop: on a worker they take it from the exchange's threads and from the
    servers beside it (a fifth of a worker's CPU on 2 cores, measured). DistributedModel calls it."""
    import ctypes

    threads = torch.get_num_threads() if threads is None else int(threads)
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libopenblas" in line}
    except OSError:
        return None
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            library = ctypes.CDLL(path)  # the copy already loaded
            library.openblas_set_num_threads(ctypes.c_int(threads))
            return threads
        except (OSError, AttributeError):
            continue
    return None


def load_split(job, train=True):
    """The job's training or test split, read as tessera-worker reads it (data { ... } of the job: Debian's
    Fashion-MNIST IDX files by default, or the seeded synthetic problem): (x float32 [n, features] in [0, 1],
    y int64 [n], classes). Raises tessera.Error NOT_FOUND naming a missing file."""
    x, y, classes = job.client.load_split(train)
    return torch.from_numpy(x), torch.from_numpy(y), classes


def _some(names, most=5):
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")
