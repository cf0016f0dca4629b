"""Corpus entry ``dion_generator`` (issue 61; requested under the name ``dion_sorted``):
the Muon of microsoft/dion as it was before the mega-batching rewrite. Its step gives each
matrix to a small async runtime as a Python generator (one task per parameter on one device).

Read: microsoft/dion@d53bd2dc67a432c622be681f80c679cfd12fd3b5 (2026-03-30, the commit just
before 6eacfe1, which moved Muon onto a mega-batched distributed base class)
  dion/muon.py:86-140 (group defaults, NS selection), 142-180 (step), 182-192 (lazy state),
      194-315 (building the Muon tasks), 402-541 (the per-batch async update), 544-572 (before
      orthogonalisation), 575-608 (after orthogonalisation), 611-628 (the NS wrapper),
      644-653 (spectral lr), 656-684 (the default NS routine)
  dion/opt_utils.py:48-76 (batching and padding helpers), 79-145 (the task and runtime classes)
microsoft/dion contains no ``sorted(..., key=lambda p: p.data_ptr())`` at any point (HEAD 0a059a4
or earlier), so the per-parameter generator is the spelling reproduced. At HEAD (0a059a4) the
generator is still there but yields one task per (shape, sharding, dtype) group over a
``torch.stack`` of that group (dion/muon.py:112-191, dion/megabatch_base.py:635-881): a stacked
loop per shape.

Reproduced exactly: the ``+= 1`` on the group's step count; groups sorted by algorithm into
three task generators, joined with ``itertools.chain`` and driven by the runtime with a limit of
3 concurrent tasks (a task advances its generator as soon as it is built; the runtime calls
``next`` on live tasks each round); the batching generator (keyed by shape, sharding, dtype,
batches of world size 1) and the padding helper; lazily made momentum; per group and per step,
the hyperparameters (lr, mu, decay, epsilon) wrapped in 0-D tensors; the per-batch update as a
generator function whose only ``yield`` is in the distributed branch, so on one device it
finishes within the first ``next``; the three ``@torch.compile(fullgraph=True)`` helpers
(foreach momentum plus the bf16 cast ahead of communication; foreach decay and update; the NS
routine with its five per-iteration triples and ``X / (norm + epsilon)``); the flatten
reshaping; the spectral lr ``lr * sqrt(fan_out / fan_in)`` on the 0-D lr tensor.
Upstream defaults: no Nesterov, lr rule "spectral_norm", no flatten, epsilon 1e-8, no cautious
decay (the cautious path of the post-orthogonalisation helper is still present).

Omitted (distributed plumbing only): DTensor shard detection and its checks; both distributed
branches of the per-batch update (shard all-to-all, per-rank all-gather), replaced by a
``NotImplementedError`` that leaves the function a generator; splitting batch-sharded 3-D
DTensors into per-parameter tasks; ``to_local`` (identity for plain tensors); the Lion and AdamW
task builders (no such groups: empty generators take their place); the closure; constructor
checks; the Triton / user NS options (the default NS is kept). The NS routine hard-codes
bf16, as upstream's does: the entry's ``dtype`` is not used, and the exact evaluation makes its
casts fp64 (``numerics.exact_step``).
"""

import math
from collections import defaultdict
from itertools import chain

import torch

from muon_corpus import LR, MOMENTUM, WD, Entry


# ------------------------------------------------------------------------- opt_utils

def _batches(params, size):
    """A generator: bucket by (shape, sharding, dtype), then slice each bucket into batches."""
    buckets = defaultdict(list)
    for p in params:
        shard = None  # upstream: the DTensor placements
        buckets[(p.shape, shard, p.dtype)].append(p)
    for bucket in buckets.values():
        for i in range(0, len(bucket), size):
            yield bucket[i : i + size]


def _pad(batch, size):
    assert len(batch) > 0
    assert len(batch) <= size
    while len(batch) < size:
        batch.append(torch.empty_like(batch[0]))
    return batch


class _Task:
    """Wraps a generator and advances it to its next ``yield``; built already advanced once."""

    def __init__(self, gen):
        self._gen = gen
        self.run()

    def run(self):
        try:
            next(self._gen)
            return True
        except StopIteration:
            pass
        return False


class _Runner:
    """Holds at most ``limit`` live tasks, advancing every one of them once per round."""

    def __init__(self, source, limit):
        if limit <= 0:
            raise ValueError(f"{limit=} must be positive")
        self._source = source
        self._limit = limit

    def _pull(self):
        try:
            return next(self._source)
        except StopIteration:
            return None

    def run(self):
        more = True
        live = []
        while more or live:
            still = []
            if more and len(live) < self._limit:
                fresh = self._pull()
                if fresh is not None:
                    still.append(fresh)
                else:
                    more = False
            for task in live:
                if task.run():
                    still.append(task)
            live = still


# ---------------------------------------------------------------------------- muon.py

@torch.compile(fullgraph=True)
def _pre(gs, ms, mu, lookahead):
    dtype = ms[0].dtype
    gs = [g.to(dtype=dtype) for g in gs]
    torch._foreach_mul_(ms, mu)
    torch._foreach_add_(ms, gs)
    if lookahead:
        us = torch._foreach_mul(ms, mu)
        torch._foreach_add_(us, gs)
    else:
        us = ms
    us = [u.to(dtype=torch.bfloat16) for u in us]  # cast ahead of the (absent) communication
    return us


@torch.compile(fullgraph=True)
def _post(xs, us, lr, lr_adj, wd, cautious=False):
    if cautious:
        k = lr * wd
        mask = torch._foreach_mul(xs, us)
        mask = torch._foreach_sign(mask)
        mask = torch._foreach_add(mask, 1)
        mask = torch._foreach_minimum(mask, 1)
        dec = torch._foreach_mul(xs, mask)
        dec = torch._foreach_mul(dec, k)
        torch._foreach_sub_(xs, dec)
    else:
        torch._foreach_mul_(xs, 1 - lr * wd)
    us = torch._foreach_mul(us, lr_adj)
    torch._foreach_sub_(xs, us)


def _orth(X, ns_fn, flat, eps):
    shape = X.shape
    if flat and X.ndim >= 3:
        X = X.flatten(start_dim=1)
    elif X.ndim >= 4:
        X = X.flatten(end_dim=-3)
    return ns_fn(X, epsilon=eps).reshape(shape)


def _spectral_lr(lr, shape, flat):
    if flat:
        rows = shape[0]
        cols = math.prod(shape[1:])
    else:
        rows, cols = shape[-2:]
    return lr * math.sqrt(rows / cols)


@torch.compile(fullgraph=True)
def _ns(G, epsilon=1e-7):
    coeffs = [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ]
    X = G.to(dtype=torch.bfloat16)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + epsilon)
    for a, b, c in coeffs:
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def _batch_update(xs, gs, ms, lr, mu, wd, eps, lookahead, flat, lr_rule,
                  rank, world, shard=None, pg=None,
                  ns_fn=None, cautious=False):
    """Generator function; a ``yield`` appears only on the distributed path."""
    assert len(xs) == len(gs)
    assert len(xs) == len(ms)
    us = _pre(gs=gs, ms=ms, mu=mu, lookahead=lookahead)
    if shard is not None or len(us) > 1:
        # shard all-to-all / one-matrix-per-rank all-gather: not reproduced
        raise NotImplementedError("multi-rank paths")
        yield
    else:
        assert len(us) == 1
        us[0] = _orth(us[0], ns_fn=ns_fn, flat=flat, eps=eps)
    if lr_rule is None:
        lr_adj = lr
    elif lr_rule == "spectral_norm":
        lr_adj = _spectral_lr(lr, xs[0].shape, flat=flat)
    else:
        raise ValueError(f"unrecognised lr rule: {lr_rule}")
    _post(xs=xs, us=us, lr=lr, lr_adj=lr_adj, wd=wd,
          cautious=cautious)


def _no_tasks(groups):
    """Placeholder for the Lion / AdamW task builders (never given groups here)."""
    for group in groups:
        raise NotImplementedError(group["kind"])
    yield from ()


def dion_generator(params, dtype):
    """dion's pre-mega-batching Muon step on a single device: a generator of tasks over
    same-shape batches holding one parameter each, driven by dion's async runtime (``dtype``
    unused: its NS is bf16, as upstream's)."""
    groups = [dict(params=list(params), lr=LR, mu=MOMENTUM, wd=WD, cautious=False,
                   kind="muon", count=0, eps=1e-8, lookahead=False, flat=False,
                   lr_rule="spectral_norm")]
    state = defaultdict(dict)  # per-parameter optimizer state
    rank, world, pg = 0, 1, None
    ns_fn = _ns

    def state_for(p, kind):
        st = state[p]
        if not st:
            st["buf"] = torch.zeros_like(p)
            if kind == "adamw":
                st["sq"] = torch.zeros_like(p)
        return st

    def muon_tasks(todo, kind="muon"):
        for group in todo:
            assert group["kind"] == kind
            assert all(p.ndim >= 2 for p in group["params"]), "only matrices are supported"
            live = [p for p in group["params"] if p.grad is not None]
            if not live:
                continue
            kw = dict(
                lr=torch.tensor(group["lr"]),
                mu=torch.tensor(group["mu"]),
                wd=torch.tensor(group["wd"]),
                eps=torch.tensor(group["eps"]),
                lookahead=group["lookahead"],
                flat=group["flat"],
                lr_rule=group["lr_rule"],
                rank=rank,
                world=world,
                pg=pg,
                ns_fn=ns_fn,
                cautious=group["cautious"],
            )
            for batch in _batches(live, size=world):
                grads = [p.grad for p in batch]
                sts = [state_for(p, kind) for p in batch]
                bufs = [s["buf"] for s in sts]
                shard = None  # plain tensors carry no DTensor placements
                yield _Task(
                    _batch_update(
                        xs=_pad(batch, world),
                        gs=_pad(grads, world),
                        ms=_pad(bufs, world),
                        shard=shard,
                        **kw,
                    )
                )

    def step():
        m_groups, l_groups, a_groups = [], [], []
        for group in groups:
            group["count"] += 1
            kind = group["kind"]
            if kind == "muon":
                m_groups.append(group)
            elif kind == "lion":
                l_groups.append(group)
            elif kind == "adamw":
                a_groups.append(group)
            else:
                raise ValueError(f"unrecognised algorithm: {kind}")
        m_tasks = muon_tasks(m_groups)
        l_tasks = _no_tasks(l_groups)
        a_tasks = _no_tasks(a_groups)
        tasks = chain(m_tasks, l_tasks, a_tasks)
        runner = _Runner(tasks, limit=3)
        runner.run()

    return step


ENTRY = Entry("dion_generator", "microsoft/dion@d53bd2d dion/muon.py + dion/opt_utils.py (one async task per parameter)",
              "distributed library", dion_generator, torch.bfloat16,
              graphs=2)  # the state made at the first step, the group's count a Python int
