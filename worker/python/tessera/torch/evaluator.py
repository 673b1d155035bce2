"""tessera.torch's evaluation: a classifier's accuracy and loss (evaluate), and scoring copies of a model on a thread
of its own while training goes on (BackgroundEvaluator)."""

import torch


def evaluate(module, x, y, batch_size=1000):
    """(accuracy, mean cross-entropy loss) of a classifier `module` on (x, y), in eval mode and without gradients
    (BatchNorm uses its running statistics); the module's mode is restored. Score a DistributedModel's module
    after settle()."""
    was_training = module.training
    module.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            logits = module(x[start:start + batch_size])
            target = y[start:start + batch_size]
            correct += (logits.argmax(1) == target).sum().item()
            loss += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
    module.train(was_training)
    return correct / max(1, len(x)), loss / max(1, len(x))


class BackgroundEvaluator:
    """Scores copies of a model on a thread of its own while training goes on, as tessera-worker's evaluator does:
    an evaluating worker does not fall behind the others (in ASYNC it would push ever staler gradients). `copy`
    is a module of the same architecture that receives the values (and buffers) offered; PyTorch releases the
    GIL in its kernels, so the thread computes beside the training loop.

        scorer = tt.BackgroundEvaluator(make_net(), test_x, test_y)
        ...
        if model.clock % 200 == 0:
            model.settle()
            scorer.offer(net, model.clock)       # skipped while the previous copy is still being scored
        for clock, accuracy, loss in scorer.results():
            model.report(accuracy=accuracy, test_loss=loss, clock=clock)
        ...
        scorer.drain()                           # at the end: waits for the last score
    """

    def __init__(self, copy, x, y, threads=1):
        import threading

        self._copy = copy
        self._x, self._y = x, y
        self._threads = threads
        self._lock = threading.Lock()
        self._done = []
        self._thread = None
        self.last_clock = -1  # the clock of the last values offered and taken

    def offer(self, module, clock):
        """Copies `module`'s state and scores it on the thread; False (and nothing copied) while it is busy."""
        import threading

        if self._thread is not None and self._thread.is_alive():
            return False
        self._copy.load_state_dict(module.state_dict())
        self.last_clock = clock
        self._thread = threading.Thread(target=self._score, args=(clock,), daemon=True)
        self._thread.start()
        return True

    def _score(self, clock):
        torch.set_num_threads(self._threads)
        accuracy, loss = evaluate(self._copy, self._x, self._y)
        with self._lock:
            self._done.append((clock, accuracy, loss))

    def results(self):
        """The scores finished since the last call: [(clock, accuracy, loss)]."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def drain(self):
        """Waits for the copy being scored, then returns results()."""
        if self._thread is not None:
            self._thread.join()
        return self.results()
