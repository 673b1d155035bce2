"""tessera.torch's CUDA mirror: a CUDA model's parameters in pinned host memory, where the exchange reads and writes
(_HostMirror, used by DistributedModel)."""

import torch


class _HostMirror:
    """A CUDA model's parameters in pinned host memory: the values the exchange writes and the gradients it reads,
    and the copies between them and the GPU (gradients on a side stream, collected as each copy finishes)."""

    def __init__(self, params):
        self.params = params
        self.values = [torch.empty(p.shape, dtype=torch.float32, pin_memory=True) for p in params]
        for v, p in zip(self.values, params):
            v.copy_(p.detach())
        self.grads = [[torch.zeros(p.shape, dtype=torch.float32, pin_memory=True) for p in params] for _ in range(2)]
        self.stream = torch.cuda.Stream(device=params[0].device)
        self.copying = []  # (event, index) of gradients on their way to the host
        self.values_copied = None  # an event after the last copies of values to the GPU

    def copy_gradient(self, i, grads):
        """Starts the copy of params[i].grad into grads[i] once the computing stream has produced it."""
        p = self.params[i]
        self.stream.wait_stream(torch.cuda.current_stream(p.device))
        with torch.cuda.stream(self.stream):
            grads[i].copy_(p.grad.detach(), non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        p.grad.record_stream(self.stream)
        self.copying.append((event, i))

    def copied(self, wait):
        """Indices whose gradient copies are in (all of them with wait)."""
        done, pending = [], []
        for event, i in self.copying:
            if wait:
                event.synchronize()
            (done if wait or event.query() else pending).append((event, i))
        self.copying = pending
        return [i for _, i in done]

    def load_values(self, indices):
        for i in indices:
            self.params[i].data.copy_(self.values[i], non_blocking=True)
        self.values_copied = torch.cuda.Event()
        self.values_copied.record()

    def values_free(self):
        """Waits until the GPU has read the last values copied (the next exchange writes over them)."""
        if self.values_copied is not None:
            self.values_copied.synchronize()
