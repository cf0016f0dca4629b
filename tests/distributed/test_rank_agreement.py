"""Rank agreement (muon_compile.distributed.rank_agreement: its exchange and its fingerprint): the first
difference between ranks as a sentence, parameter names, the fingerprint of a step graph,
and on real gloo ranks: each way one rank's step can differ raises the same error on every
rank, by the exchange, not its timeout; ranks that diverge after compiling end with an error naming the
package, not a hang."""

import pytest
import torch

import muon_compile
from muon_compile import config
from muon_compile.distributed import rank_agreement
from muon_compile.distributed.rank_agreement import exchange, first_difference
from muon_compile.distributed.rank_agreement.fingerprint import parameter_label

from dist_harness import fake_rank, run_world
from dist_workers import AGREE_SHAPES, device_mesh, diverge_after_compile, divergent_step, sharded_stack

SETTINGS = [["setting", "MUON_COMPILE_BUCKET_MB", "64"], ["setting", "MUON_COMPILE_PREFETCH", "1"]]
GRADS = [["gradient", "L['a'].grad", "w1"], ["gradient", "L['b'].grad", "w2"]]
PLAN = [["plan", "bucket 0", "all_to_all over 2 ranks: 0:24x16->0"]]


def test_agreeing_reports_have_no_difference():
    facts = SETTINGS + GRADS + PLAN
    assert first_difference([(0, facts), (1, list(facts)), (2, list(facts))]) is None


def test_setting_difference_names_both_values():
    other = [["setting", "MUON_COMPILE_BUCKET_MB", "0.0005"], SETTINGS[1]]
    text = first_difference([(0, SETTINGS + GRADS), (1, other + GRADS)])
    assert text.startswith("MUON_COMPILE_BUCKET_MB is 64 on rank 0 and 0.0005 on rank 1. Set it the same")


def test_missing_gradient_either_way():
    assert first_difference([(0, GRADS), (1, GRADS[:1])]).startswith("rank 1 has no gradient for `w2`; rank 0 has one")
    assert first_difference([(0, GRADS[1:]), (2, GRADS)]).startswith("rank 2 has a gradient for `w1`; rank 0 has none")


def test_first_difference_in_fact_order_and_rank_order():
    """A setting that differs is reported before the plan it changed, the lowest rank first."""
    plan_b = [["plan", "bucket 0", "all_gather over 2 ranks: 0:24x16->all"]]
    prefetch0 = [SETTINGS[0], ["setting", "MUON_COMPILE_PREFETCH", "0"]]
    reports = [(0, SETTINGS + PLAN), (1, SETTINGS + plan_b), (2, prefetch0 + PLAN)]
    assert first_difference(reports).startswith("MUON_COMPILE_PREFETCH is 1 on rank 0 and 0 on rank 2")
    assert first_difference(reports[:2]).startswith(
        "bucket 0 differs: rank 0 has all_to_all over 2 ranks: 0:24x16->0; rank 1 has all_gather"
    )


def test_parameter_labels():
    class Holder:
        param_groups = [{"params": [0, 1], "param_names": ["embed.weight", "blocks.0.mlp.w1.weight"]}]

    named = parameter_label("L['args'][0].param_groups[0]['params'][1]", {"args": [Holder()]})
    assert named == "blocks.0.mlp.w1.weight"
    assert parameter_label("L['opt'].param_groups[2]['params'][7]", {}) == "param_groups[2]['params'][7]"
    module_path = "L['model']._modules['blocks']._modules['0']._parameters['weight']"
    assert parameter_label(module_path, None) == "model.blocks.0.weight"


def _fingerprint_at(rank, world, strategy):
    """The fingerprint the backend builds for the FSDP2 Muon step under the fake group
    (compiled, then run eagerly: the fake group cannot run an all-to-all with an empty input)."""
    from muon_compile.compile.backend import muon_backend

    seen = []
    original = rank_agreement.agree
    rank_agreement.agree = lambda groups, timeout, compilation=None: seen.append(groups)
    try:
        params = sharded_stack(AGREE_SHAPES, device_mesh(world))
        opt = muon_compile.Muon([(f"layers.{i}.weight", p) for i, p in enumerate(params)], lr=0.02)
        for p in params:  # (distribute_tensor under the fake group does not shard like FSDP2)
            p.grad = torch.ones_like(p)
        with config.override(strategy=strategy):
            torch.compile(opt.step, backend=lambda gm, inputs: (muon_backend(gm, inputs), gm.forward)[1])()
    finally:
        rank_agreement.agree = original
    torch._dynamo.reset()
    return seen[-1]


@pytest.mark.distributed
@pytest.mark.slow
def test_fingerprint_of_fsdp2_step_is_rank_independent():
    """The facts at world 4 are the same on ranks 0 and 3 (uneven shards: 7 rows over 4
    ranks leaves rank 3 one row), and hold the settings, every gradient by name and the
    bucket with its owners and all_to_all sizes."""
    first, last = (fake_rank(_fingerprint_at, 4, r, "all_to_all") for r in (0, 3))
    assert first == last
    (facts,) = first.values()
    keys = {key: value for _, key, value in facts}
    assert keys["MUON_COMPILE_STRATEGY"] == "all_to_all"
    assert [v for k, v in keys.items() if k.endswith(".grad")] == ["layers.0.weight", "layers.1.weight", "layers.2.weight"]
    assert keys["bucket 0"].startswith("all_to_all over 4 ranks")
    assert "0:24x16->0, 1:10x16->1, 2:7x16->2" in keys["bucket 0"]
    assert "all_to_all_single (96, 48, 32, 0)" in keys["bucket 0"]


# Each case: what rank 1 (of 2) does differently, and the sentence every rank must raise.
CASES = {
    "bucket_mb": "MUON_COMPILE_BUCKET_MB is 64 on rank 0 and 0.0005 on rank 1",
    "strategy": "MUON_COMPILE_STRATEGY is all_to_all on rank 0 and all_gather on rank 1",
    "tp_mode": "MUON_COMPILE_TP_MODE is distributed on rank 0 and blockwise on rank 1",
    "prefetch": "MUON_COMPILE_PREFETCH is 1 on rank 0 and 0 on rank 1",
    "passes": (
        "MUON_COMPILE_PASSES is canonicalize,distribute,bucket,schedule,lower,stack_writes,write_source on rank 0 "
        "and canonicalize,bucket,schedule,lower,stack_writes,write_source on rank 1"
    ),
    "gradient": "rank 1 has no gradient for `layers.1.weight`; rank 0 has one",
}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_divergent_rank_fails_on_every_rank_naming_the_difference(case):
    # the exchange's own message, not the agreement timeout's ("did not ..."): the ranks
    # compared their fingerprints instead of waiting MUON_COMPILE_AGREE_TIMEOUT (no bound
    # on the wall time here, which a loaded host stretches; run_world's timeout ends a hang)
    results = run_world(divergent_step, 2, case, 1, timeout=300)
    texts = [text for text, _ in results]
    assert texts[0] == texts[1], texts
    assert texts[0].startswith("muon_compile: the ranks of process group"), texts[0]
    assert CASES[case] in texts[0] and "MUON_COMPILE_AGREE_TIMEOUT" not in texts[0]


@pytest.mark.distributed
@pytest.mark.slow
def test_divergent_gradient_at_world_3():
    results = run_world(divergent_step, 3, "gradient", 2, timeout=300)
    assert len({text for text, _ in results}) == 1
    assert "rank 2 has no gradient for `layers.1.weight`; rank 0 has one" in results[0][0]


@pytest.mark.distributed
@pytest.mark.slow
def test_rank_skipping_a_compiled_step_ends_in_the_collective_timeout():
    """Rank 1 skips step 2: rank 0's collective times out (the process group's 5 s from
    step 2 on; step 1, which compiles, has gloo's default) and raises naming the package; the
    job ends. The times asserted are lower bounds, which a loaded host cannot break."""
    step2, skipped = run_world(diverge_after_compile, 2, "skip", 5, timeout=300)
    assert skipped == ("skipped", 0.0)
    text, seconds = step2
    assert text.startswith("muon_compile: the compiled optimizer step failed on rank 0"), text
    assert "Timed out" in text and "init_process_group(timeout=...)" in text
    assert seconds > 4  # not before the process group's timeout


@pytest.mark.distributed
@pytest.mark.slow
def test_recompile_on_one_rank_is_reported_by_rank():
    """Rank 0 alone recompiles: it waits MUON_COMPILE_AGREE_TIMEOUT (3 s) and names rank 1;
    rank 1's step, whose collectives have no partner, fails too; the job ends."""
    (text0, seconds0), (text1, _) = run_world(diverge_after_compile, 2, "recompile", 5, timeout=300)
    assert "rank(s) [1] did not" in text0 and "MUON_COMPILE_AGREE_TIMEOUT" in text0
    assert seconds0 > 2  # not before the agreement's timeout
    assert text1.startswith("muon_compile: the compiled optimizer step failed on rank 1"), text1


def test_agreement_timeout_setting():
    assert config.from_env({"MUON_COMPILE_AGREE_TIMEOUT": "0"}).agree_timeout == 0
    with pytest.raises(ValueError, match="MUON_COMPILE_AGREE_TIMEOUT"):
        config.Config(agree_timeout=-1)
    assert config.Config(agree_timeout=5).cache_key() == config.Config().cache_key()


def test_one_compilation_is_agreed_once(monkeypatch):
    """Dynamo may call the backend twice for one compilation (a restarted analysis, after a
    cold compile only): the second call makes no exchange, so a rank whose compile came
    from the cache stays in step. A new compilation exchanges again."""
    import torch.distributed as dist

    published = []
    publish = exchange._Exchange.publish
    monkeypatch.setattr(exchange._Exchange, "publish", lambda self: (published.append(self.n), publish(self)))
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        group = dist.group.WORLD.group_name
        for compilation in ("frame 0", "frame 0", "frame 1"):
            rank_agreement.agree({group: SETTINGS}, 5, compilation)
    finally:
        dist.destroy_process_group()
    assert published == [0, 1]
