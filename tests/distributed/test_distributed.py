"""FSDP2 on real gloo processes (world 2 and 3; 4 for HSDP and a 2x2 mesh of FSDP2 over tensor
parallelism): the compiled distributed step against a
single-process reference on the whole matrices, collectives per bucket, rank symmetry,
schedule order, caches shared across ranks."""

import re
import tempfile

import pytest
import torch

from muon_compile.compile.compat import DYNAMO_SORTS_CONFIG_SETS

from dist_harness import run_world
from dist_workers import (
    FSDP_SHAPES,
    TP_NAMES,
    TP_SHAPES,
    assert_same_collectives,
    automatic_dynamic_run,
    blockwise_reference,
    expert_tp_muon,
    EXPERT_LAYOUTS,
    fsdp_muon,
    generated_code,
    layout_reference,
    layout_weights,
    mixed_layouts,
    preloaded,
    reference_run,
    tp_fsdp_muon,
)
from numerics import FP32_RTOL, NS_RTOL, assert_rel_close, assert_rewrite_close, assert_updates_close

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # every test here spawns gloo ranks

STEPS = 3
OPT = dict(lr=0.05, momentum=0.9, weight_decay=0.1)


def check_against_reference(results, ns_dtype, shapes=FSDP_SHAPES):
    reference = reference_run(shapes, STEPS, ns_dtype=ns_dtype, **OPT)
    initial = reference_run(shapes, 0)
    for rank, result in enumerate(results):
        assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][ns_dtype], f"rank {rank} matrix")


def test_ranks_start_with_the_vector_isa_chosen():
    """The harness's forkserver imports its preload from this folder and chooses Inductor's CPU
    vector ISA once (tests/support/rank_preload.py): a rank that chose it again would spend 8-15 s of
    child interpreters on torch 2.11 before its first compile, and nothing else would fail."""
    assert run_world(preloaded, 2) == [{"rank_preload": True, "isa_chosen": True}] * 2


@pytest.mark.parametrize("strategy", ["all_to_all", "all_gather"])
def test_fsdp2_matches_single_process_reference_fp32(strategy):
    """World 3: rows split unevenly (10, 7, 40 and 1 rows over 3 ranks) and owners of
    unequal shares (every other test here runs world 2, HSDP world 4)."""
    results = run_world(fsdp_muon, 3, FSDP_SHAPES, STEPS, strategy, dict(OPT, ns_dtype=torch.float32))
    check_against_reference(results, torch.float32)
    per_bucket = 2 if strategy == "all_to_all" else 1
    for result in results:
        buckets = result["counters"]["distribute.buckets"]
        assert buckets == 1, result["counters"]  # six small matrices: one bucket of MUON_COMPILE_BUCKET_MB
        assert result["launched"] == per_bucket * buckets  # one collective (pair) per bucket, not per matrix
        assert result["launched"] < len(FSDP_SHAPES)
    assert_same_collectives([r["collectives"] for r in results])
    assert len(results[0]["collectives"]) == per_bucket * results[0]["counters"]["distribute.buckets"]


def test_automatic_dynamic_shapes_keep_the_sharded_step_bucketed():
    """The same step code compiled for other shapes first: Dynamo traces the second
    optimizer's step with automatic dynamic shapes, but the sharded op takes each matrix's
    global rows and columns as integers, so Dynamo specialises them (guarded: a third shape
    set recompiles). The plans see whole static matrices, the step is bucketed as usual, no
    symbolic-shape warning is raised, and the result matches the reference."""
    results = run_world(automatic_dynamic_run, 2, FSDP_SHAPES, STEPS, dict(OPT, ns_dtype=torch.float32))
    check_against_reference(results, torch.float32)
    for result in results:
        assert result["symbolic_inputs"]  # traced with dynamic shapes indeed
        assert not any("symbolic shapes" in w for w in result["warnings"]), result["warnings"]
        assert result["counters"]["find.ns_ops"] == len(FSDP_SHAPES)
        assert result["counters"]["distribute.matrices"] == len(FSDP_SHAPES)
        assert result["counters"]["distribute.buckets"] == 1, result["counters"]


def test_fsdp2_bf16_within_tolerance():
    results = run_world(fsdp_muon, 2, FSDP_SHAPES, STEPS, "all_to_all", dict(OPT, ns_dtype=torch.bfloat16))
    check_against_reference(results, torch.bfloat16)


def test_fsdp2_gram_on_the_owners_matches_the_reference():
    """The owners' batched NS in the distributed plan follows the algorithm too (issue 14):
    Gram asked for by the optimizer, against the single-process eager Gram step."""
    opt = dict(OPT, ns_dtype=torch.bfloat16, ns_algorithm="gram")
    results = run_world(fsdp_muon, 2, FSDP_SHAPES, STEPS, "all_to_all", opt)
    reference = reference_run(FSDP_SHAPES, STEPS, **opt)
    initial = reference_run(FSDP_SHAPES, 0)
    # one bucket; each rank's owned matrices batched by shape: 4 NS ops on rank 0, 1 on rank 1, all Gram
    assert [r["counters"]["lower.gram"] for r in results] == [4, 1], [r["counters"] for r in results]
    for rank, result in enumerate(results):
        assert result["counters"].get("lower.textbook", 0) == 0, result["counters"]
        assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][torch.bfloat16], f"rank {rank} matrix")


def test_fsdp2_unmodified_torch_optim_muon_is_bucketed():
    """torch.optim.Muon on FSDP2: canonicalize turns each parameter's NS into the op, so the
    step issues one all_to_all pair in all, not DTensor's collectives per Gram matrix.
    (The 1-row matrix is left out: Dynamo itself fails to trace torch.optim.Muon's in-place
    update of a parameter with fewer rows than ranks, before any backend runs.)"""
    from ns_forms import exact_torch_muon

    shapes = [s for s in FSDP_SHAPES if s[0] >= 2]
    results = run_world(fsdp_muon, 2, shapes, STEPS, "all_to_all", OPT, None, "torch")
    eager = reference_run(shapes, STEPS, "torch", **OPT)
    with exact_torch_muon():
        exact = reference_run(shapes, STEPS, "torch", **OPT)
    initial = reference_run(shapes, 0)
    for rank, result in enumerate(results):
        assert result["counters"]["canonicalize.matched"] == len(shapes)
        assert result["counters"]["distribute.buckets"] == 1
        assert result["launched"] == 2
        for i, (got, e, x, s) in enumerate(zip(result["weights"], eager, exact, initial)):
            assert_rewrite_close(got - s, e - s, x - s, torch.bfloat16, f"rank {rank} matrix {i} {shapes[i]}")
    assert_same_collectives([r["collectives"] for r in results])


@pytest.mark.slow(seconds=80)
def test_fsdp2_hand_written_forms_are_bucketed():
    """Every recognised hand-written form, in a hand-written Muon step on FSDP2: one NS op
    per matrix, one all-to-all pair per step in all, results as accurate as eager's."""
    from dist_workers import hand_written_forms, hand_written_run
    from ns_forms import FORMS

    check_fsdp2_steps(run_world(hand_written_forms, 2, 2), FORMS, hand_written_run, lambda name: torch.bfloat16)


def check_fsdp2_steps(results, names, run, dtype_of, launched=2):
    """Each step ``name`` of ``results`` (2 steps at world 2, per rank): one NS op per matrix,
    ``launched`` collectives per step (one all-to-all pair), as accurate as ``run(0, 0, 2, name)``
    (eager) against ``run(..., torch.float64)`` (exact), Newton–Schulz in ``dtype_of(name)``."""
    from dist_workers import FORM_SHAPES

    initial = reference_run(FORM_SHAPES, 0)
    for name in names:
        eager = run(0, 0, 2, name)
        exact = run(0, 0, 2, name, torch.float64)
        for rank, result in enumerate(r[name] for r in results):
            assert result["counters"]["canonicalize.matched"] == len(FORM_SHAPES), (name, rank)
            assert result["launched"] == launched, (name, rank, result["launched"])
            for i, (got, e, x, s) in enumerate(zip(result["weights"], eager, exact, initial)):
                assert_rewrite_close(got - s, e - s, x - s, dtype_of(name), f"{name} rank {rank} matrix {i}")


# corpus entries whose spellings DTensor runs as written (timm's and kozistr's ``out=`` buffers
# are plain tensors, which DTensor does not mix with sharded ones), one of them published code
# as it runs (tests/support/published/: absl logging around the loop, the precision set in the step)
FSDP2_CORPUS = ("keller_muon", "moonlight", "ultralytics", "emerging_optimizers_absl")


def test_fsdp2_corpus_entries_are_bucketed():
    """Public implementations' steps (tests/support/muon_corpus.py) on FSDP2: one NS op per matrix,
    one all-to-all pair per step, results as accurate as eager's."""
    from dist_workers import corpus_entries, corpus_run
    from muon_corpus import CORPUS

    # torch < 2.13 leaves a logging call in the loop to break the graph (as test_corpus skips it)
    names = tuple(n for n in FSDP2_CORPUS if not (CORPUS[n].logs_in_loop and DYNAMO_SORTS_CONFIG_SETS))
    results = run_world(corpus_entries, 2, 2, names)
    check_fsdp2_steps(results, names, corpus_run, lambda name: CORPUS[name].dtype)


def test_fsdp2_heavyball_as_released_leaves_its_norms_to_dtensor():
    """HeavyBall's step as released (tests/support/published/heavyball.py: under a call Dynamo refuses,
    the normalised input rounded to bf16 at random before the loop) on FSDP2: every loop is
    recognised and the matrices travel in one all-to-all pair, as accurate as eager's; but the
    rounding sits between the norm and the loop, so the op takes the rounded input as given and
    each matrix's norm is DTensor's, one all-reduce each: 2 + 5 collectives a step for 5
    matrices (measured 2026-12-02). A plan that buckets those reductions changes the count."""
    from dist_workers import FORM_SHAPES, corpus_entries, corpus_run

    names = ("heavyball_refused_call",)
    results = run_world(corpus_entries, 2, 2, names)
    check_fsdp2_steps(results, names, corpus_run, lambda name: torch.bfloat16, launched=2 + len(FORM_SHAPES))


def test_fsdp2_adamw_part_compiles_into_the_same_step_without_collectives():
    """MuonAdamW on FSDP2: the AdamW parameter's update is in the same compiled graph,
    its state stays sharded like the parameter, and it adds no collective."""
    results = run_world(fsdp_muon, 2, FSDP_SHAPES, STEPS, "all_to_all", OPT, None, "muon_adamw")
    reference = reference_run(FSDP_SHAPES, STEPS, "muon_adamw", **OPT)
    initial = reference_run(FSDP_SHAPES, 0)
    for rank, result in enumerate(results):
        assert result["graphs_compiled"] == 1
        assert result["state_like_params"]
        assert result["launched"] == 2 and result["counters"]["distribute.matrices"] == len(FSDP_SHAPES) - 1
        rtols = [NS_RTOL["cpu"][torch.bfloat16]] * (len(FSDP_SHAPES) - 1) + [FP32_RTOL]  # the last one is AdamW
        assert_updates_close(result["weights"], reference, initial, rtols, f"rank {rank} param")


@pytest.mark.slow(seconds=55)
def test_fsdp2_normuon_and_cautious_weight_decay():
    """NorMuon's per-row second moment stays sharded with the rows, the per-column one is
    replicated; its norms and column means are DTensor reductions (small extra
    collectives, not bucketed). Results equal the single-process reference."""
    kw = dict(OPT, ns_dtype=torch.float32, normuon_beta2=0.95, cautious_weight_decay=True)
    results = run_world(fsdp_muon, 2, FSDP_SHAPES, STEPS, "all_to_all", kw)
    reference = reference_run(FSDP_SHAPES, STEPS, **kw)
    initial = reference_run(FSDP_SHAPES, 0)
    for rank, result in enumerate(results):
        assert result["counters"]["distribute.buckets"] == 1
        assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][torch.float32], f"rank {rank} matrix")


def test_fsdp2_split_qkv():
    """A row-sharded fused QKV split into Q, K, V blocks: DTensor gathers the matrix for the
    split (the blocks do not follow the shard boundaries), the other matrices keep their
    bucket. Results equal the single-process reference."""
    kw = dict(OPT, ns_dtype=torch.float32)
    results = run_world(fsdp_muon, 2, FSDP_SHAPES, STEPS, "all_to_all", kw, None, "split_qkv")
    reference = reference_run(FSDP_SHAPES, STEPS, "split_qkv", **kw)
    initial = reference_run(FSDP_SHAPES, 0)
    for rank, result in enumerate(results):
        assert result["counters"]["distribute.matrices"] == len(FSDP_SHAPES) - 1
        assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][torch.float32], f"rank {rank} matrix")


def test_experts_on_their_own_data_parallel_group():
    """Expert stacks selected by name (muon_param_groups(expert_keys=...)) and sharded on the
    expert dimension over a separate process group: batched local NS, no collective, never
    in the dense matrices' bucket; the dense matrices keep their all-to-all pair."""
    from dist_workers import DenseAndExperts, experts_own_group, experts_reference

    results = run_world(experts_own_group, 2, STEPS)
    reference = experts_reference(STEPS)
    initial = {n: p.detach() for n, p in DenseAndExperts().named_parameters()}
    for rank, result in enumerate(results):
        assert result["expert_group"] != result["dense_group"]
        assert result["counters"]["distribute.matrices"] == 2  # the dense ones only
        assert result["launched"] == 2
        assert all(args.rsplit(", ", 1)[1].strip("'") == result["dense_group"] for _, _, args in result["collectives"])
        for n, want in reference.items():
            got = result["weights"][n]
            assert_rel_close(got - initial[n], want - initial[n], NS_RTOL["cpu"][torch.float32], f"rank {rank} {n}")


@pytest.mark.slow(seconds=50)
def test_shared_cache_dir_across_ranks_and_runs():
    """Stock torch keys a DTensor's cache entry by its global spec only; with uneven shards
    one rank loaded another's artifact and failed ('expected size 3==4'). The backend keys
    its passes by rank: the second run, from the same cache directory, is right too."""
    with tempfile.TemporaryDirectory() as cache:
        for attempt in range(2):
            results = run_world(
                fsdp_muon, 2, FSDP_SHAPES, STEPS, "all_to_all", dict(OPT, ns_dtype=torch.float32), cache_dir=cache
            )
            check_against_reference(results, torch.float32)
        # the cache was really shared: rank 0's graph came from it (no pass ran). Rank 1's
        # artifact is not saved by torch (its uneven-shard grads are views with symbolic
        # sizes, and AOTAutograd cannot pickle that graph), so rank 1 compiles again.
        assert results[0]["counters"].get("distribute.buckets", 0) == 0


def test_hsdp_2x2_matches_reference():
    results = run_world(fsdp_muon, 4, FSDP_SHAPES, STEPS, "all_to_all", dict(OPT, ns_dtype=torch.float32), (2, 2))
    check_against_reference(results, torch.float32)
    # ranks (0, 1) and (2, 3) are the two shard groups: symmetric within each, on their own group
    for shard_group in (results[:2], results[2:]):
        assert_same_collectives([r["collectives"] for r in shard_group])
    assert results[0]["collectives"][0][2].rsplit(", ", 1)[1] != results[2]["collectives"][0][2].rsplit(", ", 1)[1]


def test_expert_and_tensor_parallel_layouts():
    """3-D expert weights sharded on the expert dimension run a local batched NS with no
    collective; a tensor-parallel Shard(1) matrix joins the FSDP2 matrix's bucket (its
    blocks are columns)."""
    results = run_world(mixed_layouts, 2, STEPS)
    reference = layout_reference(STEPS)
    initial = layout_weights()
    for result in results:
        for k in reference:
            assert_rel_close(result["weights"][k] - initial[k], reference[k] - initial[k], NS_RTOL["cpu"][torch.float32], k)
        assert result["counters"].get("route.dtensor_fallback", 0) == 0
        assert result["counters"]["distribute.matrices"] == 2  # the row-sharded and the Shard(1) one
        # one bucket over the mesh's group: its all_to_all pair, nothing else
        kinds = [kind for kind, _, _ in result["collectives"]]
        assert kinds == ["all_to_all_single"] * 2


def test_copies_fuse_into_generated_kernels():
    """Pack, pad, trim, transpose, unpack and reshard leave no kernel per parameter: the
    momentum of all 14 matrices and the send buffer are one kernel, the unpack and the
    update of all 14 one more; the rest is Newton-Schulz (prologue + 5 iterations per
    owned shape) and the return pack."""
    shapes = [(48, 16), (16, 16), (64, 16), (16, 64)] * 3 + [(10, 16), (3, 16)]
    for result in run_world(generated_code, 2, shapes):
        code = result["code"]
        body = code[code.index("def call(self, args)") :]
        launches = re.findall(r"\bcpp_fused\w*\(", body)
        groups = result["counters"]["lower.ns_ops"]  # one batched NS per owned shape
        assert len(re.findall(r"= torch\.ops\._c10d_functional\.all_to_all_single\.default\(", body)) == 2
        assert len(launches) <= groups * (1 + 5) + 3, launches
        assert len(launches) - groups * 6 < len(shapes)


# how the whole matrices of the 2x2 TP block are distributed: by owner (the default), or by the
# "duplicated" TP mode (here in bf16), which plans the all_gather strategy's buckets (every rank
# computing every matrix) whatever the strategy: the all_gather strategy's run on these layouts
# would be the same step
WHOLE_MATRIX_RUNS = {
    "all_to_all": ({}, {"strategy": "all_to_all"}, ["all_to_all_single"] * 2),
    "tp duplicated bf16": ({"tp_mode": "duplicated", "ns_dtype": torch.bfloat16}, {"strategy": "all_to_all"}, ["all_gather_into_tensor"]),
}


@pytest.mark.parametrize("run", WHOLE_MATRIX_RUNS)
def test_fsdp2_on_tensor_parallel_blocks_matches_reference(run):
    """World 4, a 2x2 (dp, tp) mesh: column- and row-parallel weights sharded again by FSDP2
    (``_StridedShard`` rows, ``Shard(0), Shard(1)`` blocks; uneven sizes and empty blocks) are
    all distributed in one bucket, none left to DTensor, and equal the reference."""
    opt_kw, settings, collectives = WHOLE_MATRIX_RUNS[run]
    opt = dict(OPT, ns_dtype=torch.float32) | opt_kw
    results = run_world(tp_fsdp_muon, 4, STEPS, opt, (2, 2), settings)
    reference = reference_run(TP_SHAPES, STEPS, **{k: v for k, v in opt.items() if k != "tp_mode"})
    initial = reference_run(TP_SHAPES, 0)
    for rank, result in enumerate(results):
        assert "_StridedShard" in result["placements"][0] and result["placements"][-1] == "(Shard(dim=0), Shard(dim=1))"
        assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][opt["ns_dtype"]], f"rank {rank}", TP_NAMES)
        assert result["counters"].get("route.dtensor_fallback", 0) == 0
        assert result["counters"]["distribute.matrices"] == len(TP_SHAPES)
        assert result["counters"]["distribute.buckets"] == 1
        assert [kind for kind, _, _ in result["collectives"]] == collectives
        assert ("tp duplicated" in result["explanation"]) == (opt_kw.get("tp_mode") == "duplicated")


# each optimizer on one of the meshes: the step is recognised whatever the mesh (the trace is the
# same), and the mesh's process group is made whatever the optimizer (from the graph's inputs);
# both optimizers on the 8-rank HSDP x TP mesh: test_golden_distributed
@pytest.mark.parametrize(
    "optimizer, mesh_shape",
    [("torch", (2, 2)), ("hand_written", (2, 1, 2))],
    ids=["torch-fsdp x tp", "hand_written-hsdp x tp"],
)
def test_unmodified_muon_on_tensor_parallel_blocks_is_distributed_by_owner(optimizer, mesh_shape):
    """World 4: the unmodified ``torch.optim.Muon`` on FSDP2 x TP and a hand-written Muon on
    HSDP x TP (no ``muon_compile`` optimizer, so no process group made at construction),
    compiled with ``backend="muon"``: every matrix in one bucket, one all-to-all pair a step,
    none left to DTensor's collectives per matrix, as accurate as eager. (The one-row head is
    left out: with fewer rows than ranks, Dynamo fails on the in-place update before any
    backend runs, as on FSDP2 alone.)"""
    from ns_forms import exact_torch_muon

    names = [n for n in TP_NAMES if n != "head"]
    kept = [i for i, n in enumerate(TP_NAMES) if n in names]  # the references step every weight, as drawn

    def reference(steps, **kw):
        weights = reference_run(TP_SHAPES, steps, optimizer, **OPT, **kw)
        return [weights[i] for i in kept]

    results = run_world(tp_fsdp_muon, 4, STEPS, dict(OPT), mesh_shape, None, None, optimizer, names)
    eager = reference(STEPS)
    if optimizer == "torch":
        with exact_torch_muon():
            exact = reference(STEPS)
    else:
        exact = reference(STEPS, dtype=torch.float64)
    initial = reference(0)
    for rank, result in enumerate(results):
        assert result["counters"]["canonicalize.matched"] == len(names)
        assert result["counters"].get("route.dtensor_fallback", 0) == 0
        assert result["counters"]["distribute.matrices"] == len(names)
        assert result["counters"]["distribute.buckets"] == 1
        assert [kind for kind, _, _ in result["collectives"]] == ["all_to_all_single"] * 2
        for name, got, e, x, start in zip(names, result["weights"], eager, exact, initial):
            assert_rewrite_close(got - start, e - start, x - start, torch.bfloat16, f"rank {rank} {name}")


@pytest.mark.parametrize("mesh_shape", [(2, 2), (1, 4)], ids=["fsdp x tp", "tp only"])
def test_tp_blockwise_orthogonalises_each_tensor_parallel_block_alone(mesh_shape):
    """``tp_mode="blockwise"``: each TP block (rows of a column-parallel weight, columns of a
    row-parallel one, as DTensor's ``Shard`` cuts them) orthogonalised alone, against the
    reference that does so in one process. FSDP2 x TP: each block is distributed by owner over
    the data-parallel ranks (one all-to-all pair); TP alone: no collective at all."""
    tp = mesh_shape[1]
    opt = dict(OPT, ns_dtype=torch.float32, tp_mode="blockwise")
    results = run_world(tp_fsdp_muon, 4, STEPS, opt, mesh_shape)
    reference = blockwise_reference(STEPS, tp, ns_dtype=torch.float32, **OPT)
    initial = reference_run(TP_SHAPES, 0)
    for rank, result in enumerate(results):
        assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][torch.float32], f"rank {rank}", TP_NAMES)
        assert result["counters"].get("route.dtensor_fallback", 0) == 0
        kinds = [kind for kind, _, _ in result["collectives"]]
        if mesh_shape[0] > 1:
            assert "tp blockwise" in result["explanation"]  # the plan names the mode
            assert result["counters"]["distribute.matrices"] == len(TP_SHAPES)
            assert kinds == ["all_to_all_single"] * 2 * result["counters"]["distribute.buckets"]
        else:
            assert kinds == [] and result["counters"].get("distribute.matrices", 0) == 0


def test_ranks_whose_tp_mode_differs_are_stopped_naming_the_plans():
    """Rank 1's optimizer asks for ``tp_mode="duplicated"``, the others for the default: the
    ranks of its group plan different buckets, and the agreement stops the compile on each
    with the bucket as each rank plans it (no hang in mismatched collectives)."""
    with pytest.raises(RuntimeError) as failed:
        run_world(tp_fsdp_muon, 4, 1, dict(OPT), (2, 2), None, {1: {"tp_mode": "duplicated"}}, timeout=300)
    text = str(failed.value)
    assert "RankDivergenceError" in text and "disagree about the optimizer step" in text
    assert "tp duplicated" in text and "all_to_all over 4 ranks" in text


def test_expert_stacks_sharded_on_a_matrix_dimension_join_the_bucket():
    """World 4, a 2x2 (ep, tp) mesh: expert stacks sharded on the expert dimension and, column-
    or row-parallel, on a matrix dimension (uneven experts, rows and columns), and a 2-D
    tensor-parallel matrix, all distributed over the tp group in one bucket (an all-to-all
    pair; a stack's blocks travel, are reassembled and cut back as one member), none left to
    DTensor, equal to the reference on the whole stacks."""
    shapes = [shape for shape, _ in EXPERT_LAYOUTS]
    results = run_world(expert_tp_muon, 4, STEPS, dict(OPT, ns_dtype=torch.float32))
    reference = reference_run(shapes, STEPS, ns_dtype=torch.float32, **OPT)
    initial = reference_run(shapes, 0)
    for rank, result in enumerate(results):
        assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][torch.float32], f"rank {rank} stack")
        assert result["counters"].get("route.dtensor_fallback", 0) == 0
        assert result["counters"]["distribute.matrices"] == len(shapes) and result["counters"]["distribute.buckets"] == 1
        assert [kind for kind, _, _ in result["collectives"]] == ["all_to_all_single"] * 2
