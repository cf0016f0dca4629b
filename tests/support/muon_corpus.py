"""A corpus of public Muon implementations, each re-expressed as a small optimizer step that
keeps the implementation's spelling of the step and of its Newton–Schulz loop (dtype,
transposition, norm, eps handling, coefficient schedule, product form, buffers, update).

The code is written for this test suite; only the shape of each loop follows its source,
named in ``Entry.source`` (read late 2026). ``docs/testing.md`` lists the entries and
what each one exercises.

Every entry's ``make(params, dtype)`` returns ``step()``, one optimizer step over
``params`` (their ``.grad`` set by the caller) with its state kept between calls; ``dtype``
replaces the implementation's Newton–Schulz compute dtype, so the same code evaluated with
``torch.float64`` gives the exact reference the rewrite is compared with.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable

import contextlib

import torch
import torch.nn.functional as F

from muon_compile.ns.coefficients import PRESETS
from ns_forms import KELLER, POLAR, exact_torch_muon
from helpers import GraphCapture, make_params, set_grads
from numerics import exact_step

YOU_QUINTIC = PRESETS["quintic"].coefficients  # the five per-iteration triples Dion and timm default to
LR, WD, MOMENTUM = 0.02, 0.1, 0.95

Step = Callable[[], None]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One public implementation: where its spelling comes from and a step written that way."""

    name: str
    source: str
    kind: str  # optimizer library | training repository | distributed library | vision library
    make: Callable[[list[torch.Tensor], torch.dtype], Step]
    dtype: torch.dtype  # the implementation's Newton–Schulz compute dtype
    stacks: bool = False  # one loop per stack of same-shape matrices (else one per matrix)
    logs_in_loop: bool = False  # a logging call in the step or loop (one graph only with muon_compile.compile.tracing)
    today: str | None = None  # not yet recognised: what the backend meets (a rejection or a graph break)
    loops_of: Callable[[list], int] | None = None  # the step's own loop count, where stacks does not say it
    # graphs its compiled step makes over a few steps: 2 where the first step makes the state or
    # a step count in a Python int changes the second step's graph (then no more)
    graphs: int = 1
    # the step transposes a tall matrix itself before its loop, so its loops see wide matrices only
    transposes_tall: bool = False

    def step(self, params, dtype: torch.dtype | None = None) -> Step:
        """The step of ``params``, Newton–Schulz in ``dtype`` (the entry's own by default); in fp64
        the exact evaluation, the code's hard-coded bf16 casts made fp64 too (``numerics.exact_step``)."""
        step = self.make(params, dtype or self.dtype)
        return exact_step(step) if dtype is torch.float64 else step

    def loops(self, shapes) -> int:
        """How many Newton–Schulz loops one step of ``shapes`` runs."""
        if self.loops_of is not None:
            return self.loops_of(shapes)
        return len(set(map(tuple, shapes))) if self.stacks else len(shapes)


def _momentum(params):
    return [torch.zeros_like(p) for p in params]


def _is_tall(t):
    return t.size(-2) > t.size(-1)


# ------------------------------------------------------------- 1. KellerJordan/Muon

def _keller_ns(G, steps=5, dtype=torch.bfloat16):
    a, b, c = KELLER
    X = G.to(dtype)
    if _is_tall(G):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if _is_tall(G):
        X = X.mT
    return X


def keller_muon(params, dtype):
    """Lerp momentum, Nesterov by lerping the gradient in place, shape scale, decoupled decay."""
    bufs = _momentum(params)

    def step():
        for p, buf in zip(params, bufs):
            g = p.grad
            buf.lerp_(g, 1 - MOMENTUM)
            u = g.lerp_(buf, MOMENTUM)
            u = _keller_ns(u, dtype=dtype)
            u *= max(1, g.size(-2) / g.size(-1)) ** 0.5
            p.mul_(1 - LR * WD)
            p.add_(u.reshape(p.shape), alpha=-LR)

    return step


# ------------------------------------------------------- 2. KellerJordan/modded-nanogpt

def _modded_polar_express(G, dtype=torch.bfloat16):
    """Batched Polar Express into preallocated buffers (the source's Triton X X^T and
    ``b A + c A A`` kernels spelled with their torch equivalents), tall stacks multiplied
    from the right, buffers swapped each iteration."""
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * (1 + 2e-2) + 1e-6)
    X = X.contiguous()
    n = min(X.size(-2), X.size(-1))
    A = torch.empty(*X.shape[:-2], n, n, dtype=X.dtype, device=X.device)
    B = torch.empty_like(A)
    C = torch.empty_like(X)
    for a, b, c in POLAR[:5]:
        if _is_tall(X):
            torch.bmm(X.mT, X, out=A)
            torch.baddbmm(A, A, A, beta=b, alpha=c, out=B)
            torch.baddbmm(X, X, B, beta=a, out=C)
        else:
            torch.bmm(X, X.mT, out=A)
            torch.baddbmm(A, A, A, beta=b, alpha=c, out=B)
            torch.baddbmm(X, B, X, beta=a, out=C)
        X, C = C, X
    return X


def modded_nanogpt(params, dtype):
    """Same-shape parameters stacked; momentum as a 0-D tensor; one loop per stack."""
    groups = [[p for p in params if p.shape == s] for s in dict.fromkeys(p.shape for p in params)]
    bufs = [torch.zeros(len(g), *g[0].shape, device=g[0].device) for g in groups]
    momentum = torch.tensor(MOMENTUM)
    lr = torch.tensor(LR)

    def step():
        for group, buf in zip(groups, bufs):
            grads = torch.stack([p.grad for p in group])
            m = momentum.to(grads.dtype)
            buf.lerp_(grads, 1 - m)
            g = grads.lerp_(buf, m)
            v = _modded_polar_express(g, dtype=dtype)
            scale = max(1, group[0].size(-2) / group[0].size(-1)) ** 0.5
            for p, u in zip(group, v.unbind(0)):
                p.mul_(1 - lr * WD)
                p.sub_(lr * scale * u.to(p.dtype))

    return step


# ------------------------------------------------------------------ 3. MoonshotAI/Moonlight

@torch.compile
def _moonlight_ns(G, steps, dtype):
    assert G.dim() == 2
    a, b, c = KELLER
    X = G.to(dtype)
    if G.size(0) > G.size(1):
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


def moonlight(params, dtype):
    """Undampened momentum, Nesterov by ``add``, an NS function under its own ``@torch.compile``,
    updates through ``p.data`` with an lr matched to AdamW's RMS."""
    bufs = _momentum(params)

    def step():
        for p, buf in zip(params, bufs):
            g = p.grad
            buf.mul_(MOMENTUM).add_(g)
            g = g.add(buf, alpha=MOMENTUM)
            u = _moonlight_ns(g, 5, dtype)
            adjusted = LR * 0.2 * math.sqrt(max(p.shape[0], p.shape[1]))
            p.data.mul_(1 - LR * WD)
            p.data.add_(u, alpha=-adjusted)

    return step


# ------------------------------------------------------------- 4, 5. microsoft/dion

@torch.compile(fullgraph=True)
def _dion_ns(G, epsilon, dtype):
    X = G.to(dtype=dtype)
    if _is_tall(G):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + epsilon)
    for a, b, c in YOU_QUINTIC:
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if _is_tall(G):
        X = X.mT
    return X


@torch.compile(dynamic=False, fullgraph=True)
def _dion_buffers_ns(G, epsilon, dtype):
    """The Triton path's loop with its line functions spelled in torch: a contiguous
    iterate, buffers A, B, C allocated once, ``X, C = C, X`` after each iteration."""
    X = G.to(dtype=dtype)
    if _is_tall(G):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + epsilon)
    X = X.contiguous()
    A = torch.empty((*X.shape[:-1], X.size(-2)), dtype=X.dtype, device=X.device)
    B = torch.empty_like(A)
    C = torch.empty_like(X)
    line_3 = torch.baddbmm if X.dim() > 2 else torch.addmm
    for a, b, c in YOU_QUINTIC:
        torch.matmul(X, X.mT, out=A)
        line_3(A, A, A, beta=b, alpha=c, out=B)
        line_3(X, B, X, beta=a, out=C)
        X, C = C, X
    if _is_tall(G):
        X = X.mT
    return X


def _dion(ns):
    def make(params, dtype):
        """Foreach momentum (undampened), Nesterov, a bf16 update, epsilon as a 0-D tensor
        made in the step, decay then a foreach subtraction with a spectral lr scale."""
        bufs = _momentum(params)

        def step():
            grads = [p.grad for p in params]
            torch._foreach_mul_(bufs, MOMENTUM)
            torch._foreach_add_(bufs, grads)
            updates = [(m * MOMENTUM + g).to(torch.bfloat16) for m, g in zip(bufs, grads)]
            epsilon = torch.tensor(1e-8)
            outs = [ns(u, epsilon, dtype) for u in updates]
            torch._foreach_mul_(params, 1 - LR * WD)
            torch._foreach_sub_(params, [o * (LR * math.sqrt(p.size(0) / p.size(1))) for o, p in zip(outs, params)])

        return step

    return make


# --------------------------------------------------- 6. huggingface/pytorch-image-models

_timm_log = logging.getLogger("muon_corpus.timm")


def _timm_ns(G, steps=5, coefficients=YOU_QUINTIC, eps=1e-7, safety=1.0, dtype=torch.bfloat16):
    """A private copy, an in-place division by the scaled, clamped 2-norm over both dims,
    and ``addmm`` / ``baddbmm`` into buffers (``beta=0`` for the Gram product)."""
    X = G.to(dtype=dtype, copy=True)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X.div_(X.norm(2, dim=(-2, -1), keepdim=True).mul(safety).clamp_(min=eps))
    mm = torch.baddbmm if X.dim() == 3 else torch.addmm
    X = X.contiguous()
    A = torch.empty(*X.shape[:-1], X.size(-2), dtype=X.dtype, device=X.device)
    B = torch.empty_like(A)
    C = torch.empty_like(X)
    for a, b, c in coefficients[:steps]:
        mm(A, X, X.mT, beta=0.0, alpha=1.0, out=A)
        mm(A, A, A, beta=b, alpha=c, out=B)
        mm(X, B, X, beta=a, alpha=1.0, out=C)
        X, C = C, X
    if tall:
        X = X.mT
    return X


def timm(params, dtype):
    """Decay first, lerp momentum, a routing message logged in the step, an lr scaled to
    match AdamW's RMS."""
    bufs = _momentum(params)

    def step():
        _timm_log.info("muon step over %d matrices", len(params))
        for p, buf in zip(params, bufs):
            p.mul_(1 - LR * WD)
            buf.lerp_(p.grad, 1 - MOMENTUM)
            u = _timm_ns(buf.clone(), dtype=dtype)
            scale = 0.2 * math.sqrt(max(p.size(-2), p.size(-1)))
            p.add_(u, alpha=-LR * scale)

    return step


# ------------------------------------------------ 7. NVIDIA-NeMo/Emerging-Optimizers (Megatron)

def _nvidia_step(X, a, b, c):
    """One iteration as its own helper, Python floats as arguments."""
    A = X @ X.mT
    B = torch.addmm(A, A, A, alpha=c, beta=b)
    return torch.addmm(X, B, X, alpha=1.0, beta=a)


def _nvidia_ns(x, steps=5, eps=1e-15):
    """fp32 in; turned wide, then ``F.normalize`` over both dims; bf16 when the fp32 matmul
    precision is "medium" (set around the call by the step, read here); the "quintic" rows
    cycled by itertools, one helper call each; back to the input's dtype after the loop."""
    transpose = x.size(-2) > x.size(-1)
    if transpose:
        x = x.mT
    X = F.normalize(x, p=2, dim=(-2, -1), eps=eps)
    if torch.get_float32_matmul_precision() == "medium":
        X = X.to(torch.bfloat16)
    for a, b, c in itertools.islice(itertools.cycle(YOU_QUINTIC), steps):
        X = _nvidia_step(X, a, b, c)
    X = X.to(x.dtype)
    if transpose:
        X = X.mT
    return X


def emerging_optimizers(params, dtype):
    """The released step's order: decay ``p.add_(p, alpha=-wd lr)``, the momentum buffer itself
    orthogonalised (no Nesterov, its default), under "medium" precision (its default), scaled by
    ``sqrt(max(m, n))``. ``dtype`` says only whether this is the exact evaluation (fp64 for
    fp32; its bf16 cast made fp64 by ``numerics.exact_step``)."""
    bufs = _momentum(params)
    fp32 = torch.float64 if dtype is torch.float64 else torch.float32

    def step():
        for p, buf in zip(params, bufs):
            g = p.grad
            p.add_(p, alpha=-WD * LR)
            buf.lerp_(g, 1 - MOMENTUM)
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("medium")
            try:
                orth = _nvidia_ns(buf.to(fp32))
            finally:
                torch.set_float32_matmul_precision(before)
            p.add_(orth * max(p.size(0), p.size(1)) ** 0.5, alpha=-LR)

    return step


# ------------------------------------------------------------------ 8. nil0x9/flash-muon

def _flash_ns(G, steps=5, dtype=torch.bfloat16):
    """Two square buffers per call: X X^T into the first, the first times its own transpose
    (the Gram matrix is symmetric: A A^T = A^2) into the second, both reused per iteration."""
    a, b, c = KELLER
    X = G.to(dtype)
    if G.size(0) > G.size(1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    gram = torch.empty(X.size(0), X.size(0), dtype=X.dtype, device=X.device)
    gram_sq = torch.empty_like(gram)
    for _ in range(steps):
        torch.matmul(X, X.T, out=gram)
        torch.matmul(gram, gram.T, out=gram_sq)
        B = b * gram + c * gram_sq
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.mT
    return X


def flash_muon(params, dtype):
    bufs = _momentum(params)

    def step():
        for p, buf in zip(params, bufs):
            g = p.grad
            buf.lerp_(g, 1 - MOMENTUM)
            g = g.lerp_(buf, MOMENTUM)
            u = _flash_ns(g, dtype=dtype)
            p.mul_(1 - LR * WD)
            p.add_(u, alpha=-LR * max(1, p.size(0) / p.size(1)) ** 0.5)

    return step


# ------------------------------------------------------------- 9. kozistr/pytorch_optimizer

def _kozistr_ns(g, num_steps=5, eps=1e-7, safety_factor=1.0, weights=KELLER, dtype=torch.bfloat16):
    """No explicit copy (the cast makes one here), the norm scaled and clamped in place, the
    buffer loop of timm with one fixed triple."""
    x = g.to(dtype)
    if x.size(-2) > x.size(-1):
        x = x.mT
    x.div_(x.norm(2, dim=(-2, -1), keepdim=True).mul_(safety_factor).clamp_min_(eps))
    mm = torch.baddbmm if x.dim() > 2 else torch.addmm
    x = x.contiguous()
    a = torch.empty((*x.shape[:-1], x.size(-2)), dtype=x.dtype, device=x.device)
    b = torch.empty_like(a)
    c = torch.empty_like(x)
    for _ in range(num_steps):
        mm(a, x, x.mT, beta=0.0, alpha=1.0, out=a)
        mm(a, a, a, beta=weights[1], alpha=weights[2], out=b)
        mm(x, b, x, beta=weights[0], alpha=1.0, out=c)
        x, c = c, x
    if g.size(-2) > g.size(-1):
        x = x.mT
    return x


def pytorch_optimizer(params, dtype):
    bufs = _momentum(params)

    def step():
        for p, buf in zip(params, bufs):
            grad = p.grad
            buf.lerp_(grad, 1 - MOMENTUM)
            update = grad.lerp_(buf, MOMENTUM)
            update = _kozistr_ns(update, dtype=dtype)
            lr = LR * 0.2 * math.sqrt(max(p.size(0), p.size(1)))
            p.mul_(1 - LR * WD)
            p.add_(update.reshape(p.shape), alpha=-lr)

    return step


# ------------------------------------------------------------------------ 10. karpathy/nanochat

@torch.compile(dynamic=False, fullgraph=True)
def _nanochat_fused(grads, bufs, params, momentum, lr, wd, dtype):
    """One stack: lerp momentum with 0-D tensors, Polar Express (tall stacks multiplied from
    the right), then decay masked to where update and parameter agree in sign (cautious)."""
    bufs.lerp_(grads, 1 - momentum)
    g = grads.lerp_(bufs, momentum)
    X = g.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
    if g.size(-2) > g.size(-1):
        for a, b, c in POLAR[:5]:
            A = X.mT @ X
            B = b * A + c * (A @ A)
            X = a * X + X @ B
    else:
        for a, b, c in POLAR[:5]:
            A = X @ X.mT
            B = b * A + c * (A @ A)
            X = a * X + B @ X
    g = X.to(params.dtype)
    mask = (g * params) >= 0
    params.sub_(lr * g + lr * wd * params * mask)


def nanochat(params, dtype):
    groups = [[p for p in params if p.shape == s] for s in dict.fromkeys(p.shape for p in params)]
    bufs = [torch.zeros(len(g), *g[0].shape, device=g[0].device) for g in groups]
    momentum, wd = torch.tensor(MOMENTUM), torch.tensor(WD)
    lrs = [torch.tensor(LR * max(1, g[0].size(-2) / g[0].size(-1)) ** 0.5) for g in groups]

    def step():
        for group, buf, lr in zip(groups, bufs, lrs):
            stacked = torch.stack(group)
            _nanochat_fused(torch.stack([p.grad for p in group]), buf, stacked, momentum, lr, wd, dtype)
            torch._foreach_copy_(group, list(stacked.unbind(0)))

    return step


# -------------------------------------------------------------------- 11. torch.optim.Muon

def torch_optim_muon(params, dtype, lr=LR):
    """Unmodified ``torch.optim.Muon`` (its own code; in fp64 through the test patch); ``lr``
    a number or a 0-D tensor."""
    opt = torch.optim.Muon(params, lr=lr, weight_decay=WD)
    if dtype == torch.float64:
        def exact():
            with exact_torch_muon():
                opt.step()
        return exact
    return opt.step


# ------------------------------------------------------ 12. Dao-AILab/gram-newton-schulz

_GRAM_NS_COEFFICIENTS = [(a / 1.05, b / 1.05**3, c / 1.05**5) for a, b, c in POLAR[:5]]


def _gram_ns_standard(X, epsilon=1e-7, dtype=torch.float16):
    """Its standard (non-Gram) path: 3-D always, fp32 normalisation in place, then fp16,
    ``baddbmm`` for both polynomial products."""
    original = X.dtype
    if X.dim() == 2:
        X = X.unsqueeze(0)
    X = X.to(torch.float32)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X /= X.norm(dim=(-2, -1), keepdim=True) + epsilon
    X = X.to(dtype)
    for a, b, c in _GRAM_NS_COEFFICIENTS:
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, alpha=c, beta=b)
        X = torch.baddbmm(X, B, X, beta=a)
    if tall:
        X = X.mT
    return X.to(original).squeeze(0)


def gram_newton_schulz(params, dtype):
    bufs = _momentum(params)

    def step():
        grads = [p.grad for p in params]
        torch._foreach_mul_(bufs, MOMENTUM)
        torch._foreach_add_(bufs, grads)
        for p, buf in zip(params, bufs):
            u = _gram_ns_standard(buf.to(torch.bfloat16), dtype=dtype)
            p.mul_(1 - LR * WD)
            p.add_(u.to(p.dtype), alpha=-LR * 0.2 * math.sqrt(max(p.size(0), p.size(1))))

    return step


# ---------------------------------------------------------------- 13. ultralytics/ultralytics

def _ultralytics_ns(G, eps=1e-7, dtype=torch.bfloat16):
    """Divided in place before the transpose; a list of five equal triples."""
    X = G.to(dtype)
    X /= X.norm() + eps
    if G.size(0) > G.size(1):
        X = X.T
    for a, b, c in [KELLER] * 5:
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


def ultralytics(params, dtype):
    """MuSGD: a Muon step plus a plain SGD step on the same gradient."""
    bufs = _momentum(params)

    def step():
        for p, buf in zip(params, bufs):
            g = p.grad
            buf.lerp_(g, 1 - MOMENTUM)
            u = g.lerp(buf, MOMENTUM)
            u = _ultralytics_ns(u, dtype=dtype)
            u *= max(1, g.size(-2) / g.size(-1)) ** 0.5
            p.mul_(1 - LR * WD)
            p.add_(u, alpha=-LR)
            p.add_(g, alpha=-LR * 0.1)

    return step


CORPUS = {
    e.name: e
    for e in [
        Entry("keller_muon", "KellerJordan/Muon muon.py", "optimizer library", keller_muon, torch.bfloat16),
        Entry("modded_nanogpt", "KellerJordan/modded-nanogpt train_gpt.py (polar_express)", "training repository",
              modded_nanogpt, torch.bfloat16, stacks=True),
        Entry("moonlight", "MoonshotAI/Moonlight examples/toy_train.py", "training repository", moonlight, torch.bfloat16),
        Entry("dion_muon", "microsoft/dion dion/muon.py", "distributed library", _dion(_dion_ns), torch.bfloat16),
        Entry("dion_triton_fallback", "microsoft/dion dion/newton_schulz_triton.py", "distributed library",
              _dion(_dion_buffers_ns), torch.bfloat16),
        Entry("timm", "huggingface/pytorch-image-models timm/optim/muon.py", "vision library", timm, torch.bfloat16),
        Entry("emerging_optimizers", "NVIDIA-NeMo/Emerging-Optimizers muon_utils.py (Megatron-LM's Muon), without absl",
              "distributed library", emerging_optimizers, torch.bfloat16),
        Entry("flash_muon", "nil0x9/flash-muon flash_muon/muon.py", "optimizer library", flash_muon, torch.bfloat16),
        Entry("pytorch_optimizer", "kozistr/pytorch_optimizer optimizer/shampoo_utils.py", "optimizer library",
              pytorch_optimizer, torch.bfloat16),
        Entry("nanochat", "karpathy/nanochat nanochat/optim.py (muon_step_fused)", "training repository",
              nanochat, torch.bfloat16, stacks=True),
        Entry("torch_optim_muon", "pytorch/pytorch torch/optim/_muon.py", "optimizer library", torch_optim_muon,
              torch.bfloat16),
        Entry("gram_newton_schulz", "Dao-AILab/gram-newton-schulz (standard path)", "optimizer library",
              gram_newton_schulz, torch.float16),
        Entry("ultralytics", "ultralytics/ultralytics ultralytics/optim/muon.py (MuSGD)", "vision library",
              ultralytics, torch.bfloat16),
    ]
}

# Published code kept as it runs in the wild (tests/support/published/, one module per entry), joined
# here so every test and benchmark of the corpus takes them too; imported last, as those
# modules import this one's helpers.
from published import PUBLISHED  # noqa: E402


# How the tests run an entry: on wide, square, wide and tall matrices, three canonical shapes
# (8x24, 8x8, 8x32), so three buckets
SHAPES = [(24, 8), (8, 8), (8, 32), (32, 8)]


def corpus_shapes(entry):
    """Two matrices of each shape for entries that stack same-shape matrices, one otherwise."""
    return SHAPES * 2 if entry.stacks else SHAPES


def run_entry(entry, shapes, *, backend=None, dtype=None, steps=2, device="cpu"):
    """Parameters after ``steps`` steps of ``entry``: compiled with ``backend``, or eager
    (its own nested ``torch.compile`` calls disabled too) when ``backend`` is None."""
    params = make_params(shapes, device=device)
    step = entry.step(params, dtype)
    if backend is not None:
        step = torch.compile(step, backend=backend)
    eager = torch.compiler.set_stance("force_eager") if backend is None else contextlib.nullcontext()
    for s in range(steps):
        set_grads(params, 100 + s)
        with torch.no_grad(), eager:
            step()
    return [p.detach().clone() for p in params]


def dynamo_graphs(entry, shapes):
    """The graphs Dynamo hands a backend for one step of ``entry``."""
    capture = GraphCapture()
    run_entry(entry, shapes, backend=capture, steps=1)
    return capture.graphs


CORPUS.update(PUBLISHED)
