"""Train a tiny character-level GPT twice, with an eager and a compiled Muon step.

    python scripts/train_demo.py
    torchrun --nproc-per-node 2 scripts/train_demo.py --fsdp      # FSDP2 on gloo

The demo builds a small GPT-like causal language model in plain PyTorch and trains
two identical copies of it on the same batches, in lockstep:

* ``eager``:    ``opt.step()`` of :class:`muon_compile.MuonAdamW`, run eagerly;
* ``compiled``: ``muon_compile.compile_step(opt)``, then ``opt.step()``: the bucketed, fused step.

The forward and backward passes stay eager in both runs; only the optimizer step
differs. Muon updates the hidden matrices (attention and MLP weights) and AdamW the
embeddings, the output head and the LayerNorms (:func:`muon_compile.muon_param_groups`).

With ``--fsdp`` (under ``torchrun``) every block and the whole model are sharded with
FSDP2 (``fully_shard``) on a CPU mesh over gloo; each rank trains on its own batches,
the printed loss is the mean over ranks, and the compiled step runs the distributed
Newton–Schulz (one all-to-all pair per bucket instead of collectives per matrix).

Each step prints both losses, their difference and both optimizer-step times. The first
compiled call includes compilation, so it is reported on its own and left out of the
medians. The run ends with median timings, the largest loss difference and a verdict;
the exit code is 1 when the two loss curves differ by more than ``LOSS_TOLERANCE``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

import muon_compile

# Newton–Schulz runs in bf16 in both runs, but the compiled step batches and fuses it,
# so per-step bf16 rounding differs slightly and the curves drift apart a little.
LOSS_TOLERANCE = 5e-2

MUON_LR = 0.02
ADAMW_LR = 3e-3

CORPUS = """\
An optimizer is a small machine that turns gradients into changes of the weights. \
The simplest one takes a step against the gradient and hopes that the step is not too \
long. Momentum remembers where the last steps went and keeps rolling in that \
direction, which smooths out the noise of small batches. Adaptive methods such as Adam \
keep a running estimate of how large each gradient tends to be and divide by it, so \
that every weight moves at roughly the same pace.

Muon looks at a weight matrix as a whole instead of as a bag of numbers. It takes the \
momentum of the gradient and replaces it by the nearest orthogonal matrix, so that the \
update pushes equally hard in every direction the matrix can move. Computing that \
matrix exactly would need a singular value decomposition, which is slow on a GPU. \
Instead, Muon runs a few Newton-Schulz iterations: each one multiplies the matrix by \
itself a couple of times and mixes the results with fixed coefficients. Five rounds of \
matrix products in low precision are enough to bring every singular value close to one.

A compiler sees the same optimizer step from a different angle. Written in the plain \
way, the step visits one parameter at a time and launches a dozen tiny kernels for \
each of them. A model with a hundred matrices then spends most of its optimizer time \
waiting for kernels to start rather than doing arithmetic. The compiler can trace the \
whole step once, notice that many matrices share a shape, stack them into a batch and \
run the Newton-Schulz products for the whole batch at once. The small element-wise \
updates around them fuse into a few larger kernels that read each tensor only once.

None of this changes what the optimizer computes, only how it is scheduled. The same \
numbers go in and nearly the same numbers come out; the last bits may differ, because \
sums are taken in another order and low precision rounds a little differently. A good \
test of a compiled optimizer is therefore simple: train the same model twice, once \
with each step, and check that the two loss curves lie on top of each other while \
the compiled one runs faster.

The model in this demo is tiny. It reads a few characters, guesses the next one, and \
learns from its mistakes. After a few dozen steps it knows which letters are common, \
which ones follow a space, and that a full stop is usually followed by a capital. That \
is not much, but it is enough to watch a loss go down and to see two optimizers agree.
"""


# --------------------------------------------------------------------------- data
def encode_corpus(text: str) -> tuple[Tensor, int]:
    """The text as a 1-D tensor of character ids, and the vocabulary size."""
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long), len(vocab)


def make_batches(data: Tensor, steps: int, batch: int, context: int, seed: int) -> list[tuple[Tensor, Tensor]]:
    """``steps`` (inputs, targets) pairs of random windows, drawn from a seeded generator."""
    if len(data) <= context:
        raise ValueError(f"context {context} is too long for a corpus of {len(data)} characters")
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - context, (batch,), generator=generator)
        windows = torch.stack([data[s : s + context + 1] for s in starts.tolist()])
        batches.append((windows[:, :-1], windows[:, 1:]))
    return batches


# -------------------------------------------------------------------------- model
class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused qkv projection."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, d_model))


class MLP(nn.Module):
    """Linear(d, 4d) -> GELU -> Linear(4d, d), without biases."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, 4 * d_model, bias=False)
        self.down = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class TinyGPT(nn.Module):
    """Token and learned position embeddings, transformer blocks, final norm, untied head."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.token_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_emb(ids) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ----------------------------------------------------------------------- training
@dataclasses.dataclass
class StepResult:
    """One training step: its loss (before the update) and its wall times in ms."""

    loss: float
    opt_ms: float
    total_ms: float


def shard_with_fsdp2(model: "TinyGPT") -> "TinyGPT":
    """FSDP2 on a 1-D CPU mesh of all ranks: each block, then the whole model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def mean_over_ranks(value: float) -> float:
    """``value`` averaged over all ranks (itself when not distributed)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor(value, dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


class Trainer:
    """A model and its MuonAdamW optimizer, whose step is compiled or eager."""

    def __init__(self, model: nn.Module, compiled: bool) -> None:
        if dist.is_initialized():
            model = shard_with_fsdp2(model)
        self.model = model
        self.opt = muon_compile.MuonAdamW(muon_compile.muon_param_groups(model), lr=MUON_LR, adamw_lr=ADAMW_LR)
        if compiled:
            muon_compile.compile_step(self.opt)

    def train_step(self, inputs: Tensor, targets: Tensor) -> StepResult:
        """Forward, backward and optimizer step on one batch, timed."""
        start = time.perf_counter()
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        opt_start = time.perf_counter()
        self.opt.step()
        end = time.perf_counter()
        return StepResult(mean_over_ranks(loss.item()), (end - opt_start) * 1e3, (end - start) * 1e3)


def train_lockstep(model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> tuple[list[StepResult], list[StepResult]]:
    """Train an eager and a compiled copy of ``model`` on ``batches``, printing each step.

    The copies alternate step by step, so both see the same machine load.
    """
    eager = Trainer(copy.deepcopy(model), compiled=False)
    compiled = Trainer(copy.deepcopy(model), compiled=True)
    print(f"{'step':>4}  {'eager loss':>10}  {'compiled loss':>13}  {'|diff|':>9}  {'eager opt ms':>12}  {'compiled opt ms':>15}")
    eager_log, compiled_log = [], []
    for step, (inputs, targets) in enumerate(batches):
        e = eager.train_step(inputs, targets)
        c = compiled.train_step(inputs, targets)
        eager_log.append(e)
        compiled_log.append(c)
        compiled_ms = "(compile)" if step == 0 else f"{c.opt_ms:.2f}"
        print(f"{step:>4}  {e.loss:>10.4f}  {c.loss:>13.4f}  {abs(e.loss - c.loss):>9.2e}  {e.opt_ms:>12.2f}  {compiled_ms:>15}")
    print(f"compile (first call): {compiled_log[0].opt_ms / 1e3:.1f} s")
    return eager_log, compiled_log


# ------------------------------------------------------------------------ summary
def print_median(label: str, eager_ms: list[float], compiled_ms: list[float]) -> None:
    """One line: the two medians and eager / compiled."""
    e, c = statistics.median(eager_ms), statistics.median(compiled_ms)
    print(f"{label:<34} eager {e:8.2f} ms   compiled {c:8.2f} ms   speed-up x{e / c:.2f}")


def summarize(eager_log: list[StepResult], compiled_log: list[StepResult]) -> bool:
    """Print timings, the loss curves' agreement and progress; True when they agree."""
    print()
    if len(eager_log) > 1:
        # Step 0 is left out of both medians: its compiled call includes compilation.
        e_run, c_run = eager_log[1:], compiled_log[1:]
        print_median("median optimizer step (steps 1+)", [r.opt_ms for r in e_run], [r.opt_ms for r in c_run])
        print_median("median training step (fwd+bwd+opt)", [r.total_ms for r in e_run], [r.total_ms for r in c_run])
    else:
        print("(one step only: no timings beyond compilation)")
    diffs = [abs(e.loss - c.loss) for e, c in zip(eager_log, compiled_log)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    print(f"max |loss diff|: {diffs[worst]:.2e} (step {worst}), tolerance {LOSS_TOLERANCE:.0e}")
    print(
        f"loss first -> last: eager {eager_log[0].loss:.4f} -> {eager_log[-1].loss:.4f}, "
        f"compiled {compiled_log[0].loss:.4f} -> {compiled_log[-1].loss:.4f}"
    )
    agree = diffs[worst] <= LOSS_TOLERANCE
    print("loss curves agree" if agree else "loss curves DIFFER")
    return agree


# ---------------------------------------------------------------------------- cli
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    parser.add_argument("--d-model", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--context", type=int, default=32, help="characters per sequence (default 32)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per batch (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches (default 0)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--fsdp", action="store_true", help="shard with FSDP2 over the ranks torchrun started (gloo)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rank = 0
    if args.fsdp:
        dist.init_process_group("gloo")  # torchrun provides the rendezvous
        rank = dist.get_rank()
        if rank != 0:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- rank 0 reports for all
        print(f"FSDP2 over {dist.get_world_size()} ranks (gloo); each rank trains on its own batches")
    try:
        return run(args, rank)
    finally:
        if args.fsdp:
            dist.destroy_process_group()


def run(args: argparse.Namespace, rank: int) -> int:
    """Build the data and the model, train both copies, summarise; the exit code."""
    data, vocab = encode_corpus(CORPUS)
    batches = make_batches(data, args.steps, args.batch, args.context, args.seed + rank)
    torch.manual_seed(args.seed)
    model = TinyGPT(vocab, args.d_model, args.layers, args.heads, args.context)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"TinyGPT: vocab {vocab}, d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
        f"context {args.context}, batch {args.batch}, {n_params:,} parameters; "
        f"{args.steps} steps, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"uniform-guess loss ln({vocab}) = {math.log(vocab):.4f}\n")
    eager_log, compiled_log = train_lockstep(model, batches)
    return 0 if summarize(eager_log, compiled_log) else 1


if __name__ == "__main__":
    sys.exit(main())
