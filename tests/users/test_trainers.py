"""``muon_compile.compile_step`` inside the trainers people train with (issue 76), each package as
released (pinned in pyproject.toml's ``test`` extra), on the CPU: models built from configs, data
made here, nothing downloaded. Every compiled run is compared with the same run eager.

Tolerance: Newton–Schulz in fp32 here, so that a whole run's trajectory (several steps through
a model, the losses and every parameter, Muon's and AdamW's alike, since each gradient depends
on every earlier update) stays within fp32 Newton–Schulz's bound (tests/support/numerics.py); bf16's
bound is one update's, not a trajectory's. A run resumed from its own checkpoint is the same
compiled program on the same values as the run that did not stop: bit-identical."""


import pytest
import torch

import muon_compile
from muon_compile import compile_step

from helpers import dynamo_frames
from numerics import NS_RTOL, assert_rel_close

pytestmark = pytest.mark.slow  # each compiles a model's optimizer step, some twice

RTOL = NS_RTOL["cpu"][torch.float32]


def _assert_runs_close(got, want, start, what):
    """The change of every parameter over the run, compiled against eager."""
    for i, (g, w, s) in enumerate(zip(got, want, start)):
        assert_rel_close(g - s, w - s, RTOL, f"{what} parameter {i} {tuple(s.shape)}")


def _weights(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


class _Tokens(torch.utils.data.Dataset):
    """Seeded random token sequences, each its own label (causal LM)."""

    def __init__(self, n=24, length=16, vocab=64):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hugging_face_run(out_dir, compiled, resume=None, max_steps=6):
    """A tiny LlamaForCausalLM from a config, trained by Hugging Face's ``Trainer`` (through
    accelerate's ``AcceleratedOptimizer``) with ``MuonAdamW`` and a cosine schedule with warm-up,
    gradient clipping, gradient accumulation 2 and a checkpoint every 3 steps."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, get_cosine_schedule_with_warmup

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )
    model = LlamaForCausalLM(config)
    opt = muon_compile.MuonAdamW(
        muon_compile.muon_param_groups(model), lr=0.02, adamw_lr=3e-3, ns_dtype=torch.float32
    )
    scheduler = get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=max_steps)
    if compiled:
        compile_step(opt)
    args = TrainingArguments(
        output_dir=str(out_dir), max_steps=max_steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_grad_norm=1.0, logging_steps=1, save_steps=3,
        report_to="none", use_cpu=True, seed=0, data_seed=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(), optimizers=(opt, scheduler))
    start = _weights(model)
    trainer.train(resume_from_checkpoint=resume)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, _weights(model), start


def test_hugging_face_trainer_trains_and_resumes_with_the_compiled_step(tmp_path):
    """Losses and parameters equal to eager's; the compiled step is the one that ran (one graph
    for six steps under the schedule, bucketed); resumed from its step-3 checkpoint (model,
    optimizer, scheduler and RNG states, saved by the Trainer), the compiled run ends
    bit-identical to the run that did not stop."""
    eager_losses, eager, start = _hugging_face_run(tmp_path / "eager", compiled=False)
    frames = dynamo_frames()
    losses, weights, _ = _hugging_face_run(tmp_path / "compiled", compiled=True)
    assert dynamo_frames() - frames == 1, "one compiled graph for every step"
    assert muon_compile.counters["bucket.buckets"] >= 1, dict(muon_compile.counters)
    assert len(losses) == len(eager_losses) == 6
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=RTOL, atol=0)
    _assert_runs_close(weights, eager, start, "Trainer")

    resumed_losses, resumed, _ = _hugging_face_run(
        tmp_path / "resumed", compiled=True, resume=str(tmp_path / "compiled" / "checkpoint-3")
    )
    assert resumed_losses == losses  # steps 1-3 from the checkpoint's log, 4-6 run again
    for got, want in zip(resumed, weights):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _lightning_run(compiled):
    """A small MLP under Lightning's automatic optimization: ``MuonAdamW`` and a per-step
    ``LambdaLR`` from ``configure_optimizers``; Lightning calls ``optimizer.step(closure)``."""
    import pytorch_lightning as pl

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
            )
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self):
            groups = muon_compile.muon_param_groups(self, head_names=("4",))
            opt = muon_compile.MuonAdamW(groups, lr=0.02, adamw_lr=3e-3, ns_dtype=torch.float32)
            if compiled:
                compile_step(opt)
            scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(40, 16, generator=g), torch.randn(40, 4, generator=g))
    module = Regression()
    start = _weights(module)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=8, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    return torch.stack(module.losses), _weights(module), start


def test_lightning_automatic_optimization_compiles_the_update_alone():
    """Lightning passes a closure (forward and backward) into ``optimizer.step``: it runs eagerly,
    so Dynamo compiles one frame in eight steps (the update: no ``training_step``, none of
    Lightning's closure machinery, no recompile), and the run equals eager's."""
    eager_losses, eager, start = _lightning_run(compiled=False)
    frames = dynamo_frames()
    losses, weights, _ = _lightning_run(compiled=True)
    assert dynamo_frames() - frames == 1, "the update alone, compiled once"
    assert muon_compile.counters["bucket.buckets"] >= 1, dict(muon_compile.counters)
    torch.testing.assert_close(losses, eager_losses, rtol=RTOL, atol=0)
    _assert_runs_close(weights, eager, start, "Lightning")


def _torchtitan_containers(model, compiled, training_steps=6):
    """tests/support/torchtitan_recipe.py's containers for ``model`` (Muon for the hidden layers' weights, AdamW for the
    rest) and torchtitan's ``LRSchedulersContainer`` built after them; ``compiled=False``:
    each optimizer given back its own step (``uncompile_step``), the eager reference."""
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan_recipe import MuonOptimizersContainer, ParamGroupConfig

    config = MuonOptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(pattern=r"^layers\.\d+\.weight$", optimizer_name="Muon",
                             optimizer_kwargs={"lr": 0.02, "ns_dtype": torch.float32}),
            ParamGroupConfig(pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3}),
        ],
        implementation="for-loop",
    )
    optimizers = config.build(model_parts=[model])
    if not compiled:
        for opt in optimizers:
            muon_compile.uncompile_step(opt)
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers, training_steps=training_steps)
    return optimizers, schedulers


class _Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(16, 32)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
        self.out = torch.nn.Linear(32, 8)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return self.out(x)


def _titan_steps(model, optimizers, schedulers, seeds):
    for seed in seeds:
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
        optimizers.zero_grad()
        model(x).square().mean().backward()
        optimizers.step()
        schedulers.step()


def test_accelerate_prepared_optimizer_steps_the_compiled_step():
    """accelerate's ``Accelerator.prepare`` wraps the optimizer (``AcceleratedOptimizer``), whose
    ``step`` calls the compiled one; a hand-written loop with ``accelerator.backward``."""
    from accelerate import Accelerator

    def run(compiled):
        accelerator = Accelerator(cpu=True)
        model = _Layers()
        start = _weights(model)
        opt = muon_compile.MuonAdamW(muon_compile.muon_param_groups(model, head_names=("out",)), lr=0.02,
                                     ns_dtype=torch.float32)
        if compiled:
            compile_step(opt)
        model, opt = accelerator.prepare(model, opt)
        for seed in range(3):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
            opt.zero_grad()
            accelerator.backward(model(x).square().mean())
            opt.step()
        return _weights(model), start

    eager, start = run(False)
    frames = dynamo_frames()
    weights, _ = run(True)
    assert dynamo_frames() - frames == 1 and muon_compile.counters["bucket.buckets"] >= 1
    _assert_runs_close(weights, eager, start, "accelerate")


def test_torchtitan_containers_step_save_and_resume(tmp_path):
    """torchtitan's containers step ``muon_compile.Muon`` (compiled) beside ``torch.optim.AdamW``
    under its warm-up schedule, equal to eager; the flat FQN-keyed optimizer state dict (the
    checkpointer's), saved with ``torch.distributed.checkpoint`` and loaded into a fresh model and
    containers (their zero-lr state step through the compiled step), continues bit-identically."""
    import torch.distributed.checkpoint as dcp

    eager_model = _Layers()
    start = _weights(eager_model)
    _titan_steps(eager_model, *_torchtitan_containers(eager_model, compiled=False), range(3))
    model = _Layers()
    optimizers, schedulers = _torchtitan_containers(model, compiled=True)
    assert [type(o).__name__ for o in optimizers] == ["Muon", "AdamW"]
    frames = dynamo_frames()
    _titan_steps(model, optimizers, schedulers, range(3))
    assert dynamo_frames() - frames == 1, "Muon's update, compiled once"
    assert muon_compile.counters["bucket.buckets"] >= 1, dict(muon_compile.counters)
    _assert_runs_close(_weights(model), _weights(eager_model), start, "torchtitan")

    flat = optimizers.state_dict()
    assert "state.layers.0.weight.momentum_buffer" in flat, sorted(flat)[:8]
    dcp.save({"optimizer": optimizers}, checkpoint_id=str(tmp_path / "step-3"))
    fresh_model = _Layers()
    fresh_model.load_state_dict(model.state_dict())
    fresh_optimizers, fresh_schedulers = _torchtitan_containers(fresh_model, compiled=True)
    dcp.load({"optimizer": fresh_optimizers}, checkpoint_id=str(tmp_path / "step-3"))
    fresh_schedulers.load_state_dict(schedulers.state_dict())
    _titan_steps(model, optimizers, schedulers, range(3, 5))
    _titan_steps(fresh_model, fresh_optimizers, fresh_schedulers, range(3, 5))
    for got, want in zip(fresh_model.parameters(), model.parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
