import contextlib
import functools

import torch

from muon_corpus import LR, MOMENTUM, WD, Entry, _momentum

# ------------------------------------------------------------------- HomebrewML/HeavyBall (Muon)
#
# Read: HeavyBall 3.2.1 from PyPI (identical to HomebrewML/HeavyBall@07887bdf heavyball/utils.py).
# The NS input is normalised in fp32 (``keepdim=True``, as 3.2.1 has it) and then rounded to bf16 at
# random: reinterpret as int32, add random bits below the bf16 mantissa, mask off the lower 16 bits.
# ``heavyball_refused_call`` is the step as released: it runs inside
# ``torch._dynamo.utils.disable_cache_limit()``, a context manager in a module Dynamo refuses to
# trace; ``heavyball_stochastic_round`` leaves that out, so that it tests the rounding alone.

_COMPILE_MODE = "max-autotune-no-cudagraphs"  # heavyball/utils.py:25 (``compile_mode``)
_NOISE_DRAWS = 1


def _lazy_compiled(fn, fullgraph=True):
    """HeavyBall's compile decorator: inside a Dynamo trace just call ``fn``; otherwise build
    a ``torch.compile`` of it on first use (fullgraph, static shapes) and call that."""
    cache = None

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        if torch.compiler.is_compiling() or _COMPILE_MODE is None:
            return fn(*args, **kwargs)
        nonlocal cache
        if cache is None:
            cache = torch.compile(fn, fullgraph=fullgraph, dynamic=False, mode=_COMPILE_MODE)
        return cache(*args, **kwargs)

    return inner


def _up(x):
    if isinstance(x, torch.dtype) and x in (torch.bfloat16, torch.float16, torch.int8):
        return torch.float32
    if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16):
        return x.float()
    return x


def _as_scalar(x, like):
    """Turn a Python number into a 0-D tensor created during the step (floats in the widened dtype)."""
    if isinstance(x, float):
        return torch.empty((), dtype=_up(like.dtype), device=like.device).fill_(x)
    if isinstance(x, int):
        return torch.empty((), dtype=torch.int64, device=like.device).fill_(x)
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.ndim == 0:
        return x.to(dtype=_up(like.dtype))
    return x


@_lazy_compiled
def _dither_bf16(like, src=None):
    """HeavyBall's random rounding: given one tensor, round it to bf16; given two, round ``src``
    to the dtype of ``like``. Randomness applies only for fp16/fp32/fp64 going to bf16: view
    the fp32 value as int32, add uniform bits under the bf16 mantissa, keep the top half,
    view back as fp32."""
    if src is None:
        src = like
        dtype = torch.bfloat16
    else:
        dtype = like.dtype
    if dtype != torch.bfloat16 or src.dtype not in (torch.float16, torch.float32, torch.float64):
        return src.to(dtype)
    src = src.to(torch.float32).view(dtype=torch.int32)
    bits = sum(torch.randint_like(src, low=0, high=(1 << 16)) for _ in range(_NOISE_DRAWS))
    bits = bits + src - (_NOISE_DRAWS - 1) * (1 << 15)
    bits = bits.bitwise_and(-65536)
    return bits.view(dtype=torch.float32).bfloat16()


def _store(dst, src):
    """HeavyBall's rounding store (without its ECC path): for a bf16 destination the source
    goes through the random rounding first; then ``copy_``."""
    if dst.dtype == torch.bfloat16 and src.dtype in (torch.float16, torch.float32, torch.float64):
        src = _dither_bf16(dst, src)
    dst.copy_(src)


@_lazy_compiled
def _lerp_all(xs, ys, w):
    for x, y in zip(xs, ys):
        xf = _up(x)
        yf = _up(y)
        if xf.dtype != yf.dtype:
            yf = yf.to(xf.dtype)
        _store(x, xf * (1 - w) + yf * w)


@_lazy_compiled
def _add_all(xs, ys, alpha):
    for x, y in zip(xs, ys):
        _store(x, _up(x) + _up(y) * alpha)


@_lazy_compiled
def _ema(bufs, grads, mu):
    avg = list(map(_up, bufs))
    grads = list(map(_up, grads))
    mu = _up(mu)
    _lerp_all(avg, grads, _as_scalar(1 - mu, avg[0]))
    for b, m in zip(bufs, avg):  # for fp32 buffers these are the same tensors: a self-copy
        _store(b, m)
    return avg


@_lazy_compiled
def _ema_lookahead(bufs, grads, mu):
    avg = _ema(bufs, grads, mu)
    _add_all(grads, avg, _as_scalar(1, grads[0]))


@_lazy_compiled
def _ns5(G, n=5, eps=1e-7, dtype=torch.bfloat16):
    """Divide by the clamped fp32 norm, round to bf16 at random, run five rounds written as
    ``(a I + (b I + c S) S) X`` with the identity terms added to diagonals in place.
    (HeavyBall does not round an fp64 input; here the exact evaluation, ``dtype`` fp64, is a
    plain cast.)"""
    assert G.ndim >= 2
    assert n == 5
    G = G / G.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    x = G.to(dtype) if dtype is torch.float64 else _dither_bf16(G)
    if G.size(-2) > G.size(-1):
        x = x.mT
    for a, b, c in [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ]:
        s = x @ x.mT
        y = c * s
        y.diagonal(dim1=-2, dim2=-1).add_(b)
        y = y @ s
        y.diagonal(dim1=-2, dim2=-1).add_(a)
        x = y @ x
    if G.size(-2) > G.size(-1):
        x = x.mT
    return x.to(G.dtype)


@functools.partial(_lazy_compiled, fullgraph=False)
def _orth_into(x, kind, dst, scaling, dtype):
    if kind == "newtonschulz" or x.shape[-2] != x.shape[-1]:
        y = _ns5(x, 5, dtype=dtype)
    else:
        raise NotImplementedError(kind)
    if scaling == "none":
        pass
    elif scaling == "scale":
        y *= max(1, x.size(-2) / x.size(-1)) ** 0.5
    else:
        raise NotImplementedError(scaling)
    if dst is None:
        return y
    dst.copy_(y)


def _orth_update(u, dtype):
    if u.dim() < 2:
        return u
    shape = u.shape
    flat = u.flatten(1, -1)
    _orth_into(flat, "newtonschulz", flat, "scale", dtype)
    return flat.reshape(shape)


@_lazy_compiled
def _apply(params, updates, wd, lr):
    for u, p in zip(updates, params):
        u = _up(u.view_as(p))
        pf = _up(p)
        pf = pf * (1 - wd * lr) + u * -lr
        _store(p, pf)


def heavyball_muon(params, dtype, *, refused_call):
    """HeavyBall's Muon at its defaults (Nesterov-style EMA, then orthogonalisation, all as one
    multi-tensor chain with fp32 momentum), the NS input rounded to bf16 at random by the
    library's own rounding routine; every write to state or parameters goes through its
    rounding store (plain ``copy_`` for the fp32 destinations here).

    Order kept: an int64 0-D step counter and warm-up lr ``lr * t / t.clamp(min=warmup + 1)``;
    each gradient cloned to make the update; the EMA as ``x * (1 - w) + y * w`` (``w`` a 0-D
    tensor built in the step), stored to the buffer and then onto itself, followed by
    ``update + ema * 1``; for each matrix ``flatten(1, -1)``, the NS, the in-place
    ``max(1, rows / cols) ** 0.5`` scale and ``copy_`` back into the flat update; then
    ``p * (1 - wd * lr) + u * -lr`` stored into the parameter. Each helper is wrapped in the
    library's lazy compile decorator.

    Omitted: closure handling, parameter EMA, the preconditioner schedule and parameter
    counting, FSDP/DTensor gather and views, ECC state, the transform registry (its guards
    only allocate the zero momentum, done in ``make`` here), caution and cautious decay, palm,
    mars and clipping (all off by default), enums (plain strings here), and the QR / SVD /
    Polar Express modes. One deviation, in one entry: without ``refused_call`` the step runs
    under ``torch.no_grad()`` alone, not also under ``disable_cache_limit()``."""
    bufs = _momentum(params)
    group = {"count": torch.zeros((), dtype=torch.int64), "lr": LR, "warmup": 0}

    def step():
        refused = torch._dynamo.utils.disable_cache_limit() if refused_call else contextlib.nullcontext()
        with torch.no_grad(), refused:
            grads = [p.grad for p in params]
            t = group["count"] + 1
            group["count"] = t
            lr = group["lr"] * t / t.clamp(min=group["warmup"] + 1)
            updates = [torch.clone(g, memory_format=torch.preserve_format) for g in grads]
            _ema_lookahead(bufs, updates, _as_scalar(MOMENTUM, bufs[0]))
            ortho = []
            for u in updates:
                ortho.append(_orth_update(u, dtype))
            updates = ortho
            _apply(params, updates, WD, _as_scalar(lr, params[0]))

    return step


ENTRIES = (
    Entry("heavyball_refused_call",
          "HomebrewML/HeavyBall heavyball/utils.py (Muon; the step runs under torch._dynamo.utils.disable_cache_limit)",
          "optimizer library", functools.partial(heavyball_muon, refused_call=True), torch.bfloat16),
    Entry("heavyball_stochastic_round",
          "HomebrewML/HeavyBall heavyball/utils.py (Muon; NS input rounded to bf16 at random, the step outside "
          "disable_cache_limit)",
          "optimizer library", functools.partial(heavyball_muon, refused_call=False), torch.bfloat16),
)
