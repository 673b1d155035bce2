"""tessera.torch's embedding layers: Embedding and EmbeddingBag, whose rows live in an embedding table on the
servers (a sparse parameter, keyed by 64-bit ids) instead of in the worker.

    class Ctr(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fields = tt.EmbeddingBag("fields", dim=16, optimizer="rowwise_adagrad", learning_rate=0.05)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        def forward(self, ids, offsets):
            return self.mlp(self.fields(ids, offsets))

    model = tt.DistributedModel(Ctr(), job)       # declares the table beside the dense parameters
    with model.step(batch_size=len(y)):            # rows pulled in forward, their gradients pushed at the end
        loss_fn(model(ids, offsets), y).backward()

A forward pulls the rows of the batch's distinct ids (each id once) and computes on them as on a leaf tensor; the
step block, when it ends, pushes that tensor's gradient (one row per distinct id; the rows of several forwards in
one block are summed per id) before the dense parameters' gradients leave, every step (none where the step did not
use the table): in SYNC the servers apply a step's rows once, the round's batch-weighted mean of every worker's
gradient with the table's optimizer stepping once per row, as one process on the union batch would, and the next
step's pulls see them. The rows' optimizer is the
table's own, on the servers (optimizer=: sgd, adagrad, rowwise_adagrad, ftrl, lazy_adam), whatever the job's
optimizer { kind } is; a row nobody trained reads its initial values (uniform in +-init_scale, a pure function
of the seed, the table's name and the id), or zeros while it waits for admission (admit_after).

Outside a step block (evaluation, torch.no_grad()) a forward only pulls. The layers take int64 ids; Embedding any
shape (the output adds a last dimension of dim), EmbeddingBag a [batch, n] tensor (n ids per example) or a flat
tensor with offsets (a variable number per example), pooled by sum or mean, with optional per_sample_weights
(sum only), as torch.nn.EmbeddingBag."""

import numpy as np
import torch
import torch.nn.functional as F

from .. import Error

_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "ftrl", "lazy_adam")


class Embedding(torch.nn.Module):
    """An embedding table on the servers, `dim` floats per row, looked up by 64-bit id (see the module's text).

    `optimizer` and its numbers (learning_rate, epsilon, initial_accumulator, beta1, beta2, ftrl_beta, l1, l2) are
    the rows' optimizer; `slots` the hash slots the table is cut into (0: 64); `admit_after` k: a row is created
    at its id's k-th gradient (before, its gradients are dropped); `expire_after_steps` N: a row no gradient
    reached for N clocks is removed; `evict_when_full`: when a server's row memory is full, a push evicts the least
    recently updated rows of its slots instead of being refused."""

    def __init__(self, name, dim, *, optimizer="sgd", learning_rate=0.0, init_scale=0.01, seed=0, slots=0,
                 admit_after=0, expire_after_steps=0, evict_when_full=False, **optimizer_options):
        super().__init__()
        if optimizer not in _OPTIMIZERS:
            raise Error(f"INVALID_ARGUMENT: table '{name}': optimizer {optimizer!r} is not one of {_OPTIMIZERS}")
        unknown = set(optimizer_options) - {"epsilon", "initial_accumulator", "beta1", "beta2", "ftrl_beta", "l1", "l2"}
        if unknown:
            raise Error(f"INVALID_ARGUMENT: table '{name}': unknown options {sorted(unknown)}")
        if int(dim) < 1:
            raise Error(f"INVALID_ARGUMENT: table '{name}': dim must be >= 1, got {dim}")
        self.table = str(name)
        self.dim = int(dim)
        self.spec = dict(name=self.table, dim=self.dim, optimizer=optimizer, learning_rate=float(learning_rate),
                         init_scale=float(init_scale), seed=int(seed), slots=int(slots), admit_after=int(admit_after),
                         expire_after_steps=int(expire_after_steps), evict_when_full=bool(evict_when_full),
                         **{k: float(v) for k, v in optimizer_options.items()})
        self._client = None  # set by DistributedModel
        self._pulled = []  # the open step's (distinct ids, rows leaf tensor), one per forward
        self.rows_updated = 0  # row updates the servers applied for this worker (so far)
        self.rows_refused = 0  # gradients of ids not admitted yet, dropped by the servers (so far)

    def _bind(self, client):
        self._client = client

    def _lookup(self, ids):
        """The rows of the distinct ids of `ids` (a tensor [distinct, dim] on ids' device, a leaf that records its
        gradient in a step block) and each id's place among them."""
        if self._client is None:
            raise Error(f"FAILED_PRECONDITION: table '{self.table}': wrap the model in tessera.torch.DistributedModel "
                        "before its first forward (its rows live on the servers)")
        if ids.dtype not in (torch.int64, torch.int32):
            raise Error(f"INVALID_ARGUMENT: table '{self.table}': ids must be int64, got {ids.dtype}")
        distinct, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        host_ids = np.ascontiguousarray(distinct.to("cpu", torch.int64).numpy())
        rows = np.empty((len(host_ids), self.dim), np.float32)
        self._client.pull_rows(self.table, host_ids, rows)
        leaf = torch.from_numpy(rows).to(ids.device)
        if torch.is_grad_enabled() and self.training:
            leaf.requires_grad_(True)
            self._pulled.append((host_ids, leaf))
        return leaf, inverse.reshape(ids.shape)

    def forward(self, ids):
        rows, inverse = self._lookup(ids)
        return F.embedding(inverse, rows)

    def _found_inf(self):
        """Does a row gradient of the open step hold an inf or NaN?"""
        return any(leaf.grad is not None and not bool(torch.isfinite(leaf.grad).all()) for _, leaf in self._pulled)

    def _push(self, batch_size, lr_factor=1.0, inv_scale=1.0, skip=False):
        """Sends the open step's row gradients (summed per id, times `inv_scale`: a gradient scaler's 1 / scale);
        called by the step block before the dense ones, every step: a step whose forwards did not use the table
        pushes no ids (in SYNC its servers' round still waits for this worker); `skip`: the step is skipped (its
        scaler found inf or NaN)."""
        pulled, self._pulled = self._pulled, []
        if pulled:
            ids = np.concatenate([i for i, _ in pulled])
            grads = np.concatenate([
                (leaf.grad.detach().to("cpu").numpy() if leaf.grad is not None
                 else np.zeros(tuple(leaf.shape), np.float32))
                for _, leaf in pulled]).astype(np.float32, copy=False)
        else:
            ids = np.empty(0, np.uint64)
            grads = np.empty((0, self.dim), np.float32)
        if skip:
            ids, grads = np.empty(0, np.uint64), np.empty((0, self.dim), np.float32)
        elif inv_scale != 1.0:
            grads = grads * np.float32(inv_scale)
        updated, refused = self._client.push_rows(self.table, ids, np.ascontiguousarray(grads, np.float32),
                                                  int(batch_size), lr_factor, skip)
        self.rows_updated += updated
        self.rows_refused += refused

    def _abandon(self):
        self._pulled = []

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.dim}, optimizer={self.spec['optimizer']!r}"


class EmbeddingBag(Embedding):
    """An Embedding whose forward pools each example's rows, as torch.nn.EmbeddingBag: `ids` [batch, n] (n ids
    per example), or flat `ids` with `offsets` (example b's ids start at offsets[b]); mode "sum" or "mean";
    per_sample_weights (mode sum) weigh each id's row."""

    def __init__(self, name, dim, *, mode="sum", **options):
        super().__init__(name, dim, **options)
        if mode not in ("sum", "mean"):
            raise Error(f"INVALID_ARGUMENT: table '{name}': mode must be 'sum' or 'mean', not {mode!r}")
        self.mode = mode

    def forward(self, ids, offsets=None, per_sample_weights=None):
        if offsets is None and ids.dim() != 2:
            raise Error(f"INVALID_ARGUMENT: table '{self.table}': ids must be [batch, n], or flat with offsets")
        rows, inverse = self._lookup(ids)
        return F.embedding_bag(inverse, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights)
