"""QK-clip (MuonClip): heads above the threshold get their query / key rows rescaled after
the update (standard and MLA-style), eager against a hand computation, compiled against
eager, and errors naming a missing layer weight."""

import pytest
import torch
from torch import nn

import muon_compile
from muon_compile import QKClip, QKClipLayer

from numerics import NS_RTOL, assert_rel_close

HEADS, HEAD_DIM, D = 3, 4, 16


def _named_params(rope_dim=0, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    shapes = {"attn.wq": (HEADS * HEAD_DIM, D), "attn.wk": (HEADS * (HEAD_DIM - rope_dim), D), "mlp": (32, D)}
    return [(n, nn.Parameter(torch.randn(s, generator=g).to(device))) for n, s in shapes.items()]


def _optimizer(named, rope_dim=0):
    layer = QKClipLayer("layer0", query="attn.wq", key="attn.wk", heads=HEADS, head_dim=HEAD_DIM, rope_dim=rope_dim)
    return muon_compile.Muon(named, lr=0.05, ns_dtype="fp32", qk_clip=QKClip(threshold=10.0, layers=[layer]))


def _grads(named, seed):
    g = torch.Generator().manual_seed(100 + seed)
    for _, p in named:
        p.grad = torch.randn(p.shape, generator=g).to(p.device)


LOGITS = torch.tensor([5.0, 40.0, 10.0])  # head 1 above the threshold (gamma 0.25), heads 0 and 2 not


@pytest.mark.parametrize("rope_dim", [0, 1], ids=["mha", "mla"])
def test_heads_above_threshold_are_rescaled(rope_dim):
    clipped, plain = _named_params(rope_dim), _named_params(rope_dim)
    opt_clip, opt_plain = _optimizer(clipped, rope_dim), muon_compile.Muon(plain, lr=0.05, ns_dtype="fp32")
    _grads(clipped, 0)
    _grads(plain, 0)
    opt_clip.step(qk_logits={"layer0": LOGITS})
    opt_plain.step()
    (_, wq), (_, wk), (_, mlp) = clipped
    (_, pq), (_, pk), (_, pm) = plain
    q_scale = torch.ones(HEADS, HEAD_DIM)
    q_scale[1, : HEAD_DIM - rope_dim] = 0.5  # sqrt(gamma)
    q_scale[1, HEAD_DIM - rope_dim :] = 0.25  # gamma on the per-head rotary rows (MLA)
    k_scale = torch.ones(HEADS, HEAD_DIM - rope_dim)
    k_scale[1] = 0.5
    torch.testing.assert_close(wq.detach(), pq.detach() * q_scale.reshape(-1, 1), rtol=0, atol=0)
    torch.testing.assert_close(wk.detach(), pk.detach() * k_scale.reshape(-1, 1), rtol=0, atol=0)
    torch.testing.assert_close(mlp.detach(), pm.detach(), rtol=0, atol=0)


def test_skipped_step_does_not_clip():
    """With skip_nonfinite, a step skipped for a NaN gradient rescales no head either."""
    named = _named_params()
    layer = QKClipLayer("layer0", query="attn.wq", key="attn.wk", heads=HEADS, head_dim=HEAD_DIM)
    opt = muon_compile.Muon(named, lr=0.05, ns_dtype="fp32", skip_nonfinite=True, qk_clip=QKClip(threshold=10.0, layers=[layer]))
    _grads(named, 0)
    named[2][1].grad[0, 0] = float("nan")
    before = [p.detach().clone() for _, p in named]
    opt.step(qk_logits={"layer0": LOGITS})
    assert all(torch.equal(p, b) for (_, p), b in zip(named, before))
    assert opt.skipped_steps.item() == 1


@pytest.mark.slow
def test_compiled_matches_eager(device):
    eager, comp = _named_params(device=device), _named_params(device=device)
    opt_e, opt_c = _optimizer(eager), _optimizer(comp)
    step = torch.compile(opt_c.step, backend="muon")
    for s in range(2):
        _grads(eager, s)
        _grads(comp, s)
        before = [p.detach().clone() for _, p in eager]
        logits = LOGITS.to(device) * (s + 1)
        opt_e.step(qk_logits={"layer0": logits})
        step(qk_logits={"layer0": logits})
        for (n, e), (_, c), b in zip(eager, comp, before):
            assert_rel_close(c.detach() - b, e.detach() - b, NS_RTOL[device][torch.float32], n)


def test_missing_layer_weight_is_named():
    layer = QKClipLayer("layer7", query="blocks.7.wq", key="attn.wk", heads=HEADS, head_dim=HEAD_DIM)
    with pytest.raises(ValueError, match="qk_clip layer 'layer7': query weight 'blocks.7.wq' is not a parameter"):
        muon_compile.Muon(_named_params(), qk_clip=QKClip(10.0, [layer]))
    layer = QKClipLayer("layer0", query="attn.wq", key="attn.wk", heads=4, head_dim=HEAD_DIM)
    with pytest.raises(ValueError, match="expected 4 heads x 4 rows"):
        muon_compile.Muon(_named_params(), qk_clip=QKClip(10.0, [layer]))
    opt = _optimizer(_named_params())
    with pytest.raises(ValueError, match="unknown qk_clip layer"):
        opt.step(qk_logits={"layer9": LOGITS})


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_rows_of_each_rank_are_rescaled():
    """Query rows 12 (6 per rank), MLA key rows 9 (5 and 4): each rank scales the heads' rows
    it holds; the full weights equal the single-process run."""
    from dist_harness import run_world
    from dist_workers import qk_clip_run

    reference = qk_clip_run(0, 0, 2, 1)
    for rank, result in enumerate(run_world(qk_clip_run, 2, 2, 1)):
        for name, want in reference.items():
            assert_rel_close(result[name], want, NS_RTOL["cpu"][torch.float32], f"rank {rank} {name}")
