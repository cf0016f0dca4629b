import torch

from muon_corpus import LR, MOMENTUM, WD, Entry

# ------------------------------------------- KellerJordan/modded-nanogpt (current: NorMuon)
#
# Read: KellerJordan/modded-nanogpt@f411b3d346aa52d3504324ca93c230fd84c6c07f
#   train_gpt.py:168-256   coefficient table and the Polar Express loop (with Nesterov)
#   train_gpt.py:545-586   optimizer state: fp32 momentum, fp32 per-row/per-column second moment
#   train_gpt.py:869-947   the update, the cautious decay + lr step, the variance reduction
#   train_gpt.py:2071-2076 defaults (beta2 = 0.9)
#   triton_kernels.py      three Triton product kernels, written here as torch ops with ``out=``

# The repository's own five-row table (safety 2e-2, cushion 2); differs from ns_forms.POLAR.
_TABLE = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
_DECAY2 = 0.9


def _gram_rows(X, out):
    """Torch version of the row-Gram Triton kernel: X times its transpose, into ``out``."""
    return torch.matmul(X, X.mT, out=out)


def _gram_cols(X, out):
    """Torch version of the column-Gram Triton kernel: transpose of X times X, into ``out``."""
    return torch.matmul(X.mT, X, out=out)


def _poly_into(A, sq, lin, out):
    """Torch version of the Triton polynomial kernel: lin * A + sq * (A @ A), into ``out``."""
    fn = torch.baddbmm if A.ndim > 2 else torch.addmm
    return fn(A, A, A, beta=lin, alpha=sq, out=out)


@torch.compile(dynamic=False, fullgraph=True)
def _orthogonalise(grads, mom, mu, split=False, dtype=torch.bfloat16):
    """Two fp32 lerps give the Nesterov direction (overwriting ``grads``); then the cast
    copy is normalised, made contiguous and iterated with three scratch tensors made once,
    every product written via ``out=`` and the iterate swapped with the scratch each round.
    Tall stacks build the column Gram and multiply on the right. With ``split`` (over 1024
    rows) the final product becomes a plain matmul followed by an in-place ``add_``."""
    m = mu.to(grads.dtype)
    mom.lerp_(grads, 1 - m)
    g = grads.lerp_(mom, m)

    X = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * (1 + 2e-2) + 1e-6)
    X = X.contiguous()

    if tall:
        A = torch.empty((*X.shape[:-2], X.size(-1), X.size(-1)), device=X.device, dtype=X.dtype)
        B = torch.empty_like(A)
        C = torch.empty_like(X)
        if split:
            right_mm = torch.bmm if X.ndim > 2 else torch.mm
        else:
            right_fused = torch.baddbmm if X.ndim > 2 else torch.addmm
        for a, b, c in _TABLE:
            _gram_cols(X, out=A)
            _poly_into(A, sq=c, lin=b, out=B)
            if split:
                right_mm(X, B, out=C)
                C.add_(X, alpha=a)
            else:
                right_fused(X, X, B, beta=a, out=C)
            X, C = C, X
    else:
        A = torch.empty((*X.shape[:-1], X.size(-2)), device=X.device, dtype=X.dtype)
        B = torch.empty_like(A)
        C = torch.empty_like(X)
        if split:
            left_mm = torch.bmm if X.ndim > 2 else torch.mm
        else:
            left_fused = torch.baddbmm if X.ndim > 2 else torch.addmm
        for a, b, c in _TABLE:
            _gram_rows(X, out=A)
            _poly_into(A, sq=c, lin=b, out=B)
            if split:
                left_mm(B, X, out=C)
                C.add_(X, alpha=a)
            else:
                left_fused(X, B, X, beta=a, out=C)
            X, C = C, X

    return X


@torch.compile(dynamic=False, fullgraph=True)
def _row_rescale(upd, row_moment, decay2, dim):
    """Keep a lerped mean-square of the orthogonalised update along one axis, then scale the
    update IN PLACE by its inverse root, renormalised so the Frobenius norm stays the same."""
    ms = upd.float().square().mean(dim=dim, keepdim=True)
    n = upd.size(dim)
    total_sq = ms.sum(dim=(-2, -1), keepdim=True).mul_(n)
    norm_before = total_sq.sqrt_()
    row_moment.lerp_(ms.to(dtype=row_moment.dtype), 1 - decay2)
    inv_rms = row_moment.clamp_min(1e-10).rsqrt_()
    rescaled_sq = (ms * n) * inv_rms.float().square()
    norm_after = rescaled_sq.sum(dim=(-2, -1), keepdim=True).sqrt_()
    scale = inv_rms * (norm_before / norm_after.clamp_min_(1e-10))
    return upd.mul_(scale.type_as(upd))


@torch.compile(dynamic=False, fullgraph=True)
def _cautious_step(p, upd, wd, lr):
    """fp32 step: decay only where update and weight share a sign, then subtract lr * update,
    stored back through ``copy_``. (Upstream the parameter is bf16 with a uint16 mantissa
    side buffer, which amounts to an fp32 master copy; here the parameters are fp32.)"""
    upd = upd.float()
    wd32 = wd.to(torch.float32)
    lr32 = lr.to(torch.float32)
    agree = (upd * p) >= 0
    p.copy_(p - (p * agree * wd32 * lr32) - (upd * lr32))


def modded_nanogpt_normuon(params, dtype):
    """modded-nanogpt's NorMuon today: every same-shape set of matrices is one bank (upstream's
    qk/vo/mlp banks), momentum and second moment are fp32, momentum/lr/decay live in 0-D CPU
    tensors refilled each step, and the lr carries a shape factor.

    Omitted: the reduce-scatter / all-gather and per-rank slicing of a bank (a single rank
    here, so the slice is the full bank); the Adam part of the combined optimizer; the
    momentum warm-up schedule (held constant); doubled lr on odd mlp matrices; and the bf16
    weight + uint16 mantissa storage (the step writes the fp32 parameters directly)."""
    groups = [[p for p in params if p.shape == s] for s in dict.fromkeys(p.shape for p in params)]
    states = []
    for group in groups:
        shape = (len(group), *group[0].shape)
        mom = torch.zeros(shape, dtype=torch.float32, device=group[0].device)
        if shape[-2] >= shape[-1]:
            moment_shape = (*shape[:-1], 1)
        else:
            moment_shape = (*shape[:-2], 1, shape[-1])
        row_moment = torch.zeros(moment_shape, dtype=torch.float32, device=group[0].device)
        shape_mult = max(1.0, shape[-2] / shape[-1]) ** 0.5
        states.append((mom, row_moment, shape_mult))
    mu = torch.tensor(0.0, dtype=torch.float32, device="cpu")
    lr_t = torch.tensor(0.0, dtype=torch.float32, device="cpu")
    wd_t = torch.tensor(0.0, dtype=torch.float32, device="cpu")

    def step():
        for group, (mom, row_moment, shape_mult) in zip(groups, states):
            grads = torch.stack([p.grad for p in group])
            shape = grads.shape
            grads = grads.float()

            mu.fill_(MOMENTUM)
            lr_t.fill_(shape_mult * LR)
            wd_t.fill_(WD * LR)

            big = shape[-2] > 1024
            upd = _orthogonalise(grads, mom, mu, split=big, dtype=dtype)

            dim = -1 if shape[-2] >= shape[-1] else -2
            upd = _row_rescale(upd, row_moment, _DECAY2, dim)

            stacked = torch.stack(group)
            _cautious_step(stacked, upd, wd_t, lr_t)
            torch._foreach_copy_(group, list(stacked.unbind(0)))

    return step


ENTRY = Entry("modded_nanogpt_normuon",
              "KellerJordan/modded-nanogpt train_gpt.py (NorMuon: Polar Express + per-row variance reduction)",
              "training repository", modded_nanogpt_normuon, torch.bfloat16, stacks=True)
