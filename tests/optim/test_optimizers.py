"""Muon and MuonAdamW, eager: the update rules against independent references, the
parameter split helper, hyper-parameters as tensors, and bad-input errors."""

import math

import pytest
import torch
from torch import nn

import muon_compile
from muon_compile.ns import coefficients as coeffs

from helpers import make_params, set_grads
from numerics import FP32_RTOL, NS_RTOL, assert_rel_close, textbook_ns

KELLER = coeffs.PRESETS["keller"]


def textbook_muon_step(p, grad, buf, *, lr, momentum, wd, nesterov, scale, steps=5):
    """Muon written out in float64 (returns new param and buffer)."""
    buf = momentum * buf + (1 - momentum) * grad
    update = (1 - momentum) * grad + momentum * buf if nesterov else buf
    ortho = textbook_ns(update, KELLER.coefficients, steps, KELLER.eps, 1.0)
    return p * (1 - lr * wd) - lr * scale * ortho, buf


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize(
    "shapes", [[(6, 10), (10, 6), (7, 7)], [(6, 10), (10, 6), (6, 10), (7, 7), (10, 6)]], ids=["one-by-one", "stacked"]
)
def test_muon_matches_textbook_fp64(device, nesterov, shapes):
    """Distinct shapes step one by one; repeated shapes step as stacks (muon_compile.optim.stacks)."""
    params = make_params(shapes, torch.float64, device=device)
    ref = [p.detach().clone() for p in params]
    bufs = [torch.zeros_like(p) for p in ref]
    opt = muon_compile.Muon(params, lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=nesterov, ns_dtype=torch.float64)
    for step in range(3):
        set_grads(params, step)
        for i, p in enumerate(params):
            scale = math.sqrt(max(1.0, p.shape[0] / p.shape[1]))
            ref[i], bufs[i] = textbook_muon_step(
                ref[i], p.grad, bufs[i], lr=0.05, momentum=0.9, wd=0.1, nesterov=nesterov, scale=scale
            )
        opt.step()
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), r, rtol=1e-10, atol=1e-12)


def test_muon_agrees_with_torch_optim_muon_in_bf16(device):
    shapes = [(16, 48), (48, 16), (32, 32)]
    ours, theirs = make_params(shapes, device=device), make_params(shapes, device=device)
    before = [p.detach().clone() for p in ours]
    a = muon_compile.Muon(ours, lr=0.02, weight_decay=0.0)
    b = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.0)
    set_grads(ours, 0)
    set_grads(theirs, 0)
    a.step()
    b.step()
    for p, q, p0 in zip(ours, theirs, before):
        assert_rel_close(p.detach() - p0, q.detach() - p0, NS_RTOL[device][torch.bfloat16], "update vs torch.optim.Muon")


@pytest.mark.parametrize(
    "mode, ratio",
    [
        ("original", lambda r, c: math.sqrt(max(1.0, r / c))),
        ("match_rms_adamw", lambda r, c: 0.2 * math.sqrt(max(r, c))),
        ("spectral", lambda r, c: math.sqrt(max(r, c))),
        ("none", lambda r, c: 1.0),
    ],
)
def test_adjust_lr_modes_and_extra_scale(device, mode, ratio):
    shapes = [(12, 4), (4, 12)]
    params = make_params(shapes, torch.float64, device=device)
    before = [p.detach().clone() for p in params]
    opt = muon_compile.Muon(
        params, lr=0.125, momentum=0.0, nesterov=False, adjust_lr=mode, extra_scale_factor=1.5, ns_dtype=torch.float64
    )
    set_grads(params, 0)
    opt.step()
    for p, p0 in zip(params, before):
        ortho = textbook_ns(p.grad, KELLER.coefficients, 5, KELLER.eps, 1.0)
        want = p0 - 0.125 * 1.5 * ratio(*p.shape) * ortho
        torch.testing.assert_close(p.detach(), want, rtol=1e-10, atol=1e-12)


def test_three_d_params_are_batches_of_matrices(device):
    (p,) = make_params([(3, 6, 10)], torch.float64, device=device)
    p0 = p.detach().clone()
    opt = muon_compile.Muon([p], lr=0.125, momentum=0.0, nesterov=False, ns_dtype=torch.float64)
    set_grads([p], 0)
    opt.step()
    for e in range(3):
        want = p0[e] - 0.125 * textbook_ns(p.grad[e], KELLER.coefficients, 5, KELLER.eps, 1.0)
        torch.testing.assert_close(p.detach()[e], want, rtol=1e-10, atol=1e-12)


def test_adamw_groups_match_torch_adamw(device):
    shapes = [(5,), (7, 3), ()]
    ours, theirs = make_params(shapes, device=device), make_params(shapes, device=device)
    opt = muon_compile.MuonAdamW(
        [{"params": ours, "kind": "adamw"}], adamw_lr=1e-2, adamw_betas=(0.8, 0.9), adamw_eps=1e-6, adamw_weight_decay=0.05
    )
    ref = torch.optim.AdamW(theirs, lr=1e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.05)
    for step in range(4):
        if step == 2:  # a schedule change between steps
            opt.param_groups[0]["lr"].fill_(5e-3)
            ref.param_groups[0]["lr"] = 5e-3
        set_grads(ours, step)
        set_grads(theirs, step)
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs):
        assert_rel_close(p.detach(), q.detach(), FP32_RTOL, "AdamW")


class TinyGPT(nn.Module):
    def __init__(self, vocab=11, d=8, tie=True):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.block = nn.ModuleDict(
            {"qkv": nn.Linear(d, 3 * d), "proj": nn.Linear(d, d, bias=False), "ln": nn.LayerNorm(d)}
        )
        self.experts = nn.Parameter(torch.randn(2, d, 2 * d))
        self.conv = nn.Conv1d(d, d, 3)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight


@pytest.mark.parametrize("tie", [True, False])
def test_muon_param_groups_split(tie):
    model = TinyGPT(tie=tie)
    groups = muon_compile.muon_param_groups(model)
    names = {g["kind"]: [n for n, _ in g["params"]] for g in groups}
    assert names["muon"] == ["block.qkv.weight", "block.proj.weight", "experts"] or names["muon"] == [
        "experts", "block.qkv.weight", "block.proj.weight"
    ]
    assert set(names["adamw"]) >= {"wte.weight", "block.qkv.bias", "block.ln.weight", "block.ln.bias", "conv.weight"}
    assert ("lm_head.weight" in names["adamw"]) == (not tie)
    opt = muon_compile.MuonAdamW(groups)
    assert {g["kind"] for g in opt.param_groups} == {"muon", "adamw"}


def test_muon_param_groups_expert_keys():
    model = TinyGPT(tie=False)
    model.router_table = nn.Parameter(torch.randn(2, 3, 4))  # 3-D but not an expert stack
    groups = muon_compile.muon_param_groups(model, expert_keys=["experts"])
    experts = [g for g in groups if g.get("experts")]
    assert [[n for n, _ in g["params"]] for g in experts] == [["experts"]]
    adamw = next(g for g in groups if g["kind"] == "adamw")
    assert "router_table" in [n for n, _ in adamw["params"]]
    muon_compile.MuonAdamW(groups)


def test_state_exists_from_construction_and_hyperparameters_are_tensors():
    params = make_params([(4, 6), (3,)])
    opt = muon_compile.MuonAdamW([{"params": params[:1], "kind": "muon"}, {"params": params[1:], "kind": "adamw"}])
    assert set(opt.state[params[0]]) == {"momentum_buffer"}
    assert set(opt.state[params[1]]) == {"step", "exp_avg", "exp_avg_sq"}
    for group in opt.param_groups:
        assert isinstance(group["lr"], torch.Tensor) and group["lr"].dim() == 0


def test_lr_scheduler_fills_tensor_lr_in_place():
    params = make_params([(4, 6)])
    opt = muon_compile.Muon(params, lr=0.1)
    lr_tensor = opt.param_groups[0]["lr"]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    set_grads(params, 0)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] is lr_tensor
    assert math.isclose(lr_tensor.item(), 0.05, rel_tol=1e-6)


def test_state_dict_round_trip_keeps_tensor_hyperparameters():
    a_params, b_params = make_params([(4, 6)]), make_params([(4, 6)])
    a = muon_compile.Muon(a_params, lr=0.1)
    set_grads(a_params, 0)
    a.step()
    b = muon_compile.Muon(b_params, lr=0.3)
    b.load_state_dict(a.state_dict())
    assert isinstance(b.param_groups[0]["lr"], torch.Tensor)
    assert b.param_groups[0]["lr"] is not a.param_groups[0]["lr"]
    assert math.isclose(b.param_groups[0]["lr"].item(), 0.1, rel_tol=1e-6)
    torch.testing.assert_close(b.state[b_params[0]]["momentum_buffer"], a.state[a_params[0]]["momentum_buffer"])


def _muon(params, **kw):
    return lambda: muon_compile.Muon(params, **kw)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: muon_compile.Muon([("ln.weight", nn.Parameter(torch.ones(4)))]), "'ln.weight' has 1 dimension"),
        (lambda: muon_compile.Muon([nn.Parameter(torch.ones(2, 2, 2, 2))]), r"#0 \(shape \(2, 2, 2, 2\)\) has 4"),
        (lambda: muon_compile.Muon([("w", nn.Parameter(torch.ones(2, 2, dtype=torch.complex64)))]), "'w' has dtype torch.complex64"),
        (lambda: muon_compile.Muon(make_params([(2, 2)]), ns_coefficients="nope"), "unknown Newton-Schulz coefficient preset 'nope'"),
        (lambda: muon_compile.Muon(make_params([(2, 2)]), adjust_lr="sqrt"), "adjust_lr must be one of .*, got 'sqrt'"),
        (lambda: muon_compile.Muon(make_params([(2, 2)]), ns_steps=0), "ns_steps must be a positive int"),
        (lambda: muon_compile.Muon(make_params([(2, 2)]), momentum=1.0), r"momentum must be in \[0, 1\)"),
        (lambda: muon_compile.Muon(make_params([(2, 2)]), lr=-1.0), "lr must be >= 0"),
        (lambda: muon_compile.Muon(make_params([(2, 2)]), ns_dtype=torch.int8), "ns_dtype"),
        (lambda: muon_compile.MuonAdamW([{"params": make_params([(2, 2)]), "kind": "sgd"}]), "'kind' must be one of"),
        (lambda: muon_compile.MuonAdamW([{"params": make_params([(2,)]), "kind": "adamw", "betas": (0.9,)}]), "betas must be a pair"),
        (lambda: muon_compile.Muon([{"params": make_params([(2, 2)]), "kind": "adamw"}]), "use MuonAdamW"),
    ],
)
def test_bad_construction_raises_value_error(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_sparse_gradient_raises_value_error_naming_the_parameter():
    p = nn.Parameter(torch.ones(3, 4))
    opt = muon_compile.Muon([("layer.weight", p)])
    p.grad = torch.eye(3, 4).to_sparse()
    with pytest.raises(ValueError, match="'layer.weight' has a sparse gradient"):
        opt.step()


def test_params_without_grad_are_skipped():
    params = make_params([(4, 6), (6, 4)])
    before = [p.detach().clone() for p in params]
    opt = muon_compile.Muon(params)
    params[0].grad = torch.ones(4, 6)
    opt.step()
    assert not torch.equal(params[0].detach(), before[0])
    assert torch.equal(params[1].detach(), before[1])


@pytest.mark.parametrize("preset", ["simple", "quintic", "aol"])
def test_megatron_coefficient_sets_by_name(preset):
    """Megatron's coefficient_type sets: "simple" repeats one triple, "quintic" and "aol"
    cycle through theirs (7 steps: 5 + 2 and 4 + 3)."""
    p = coeffs.PRESETS[preset]
    steps = 7
    schedule = [p.coefficients[i % len(p.coefficients)] for i in range(steps)]
    g = torch.randn(6, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = muon_compile.newton_schulz(g, preset, steps, compute_dtype=torch.float64)
    torch.testing.assert_close(got, textbook_ns(g, schedule, steps, p.eps, p.norm_scale), rtol=1e-10, atol=1e-12)


def test_ns_dtype_by_name():
    opt = muon_compile.Muon(make_params([(4, 6)]), ns_dtype="fp32")
    assert opt.param_groups[0]["ns_dtype"] is torch.float32
    with pytest.raises(ValueError, match="ns_dtype"):
        muon_compile.Muon(make_params([(4, 6)]), ns_dtype="fp8")


def textbook_normuon_cautious_step(p, grad, buf, v, *, lr, momentum, wd, beta2, scale, steps=5):
    """NorMuon + cautious weight decay written out in float64 (returns param, buffer, second moment)."""
    buf = momentum * buf + (1 - momentum) * grad
    update = (1 - momentum) * grad + momentum * buf
    o = textbook_ns(update, KELLER.coefficients, steps, KELLER.eps, 1.0)
    rows, cols = o.shape
    per_row = rows >= cols
    mean_sq = (o * o).sum(dim=1, keepdim=True) / cols if per_row else (o * o).sum(dim=0, keepdim=True) / rows
    v = beta2 * v + (1 - beta2) * mean_sq
    n = o / v.clamp_min(1e-10).sqrt()
    n = n * (torch.linalg.norm(o) / torch.linalg.norm(n))
    agree = (n * p >= 0).double()
    return p - lr * wd * agree * p - lr * scale * n, buf, v


def test_normuon_and_cautious_weight_decay_match_textbook_fp64(device):
    shapes = [(6, 10), (10, 6), (7, 7)]
    params = make_params(shapes, torch.float64, device=device)
    ref = [p.detach().clone() for p in params]
    bufs = [torch.zeros_like(p) for p in ref]
    vs = [torch.zeros((r, 1) if r >= c else (1, c), dtype=torch.float64, device=device) for r, c in shapes]
    kw = dict(lr=0.05, momentum=0.9, weight_decay=0.3)
    opt = muon_compile.Muon(params, **kw, normuon_beta2=0.95, cautious_weight_decay=True, ns_dtype=torch.float64)
    assert [tuple(opt.state[p]["second_moment"].shape) for p in params] == [(1, 10), (10, 1), (7, 1)]
    for step in range(3):
        set_grads(params, step)
        for i, p in enumerate(params):
            scale = math.sqrt(max(1.0, p.shape[0] / p.shape[1]))
            ref[i], bufs[i], vs[i] = textbook_normuon_cautious_step(
                ref[i], p.grad, bufs[i], vs[i], lr=0.05, momentum=0.9, wd=0.3, beta2=0.95, scale=scale
            )
        opt.step()
    for p, r, v in zip(params, ref, vs):
        torch.testing.assert_close(p.detach(), r, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(opt.state[p]["second_moment"], v, rtol=1e-10, atol=1e-15)


def test_normuon_and_cautious_are_off_by_default():
    params = make_params([(6, 10)])
    opt = muon_compile.Muon(params, weight_decay=0.1)
    assert set(opt.state[params[0]]) == {"momentum_buffer"}
    with pytest.raises(ValueError, match="normuon_beta2"):
        muon_compile.Muon(make_params([(6, 10)]), normuon_beta2=1.5)


@pytest.mark.parametrize("split, blocks", [((8, 4, 4), [(0, 8), (8, 12), (12, 16)]), (4, [(0, 4), (4, 8), (8, 12), (12, 16)])])
def test_split_rows_orthogonalise_blocks_on_their_own(split, blocks):
    """Fused QKV (q 8, k 4, v 4 rows) and per-head (4 heads of 4 rows): each row block is
    its own Newton–Schulz with its own shape ratio, against fp64 textbook Muon per block."""
    (p,) = make_params([(16, 6)], torch.float64)
    start = p.detach().clone()
    opt = muon_compile.Muon([p], lr=0.05, momentum=0.0, nesterov=False, ns_dtype=torch.float64, split_rows=split)
    set_grads([p], 0)
    opt.step()
    for lo, hi in blocks:
        rows = hi - lo
        want, _ = textbook_muon_step(
            start[lo:hi], p.grad[lo:hi], torch.zeros(rows, 6, dtype=torch.float64),
            lr=0.05, momentum=0.0, wd=0.0, nesterov=False, scale=math.sqrt(max(1.0, rows / 6)),
        )
        torch.testing.assert_close(p.detach()[lo:hi], want, rtol=1e-10, atol=1e-12)


def test_split_rows_must_fit_the_matrix():
    with pytest.raises(ValueError, match="split_rows=\\(8, 4\\) does not sum to the 16 rows of Muon parameter 'qkv'"):
        muon_compile.Muon([("qkv", nn.Parameter(torch.zeros(16, 6)))], split_rows=(8, 4))
    with pytest.raises(ValueError, match="does not divide"):
        muon_compile.Muon([nn.Parameter(torch.zeros(16, 6))], split_rows=5)
