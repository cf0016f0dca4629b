"""Golden graphs of the distributed pipeline under the fake process group (world 8,
first and last rank; an HSDP 2x4 mesh), the rank symmetry of all 8 ranks' collectives,
and the order the schedule pass gives the buckets' stages. One rank's graphs are traced
in this process (fast); all 8 ranks are spawned (slow)."""

import re

import pytest
import torch

import muon_compile.compile.backend

from dist_harness import fake_rank, run_fake
from dist_workers import TP_NAMES, assert_same_collectives, collective_sequence, fsdp_graphs, launches_and_waits, tp_graphs
from golden import assert_golden

from muon_compile.passes.schedule import stage_order
from muon_compile.passes.distribute.stages import Stage, StageTag

# GPT-like layers at d=16 (qkv, attention out, MLP up, MLP down) plus, against 8 ranks,
# an uneven matrix (10 rows: ranks 5-7 hold nothing) and one with fewer rows than ranks.
W8_SHAPES = [(48, 16), (16, 16), (64, 16), (16, 64), (10, 16), (3, 16)]


@pytest.fixture(scope="module")
def world8():
    return run_fake(fsdp_graphs, 8, range(8), W8_SHAPES)


def test_world8_golden_rank0():
    graphs = fake_rank(fsdp_graphs, 8, 0, W8_SHAPES)
    assert_golden("fsdp_w8_rank0.before.txt", graphs["distribute_before"])
    assert_golden("fsdp_w8_rank0.scheduled.txt", graphs["schedule_after"])
    assert len(collective_sequence(graphs["lower_after"])) == 2  # one bucket: one all_to_all pair for six matrices


@pytest.mark.slow
def test_world8_golden_last_rank_and_the_same_collectives_on_every_rank(world8):
    assert_golden("fsdp_w8_rank0.scheduled.txt", world8[0]["schedule_after"])  # spawned as traced in-process
    assert_golden("fsdp_w8_rank7.scheduled.txt", world8[7]["schedule_after"])
    sequences = [collective_sequence(world8[r]["lower_after"]) for r in range(8)]
    assert len(sequences[0]) == 2
    assert_same_collectives(sequences)


def test_world8_torch_optim_muon():
    """Unmodified torch.optim.Muon on FSDP2 at world 8: the same single all_to_all pair as
    muon_compile.Muon, instead of DTensor's collectives per Gram matrix."""
    graphs = fake_rank(fsdp_graphs, 8, 0, W8_SHAPES[:-1], None, None, "torch")
    assert_golden("torch_muon_fsdp_w8_rank0.scheduled.txt", graphs["schedule_after"])
    assert len(collective_sequence(graphs["lower_after"])) == 2


@pytest.mark.slow
def test_hsdp_communicates_on_the_shard_submesh_only():
    graphs = fake_rank(fsdp_graphs, 8, 0, W8_SHAPES, (2, 4))
    assert_golden("hsdp_2x4_rank0.scheduled.txt", graphs["schedule_after"])
    sequence = collective_sequence(graphs["lower_after"])
    assert sequence
    shard_groups = {name for name, size in graphs["groups"].items() if size == 4}
    for _, _, args in sequence:
        assert args.rsplit(", ", 1)[1].strip("'") in shard_groups


def test_hsdp_over_tp_world8_golden_and_one_all_to_all_pair():
    """HSDP over TP at world 8, a (replicate 2, dp 2, tp 2) mesh: every weight of the TP block
    (placements ``(Replicate, _StridedShard, Shard(0))`` and ``(Replicate, Shard(0), Shard(1))``)
    is distributed by owner over the 4 ranks of its (dp, tp) sub-mesh, in one bucket: one
    all-to-all pair, none on the replicate dimension, nothing left to DTensor."""
    graphs = fake_rank(tp_graphs, 8, 0, (2, 2, 2))
    assert_golden("hsdp_tp_w8_rank0.scheduled.txt", graphs["schedule_after"])
    sequence = collective_sequence(graphs["lower_after"])
    assert [kind for kind, _, _ in sequence] == ["all_to_all_single"] * 2
    mesh_groups = set(graphs["groups"])
    assert all(args.rsplit(", ", 1)[1].strip("'") not in mesh_groups for _, _, args in sequence)  # a group made over (dp, tp)
    assert "sharded_newton_schulz" in graphs["distribute_before"] and "[2, 2]" in graphs["distribute_before"]


@pytest.mark.parametrize("optimizer", ["torch", "hand_written"])
def test_hsdp_over_tp_world8_unmodified_muon_one_all_to_all_pair(optimizer):
    """As above for the unmodified ``torch.optim.Muon`` and a hand-written Muon, which make no
    process group when built: the backend makes the (dp, tp) sub-mesh's group while compiling,
    and every weight but the one-row head (which Dynamo cannot trace, tests/distributed/test_distributed.py)
    is distributed over it in one bucket, none left to DTensor."""
    names = [n for n in TP_NAMES if n != "head"]
    graphs = fake_rank(tp_graphs, 8, 0, (2, 2, 2), dict(lr=0.05, momentum=0.9), optimizer, names)
    sequence = collective_sequence(graphs["lower_after"])
    assert [kind for kind, _, _ in sequence] == ["all_to_all_single"] * 2
    mesh_groups = set(graphs["groups"])
    assert all(args.rsplit(", ", 1)[1].strip("'") not in mesh_groups for _, _, args in sequence)  # a group made over (dp, tp)
    assert graphs["distribute_before"].count("sharded_newton_schulz") == len(names)
    assert "_c10d_functional" not in graphs["distribute_before"]  # no collective of DTensor's


def _stage_lines(text):
    """``[(line index, bucket, stage, line)]`` of the tagged lines of a dumped graph."""
    out = []
    for i, line in enumerate(text.splitlines()):
        m = re.search(r"  # bucket (\d+) (\w+)$", line)
        if m:
            out.append((i, int(m.group(1)), m.group(2), line))
    return out


@pytest.mark.parametrize("prefetch", [pytest.param(0, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.slow), 2])
def test_schedule_overlaps_collectives_with_compute(prefetch):
    graphs = fake_rank(fsdp_graphs, 2, 0, W8_SHAPES, None, dict(bucket_mb=0.002, prefetch=prefetch))
    text = graphs["schedule_after"]
    tagged = _stage_lines(text)
    buckets = 1 + max(b for _, b, _, _ in tagged)
    assert buckets >= 3
    seen = []
    for _, bucket, stage, _ in tagged:
        if StageTag(bucket, Stage(stage)) not in seen:
            seen.append(StageTag(bucket, Stage(stage)))
    assert seen == stage_order(buckets, True, prefetch)
    launch = {b: i for i, b, s, line in tagged if s == "launch" and "all_to_all_single" in line}
    compute = {}  # where each bucket's compute stage (wait, NS on the owned matrices, return) begins
    for i, b, s, _ in tagged:
        if s == "compute":
            compute.setdefault(b, i)
    assert any("newton_schulz" in line for _, _, s, line in tagged if s == "compute")
    for b in range(buckets - 1):
        if prefetch and b + prefetch < buckets:  # bucket b + k's collective goes out before bucket b's NS
            assert launch[b + prefetch] < compute[b]
        if not prefetch:  # no overlap: bucket b + 1 starts after bucket b's compute
            assert launch[b + 1] > compute[b]
    lines = text.splitlines()
    for i, line in enumerate(lines):  # every wait sits right before its first use
        if "wait_tensor" in line:
            name = line.split(":", 1)[0]
            assert re.search(rf"\b{name}\b", lines[i + 1].split("=", 1)[1]), (lines[i], lines[i + 1])
    assert launches_and_waits(graphs["code"][0]) == _scheduled_collectives(buckets, True, prefetch)


def _scheduled_collectives(buckets, finish, prefetch):
    """The launches and waits (as :func:`launches_and_waits` writes them) of the stage order
    ``stage_order(buckets, finish, prefetch)``: a launch stage issues its bucket's
    collective; a compute stage waits for it and, with a finishing stage, issues the return,
    which that stage waits for."""
    ids = {}
    seq = []
    for tag in stage_order(buckets, finish, prefetch):
        if tag.stage is Stage.LAUNCH:
            ids[tag.bucket, 0] = len(ids)
            seq.append(f"L{ids[tag.bucket, 0]}")
        elif tag.stage is Stage.COMPUTE:
            seq.append(f"W{ids[tag.bucket, 0]}")
            if finish:
                ids[tag.bucket, 1] = len(ids)
                seq.append(f"L{ids[tag.bucket, 1]}")
        else:
            seq.append(f"W{ids[tag.bucket, 1]}")
    return seq


@pytest.mark.parametrize("prefetch", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_generated_code_keeps_the_all_gather_schedule(prefetch):
    """Inductor's generated code launches and waits for the all_gather buckets' collectives in
    the schedule pass's order. Its peak-memory reordering, which the backend turns off for
    graphs with collectives, issued every gather right before its wait: at prefetch 1,
    ``L0 W0 L1 W1 L2 W2 L3 W3`` where the schedule is ``L0 L1 W0 L2 W1 L3 W2 W3``."""
    graphs = fake_rank(fsdp_graphs, 2, 0, W8_SHAPES, None, dict(bucket_mb=0.002, prefetch=prefetch, strategy="all_gather"))
    buckets = len(collective_sequence(graphs["lower_after"]))
    assert buckets >= 3
    assert launches_and_waits(graphs["code"][0]) == _scheduled_collectives(buckets, False, prefetch)


def test_only_graphs_with_collectives_turn_off_inductors_peak_memory_reordering(monkeypatch):
    """The backend compiles a distributed step with ``reorder_for_peak_memory`` off (so that
    its generated code keeps the schedule, above), unless ``options`` turns it on; a
    single-device step keeps Inductor's default."""
    patched = []
    compile_fx = muon_compile.compile.backend.compile_fx

    def recording(gm, example_inputs, config_patches):
        patched.append(config_patches.get("reorder_for_peak_memory", "default"))
        return compile_fx(gm, example_inputs, config_patches=config_patches)

    def compiled(step) -> set:  # what the graphs compiled by ``step()`` were patched with
        patched.clear()
        step()
        assert patched
        return set(patched)

    monkeypatch.setattr(muon_compile.compile.backend, "compile_fx", recording)
    assert compiled(lambda: fake_rank(fsdp_graphs, 2, 0, W8_SHAPES[:2])) == {False}
    options = {"reorder_for_peak_memory": True}
    assert compiled(lambda: fake_rank(fsdp_graphs, 2, 0, W8_SHAPES[:2], None, None, "muon_compile", options)) == {True}
    weight = torch.nn.Parameter(torch.randn(8, 4))
    weight.grad = torch.randn(8, 4)
    assert compiled(torch.compile(muon_compile.Muon([weight]).step, backend="muon")) == {"default"}
