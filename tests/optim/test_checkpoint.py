"""Checkpointing: the step after a save / load is bit-identical in fp32 to the step of
the uninterrupted run, on one device (state_dict through torch.save) and on FSDP2 at
world 2 (torch.distributed.checkpoint), eager and compiled."""

import io

import pytest
import torch

import muon_compile

from dist_harness import run_world
from dist_workers import CHECKPOINT_SHAPES, TP_NAMES, dcp_load_other_width, dcp_resume
from helpers import MIXED_SHAPES, make_params, set_grads


def _optimizer(params):
    groups = [{"params": params[:-2], "kind": "muon"}, {"params": params[-2:], "kind": "adamw"}]
    return muon_compile.MuonAdamW(groups, lr=0.05, weight_decay=0.1, ns_dtype=torch.float32)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_state_dict_resume_is_bit_identical(compiled):
    shapes = MIXED_SHAPES[:6] + [(8,), ()]

    def stepper(opt):
        return torch.compile(opt.step, backend="muon") if compiled else opt.step

    params = make_params(shapes)
    opt = _optimizer(params)
    step = stepper(opt)
    for s in range(3):
        set_grads(params, s)
        step()
    buffer = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "optim": opt.state_dict()}, buffer)
    set_grads(params, 3)
    step()

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    params2 = make_params(shapes, seed=1)  # different weights, overwritten by the checkpoint
    with torch.no_grad():
        for p, w in zip(params2, saved["params"]):
            p.copy_(w)
    opt2 = _optimizer(params2)
    opt2.load_state_dict(saved["optim"])
    assert all(isinstance(g["lr"], torch.Tensor) and g["lr"].dim() == 0 for g in opt2.param_groups)
    set_grads(params2, 3)
    stepper(opt2)()
    for i, (a, b) in enumerate(zip(params2, params)):
        assert torch.equal(a, b), f"param {i} {tuple(a.shape)}"


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_distributed_checkpoint_resume_is_bit_identical():
    for rank, result in enumerate(run_world(dcp_resume, 2, 2)):
        assert all(result["identical"]), (rank, result["identical"])
        # every rank holds every state key from step 0, the empty shard's rank included
        assert result["state_keys"] == sorted(["momentum_buffer"] * (len(CHECKPOINT_SHAPES) - 1) + ["exp_avg", "exp_avg_sq", "step"])


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_over_tp_distributed_checkpoint_resume_is_bit_identical():
    """World 4, the 2x2 (dp, tp) TP block (``_StridedShard`` and ``Shard(0), Shard(1)``
    weights, uneven and empty blocks), in the ``blockwise`` mode (its blocks distributed over
    dp only; the state is the same DTensors in every mode): resumed from a DCP checkpoint,
    the next step is bit-identical, and the TP mode comes back with the param groups."""
    for rank, result in enumerate(run_world(dcp_resume, 4, 2, "tp blockwise")):
        assert all(result["identical"]), (rank, result["identical"])
        assert result["state_keys"] == ["momentum_buffer"] * len(TP_NAMES) and result["tp_mode"] == "blockwise"


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_set_state_dict_of_another_width_names_the_parameter():
    """The DCP path (``set_state_dict`` of a sharded optimizer state dict) reaches the same
    check: every rank raises, naming the parameter and both (global) shapes."""
    for text in run_world(dcp_load_other_width, 2, timeout=300):
        assert "cannot load optimizer state 'momentum_buffer' of parameter" in text, text
        assert "the state dict holds shape (7, 16), this optimizer needs (7, 24)" in text, text


def test_loading_state_of_another_width_names_the_parameter():
    """A checkpoint of a model of another width fails at load, naming the parameter, the
    key and both shapes, and leaves the optimizer as it was (issue 15, point 3)."""
    narrow = muon_compile.Muon([("w", torch.nn.Parameter(torch.randn(8, 16)))])
    wide_param = torch.nn.Parameter(torch.randn(8, 24))
    wide = muon_compile.Muon([("w", wide_param)])
    before = wide.state[wide_param]["momentum_buffer"].clone()
    with pytest.raises(ValueError, match=r"optimizer state 'momentum_buffer' of parameter 'w': the state dict holds shape \(8, 16\), this optimizer needs \(8, 24\)"):
        wide.load_state_dict(narrow.state_dict())
    assert torch.equal(wide.state[wide_param]["momentum_buffer"], before)


def test_loading_state_of_another_dtype_is_an_error():
    saved = _optimizer(make_params(MIXED_SHAPES[:6] + [(8,), ()])).state_dict()
    opt = _optimizer(make_params(MIXED_SHAPES[:6] + [(8,), ()], dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"'momentum_buffer' of parameter #0 \(shape \(24, 8\)\): the state dict holds dtype torch.float32, this optimizer needs torch.bfloat16"):
        opt.load_state_dict(saved)
