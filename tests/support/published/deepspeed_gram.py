import torch

from muon_corpus import KELLER, LR, MOMENTUM, WD, Entry, _momentum

# ------------------------------------------------------------ 14. deepspeedai/DeepSpeed (Gram NS)
#
# Read: deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641
#   deepspeed/runtime/zero/muon/original_muon.py
#     lines 36-65   the classic NS routine (selected by the "standard" method; not the default)
#     lines 68-139  the Gram NS routine (the default method, "gram")
#     lines 145-164 the per-parameter update function
#     lines 231-264 the single-device optimizer's step
# That file's ``compiler.compile()`` simply hands back ``torch.compile`` (deepspeed/runtime/compiler.py
# lines 108-113), hence a plain ``@torch.compile`` on each of the three functions below.


@torch.compile
def _plain_ns(G, n: int, dtype=torch.bfloat16):
    """The alternative method: a single fixed triple, in bf16 when the device supports it."""
    assert G.ndim >= 2
    a, b, c = KELLER
    work = dtype  # upstream: bf16 when the accelerator has it, otherwise fp32
    X = G.to(work)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(n):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


@torch.compile
def _gram_ns(G, n: int, dtype=torch.float16):
    """NS carried out on the small Gram matrix S: the polynomial factors accumulate in P (first
    set to Y with a added along its diagonal in place); at iteration 2 the iterate becomes P X,
    S is rebuilt from it and P cleared, so X is touched only at that reset and at the end.
    When the (wide) input has m <= n the ordinary loop is used instead."""
    assert G.ndim >= 2
    a, b, c = KELLER
    work = dtype  # upstream: fp16 when the accelerator has it, otherwise fp32
    X = G.to(work)
    if G.size(-2) > G.size(-1):
        X = X.mT

    n_rows, n_cols = X.size(-2), X.size(-1)

    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)

    if n_cols <= n_rows:
        for _ in range(n):
            A = X @ X.mT
            B = b * A + c * A @ A
            X = a * X + B @ X
        if G.size(-2) > G.size(-1):
            X = X.mT
        return X

    S = X @ X.mT
    P = None
    reset = 2

    for k in range(n):
        if k == reset and k != 0:
            X = P @ X
            S = X @ X.mT
            P = None

        Y = b * S + c * S @ S

        if P is None:
            P = Y.clone()
            if P.ndim == 2:
                P.diagonal().add_(a)
            else:
                P.diagonal(dim1=-2, dim2=-1).add_(a)
        else:
            P = a * P + Y @ P

        if k < n - 1 and (k + 1) != reset:
            T = a * S + Y @ S
            S = a * T + Y @ T

    if G.size(-2) > G.size(-1):
        X = X.mT @ P.mT
    else:
        X = P @ X
    return X


@torch.compile
def _update(g, buf, mu=0.95, iters=5, lookahead=True, method="gram",
            expert=False, dtype=torch.float16):
    """Momentum by lerp, Nesterov as an in-place lerp of the gradient, NS routine picked by
    name (Gram unless told otherwise), shape scale in place (out of place for expert
    groups), then a cast back to the gradient's dtype."""
    in_dtype = g.dtype
    buf.lerp_(g, 1 - mu)
    u = g.lerp_(buf, mu) if lookahead else buf
    if expert:
        orth = _gram_ns if method == "gram" else _plain_ns
        scale = max(1, u.size(-2) / u.size(-1)) ** 0.5
        u = orth(u, n=iters, dtype=dtype) * scale
    else:
        if u.ndim == 4:
            u = u.view(len(u), -1)
        if method == "gram":
            u = _gram_ns(u, n=iters, dtype=dtype)
        else:
            u = _plain_ns(u, n=iters, dtype=dtype)
        u *= max(1, g.size(-2) / g.size(-1)) ** 0.5
    if u.dtype != in_dtype:
        u = u.to(in_dtype)
    return u


def deepspeed_gram(params, dtype):
    """The single-device Muon step at its defaults (Gram method, Nesterov, 5 iterations): a
    zero gradient filled in where none exists, the update from the compiled update function,
    decoupled decay, then ``add_`` of the reshaped update.

    Omitted: the multi-rank optimizers' plumbing (padding to the world size, striding over
    ranks, ``dist.all_gather``), the ZeRO-side subclass that only applies an update computed
    elsewhere, the AdamW branch, param-group/config checks and the closure. Momentum is
    allocated up front (``_momentum``) rather than lazily in optimizer state, and ``dtype``
    takes the place of the accelerator's fp16/bf16 capability test. The per-parameter flag
    is still looked up by DeepSpeed's attribute name, ``is_expert_group``."""
    bufs = _momentum(params)
    method = "gram"

    def step():
        for p, buf in zip(params, bufs):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            u = _update(p.grad, buf, mu=MOMENTUM, method=method,
                        expert=getattr(p, "is_expert_group", False), dtype=dtype)
            p.mul_(1 - LR * WD)
            p.add_(u.reshape(p.shape), alpha=-LR)

    return step


ENTRY = Entry("deepspeed_gram",
              "deepspeedai/DeepSpeed deepspeed/runtime/zero/muon/original_muon.py (Gram Newton–Schulz, the default method)",
              "distributed library", deepspeed_gram, torch.float16)
