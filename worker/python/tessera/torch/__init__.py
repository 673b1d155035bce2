"""tessera.torch: a PyTorch model trained through the servers.

    import torch, tessera.torch as tt

    job = tt.init()                                   # joins from the environment tessera-launch sets
    x, y, classes = tt.load_split(job, train=True)    # the job's data (Fashion-MNIST's IDX files by default)
    model = tt.DistributedModel(net, job)             # declares every parameter; rank 0's values start the job
    for indices in model.sampler(len(x)):             # this worker's slice of each step's global batch
        with model.step(batch_size=len(indices)):     # no local optimizer: the job's runs on the servers
            loss_fn(model(x[indices]), y[indices]).backward()
        if job.rank == 0 and model.clock % 100 == 0:
            model.report(accuracy=score(net), loss=...)   # the summary, metrics.jsonl, /metrics, the dashboard
    model.done()

How a step runs: the step's gradients are what its backward() calls accumulated, sent when the block ends; with
overlap=True each parameter's gradient leaves as soon as the step's last backward has accumulated it (a hook on
its gradient accumulator). The forward of each module waits for the new values of that module's own parameters
only (a forward pre-hook), which arrive while the modules before it compute; a parameter read outside a forward of
its own module (a child's weight used by its parent) is seen when its gradient comes, and from the next step on
the model's forward waits for it first.

What a step block may do with gradients (the servers' optimizer takes each step's gradient as backward made it):
- several backward() calls (gradient accumulation over micro-batches): the step sends the sum of their
  gradients, as PyTorch's .grad holds it. With overlap=True, run every backward but the last inside
  model.no_sync() (as with DDP): those accumulate here only, and the last one's gradients leave as it computes
  them; a second backward outside no_sync() that reaches a gradient already sent makes the block raise
  tessera.Error when it ends.
- a parameter that no backward reached (an unused branch) sends zeros: the servers' optimizer steps on a zero
  gradient, as torch.optim does when .grad holds zeros (zero_grad(set_to_none=False)): momentum still moves it.
- an edit of a gradient after backward (clip_grad_norm_, unscaling, masking, a new .grad) cannot be honoured by
  an optimizer that runs on the servers over the workers' sum: the block raises tessera.Error naming the
  parameter, and without overlap nothing of the step has left (with overlap, the edited gradient had already
  left as backward made it). Edits through .data or the NumPy memory are not seen. What the servers' path does
  honour: a gradient scaler passed to model.step(batch_size, scaler=...) (the block unscales, and skips a step with
  an inf or NaN on every worker alike) and a learning rate the script's lr_scheduler sets through ServerOptimizer.
  Global-norm clipping there is the job's: optimizer { clip_global_norm: ... } (clip_grad_norm_ on the round's
  mean gradient, over every server's chunks). Any other recipe needs optimizer { kind: SCRIPT } and
  DistributedOptimizer. On the CPU the values are
written straight into the parameters' memory and the gradients are read from memory the parameters' .grad views:
nothing is copied. A CUDA model keeps a pinned host copy of each parameter: each gradient is copied there on a
side stream as backward finishes it and sent once its copy is in; each parameter's values are copied back to the
GPU before the forward that reads them.

The loop ends when the job does (the clock gate says stop: max_steps, the target accuracy, the scheduler's own
stop), when this worker reaches the job's max_steps or max_epochs, or after SIGTERM or Ctrl-C: init() makes
those finish the open step, after which done() tells the scheduler this worker stopped (as tessera-worker does)
and the script exits 0 after SIGTERM, 130 after Ctrl-C. A second signal ends the process at once.

Module buffers (BatchNorm's running statistics) follow rank 0: rank 0 (while it is away, the lowest-ranked worker
there) sends its floating-point buffers to the servers every `buffer_every` steps (and at done()), and the other
ranks take them before their next step, so every worker normalises with the same statistics, a checkpoint holds
them, and a restarted worker starts from them.
Integer buffers (num_batches_tracked) stay each worker's own. buffers="local" keeps every buffer local.

The package, a module per concern (every public name is here, as tessera.torch.X):
- runtime: init, stop_signal (the signal handling), match_blas_threads, load_split
- sampler: Sampler
- evaluator: evaluate, BackgroundEvaluator
- model: DistributedModel (the exchange, the hooks, buffers, rollbacks); step: its step block and gradient scalers
- optimizer: ServerOptimizer, DistributedOptimizer and a script optimizer's state on the servers
- cuda_mirror: a CUDA model's pinned host copy of its parameters
- embedding: Embedding and EmbeddingBag, layers whose rows live in an embedding table on the servers
"""

from .embedding import Embedding, EmbeddingBag
from .evaluator import BackgroundEvaluator, evaluate
from .model import DistributedModel
from .optimizer import DistributedOptimizer, ServerOptimizer
from .runtime import init, load_split, match_blas_threads, stop_signal
from .sampler import Sampler

__all__ = ["BackgroundEvaluator", "DistributedModel", "DistributedOptimizer", "Embedding", "EmbeddingBag", "Sampler", "ServerOptimizer", "evaluate",
           "init", "load_split", "match_blas_threads", "stop_signal"]
