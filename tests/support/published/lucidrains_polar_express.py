"""Corpus entry ``lucidrains_polar_express`` (issue 61; requested under the name
``lucidrains_polar_spectral``): the Polar Express flavour of Muon that lucidrains ships in
adam-atan2-pytorch (its Polar/Adam-atan2 optimizer).

Read: lucidrains/adam-atan2-pytorch@b42d7cbe2905956d6eb973cd4feb1082645674e8
  adam_atan2_pytorch/polar_adam_atan2.py:20-38 (transpose helper; coefficient table, every
      triple but the last damped by 1.01), 40-82 (the Polar Express routine), 86-152 (the two
      parameter groups), 154-274 (step)

Not a spectral normalisation upstream: the Frobenius norm over the two matrix dims, clamped,
followed by a separate second division by the constant 1.01 (``t / norm.clamp(min=eps)`` then
``t / 1.01``). Both divisions are kept as two statements.

Kept: the loop over groups with ``filter(lambda p: ...)`` on a present gradient, the
``group.get(...)`` of the polar flag, lazily created state (step count, first moment), decay
ahead of momentum, the moment's ``lerp_`` (no Nesterov), the first bias correction computed
and never used, the einops-style pack to ``* i j`` after transposing, the two divisions, the
table padded by repeating its final triple, the loop ``A = t t^T; B = b A + c A A;
t = a t + B t``, unpack, transpose back, cast back, the out-of-place Adam-RMS matching scale
``sqrt(max(m, n)) * 0.2``, ``p.add_(update, alpha=-lr * a)`` with ``a = 1`` for the polar
group, and the Adam-atan2 path for the other group (empty here, since all probe parameters
are matrices).

Settings: the published bf16-cast option is on (upstream default off, which computes in the
parameter's dtype), so the cast branch runs, with ``.to(dtype)`` where upstream calls
``.bfloat16()``; decay WD, both lrs LR, the polar group's first-moment decay MOMENTUM.

Omitted: the closure, decoupled decay (off by default), regenerative regularisation and the
cautious mask (both inert by default: rate 0, factor 1), the constructor's assertions and the
set arithmetic that removes polar params from the rest, and a per-group bypass function (the
optimizer-wide default, ``ndim < 2 or ndim > 3``, is kept). einops cannot be imported in the
venv, so ``pack``/``unpack`` below are stand-ins covering the single pattern used (``'* i j'``).
"""

import math
from collections import defaultdict
from itertools import repeat

import torch

from muon_corpus import LR, MOMENTUM, WD, Entry

try:
    from einops import pack, unpack  # type: ignore[import-not-found]
except ImportError:
    def pack(ts, spec):
        """Stand-in for einops' pack with ``'* i j'`` and a single tensor: merge leading dims."""
        assert spec == "* i j" and len(ts) == 1
        (t,) = ts
        return t.reshape(-1, *t.shape[-2:]), [t.shape[:-2]]

    def unpack(t, leads, spec):
        """Stand-in for einops' unpack with ``'* i j'``: split the merged dims back out."""
        assert spec == "* i j" and len(leads) == 1
        return [t.reshape(*leads[0], *t.shape[-2:])]


def _present(v):
    return v is not None


def _swap(t):
    return t.transpose(-1, -2)


_TABLE = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]
# every row but the last divided by powers of 1.01 (a / s, b / s^3, c / s^5)
_DAMPED = [(a / 1.01, b / 1.01**3, c / 1.01**5) for (a, b, c) in _TABLE[:-1]] + [_TABLE[-1]]


def _polar(t, n=5, table=_DAMPED, cast=False, eps=1e-7,
           skip=None, dtype=torch.bfloat16):
    if _present(skip) and skip(t.ndim):
        return t
    shape = t.shape
    flip = shape[-2] > shape[-1]
    if flip:
        t = _swap(t)
    t, leads = pack([t], "* i j")
    in_dtype = t.dtype
    if cast:
        t = t.to(dtype)
    t = t / t.norm(dim=(-1, -2), keepdim=True).clamp(min=eps)
    t = t / 1.01
    rows = table[:n] + list(repeat(table[-1], max(0, n - len(table))))
    for a, b, c in rows:
        A = t @ _swap(t)
        B = b * A + c * A @ A
        t = a * t + B @ t
    (t,) = unpack(t, leads, "* i j")
    if flip:
        t = _swap(t)
    if cast:
        t = t.to(in_dtype)
    return t


def lucidrains_polar_express(params, dtype):
    """Two groups (Adam-atan2 for non-matrices, empty here; Polar Express for matrices); each
    parameter visited through ``filter(...)``; decay, momentum lerp, Polar Express applied to
    the momentum itself, RMS scale out of place, ``add_`` with ``-lr * a``."""
    skip = lambda ndim: ndim < 2 or ndim > 3  # noqa: E731
    shared = dict(mu2=0.99, a=1.27, b=1.0, wd=WD, iters=5, table=_DAMPED,
                  eps=1e-7, rms=0.2, cast=True)
    groups = [
        dict(shared, params=[], lr=LR, mu1=0.9, polar=False),
        dict(shared, params=list(params), lr=LR, mu1=MOMENTUM, rms_extra=0.2, polar=True),
    ]
    states = defaultdict(dict)  # per-parameter optimizer state

    def step():
        for group in groups:
            for p in filter(lambda p: _present(p.grad), group["params"]):
                polar = group.get("polar", False)
                g, lr, wd, mu1, mu2, a, b = (p.grad, group["lr"], group["wd"], group["mu1"],
                                             group["mu2"], group["a"], group["b"])
                state = states[p]
                if polar:
                    a = 1.0
                if wd > 0.0:
                    p.mul_(1.0 - lr * wd)
                if len(state) == 0:
                    state["k"] = 0
                    state["m"] = torch.zeros_like(g)
                    if not polar:
                        state["v"] = torch.zeros_like(g)
                m, k = state["m"], state["k"]
                k += 1
                corr1 = 1.0 - mu1**k
                if not polar:
                    v = state["v"]
                    corr2 = 1.0 - mu2**k
                m.lerp_(g, 1.0 - mu1)
                if not polar:
                    v.lerp_(g * g, 1.0 - mu2)
                    denom = v.mul(b * b / corr2).sqrt_()
                    u = m.mul(1.0 / corr1).atan2_(denom)
                else:
                    u = _polar(
                        m,
                        n=group["iters"],
                        table=group["table"],
                        eps=group["eps"],
                        cast=group["cast"],
                        skip=skip,
                        dtype=dtype,
                    )
                    scale = math.sqrt(max(m.shape[-2:])) * group["rms"]
                    u = u * scale
                p.add_(u, alpha=-lr * a)
                state["k"] = k

    return step


ENTRY = Entry("lucidrains_polar_express", "lucidrains/adam-atan2-pytorch adam_atan2_pytorch/polar_adam_atan2.py",
              "optimizer library", lucidrains_polar_express, torch.bfloat16,
              graphs=2,  # the state made at the first step, its step count a Python int
              transposes_tall=True)
