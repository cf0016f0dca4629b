"""The passes through the pipeline: the count and order properties of the rewritten graph,
padded buckets against eager, unbucketable sites, dumps, logs, the graph contract, the
distribution plan, and the table of passes (each pass's plan alone: test_bucket.py,
test_lower.py, test_walk.py, test_algebra.py, test_writes.py)."""

import dataclasses
import itertools
import logging

import pytest
import torch
import torch.fx as fx
from torch._inductor.utils import run_and_get_code

import muon_compile
from muon_compile import config
from muon_compile.compile.compat import CPU_FUSION_DROPS_ROUND_TRIP
from muon_compile.diagnostics.launches import count_launches
from muon_compile.ns import cost as ns_cost
from muon_compile.ns.op import newton_schulz_op
from muon_compile.passes.graph_utils import GraphContractError, alias_pattern, check_contract

from helpers import MIXED_SHAPES, bucket_count, compare_steps, compile_with_dump, count_ns_calls, keller_args, lowered_products, make_params, muon, set_grads
from numerics import NS_RTOL, assert_rel_close
from script_runs import ROOT

ARGS = keller_args()


@pytest.mark.slow
def test_ns_calls_after_bucketing_equal_planned_buckets(device, tmp_path):
    graphs, step = compile_with_dump(muon(), MIXED_SHAPES, tmp_path, device=device, passes="bucket")
    # before, on CUDA: one call per stack of equal shapes (muon_compile.optim.stacks) and per loose
    # matrix: 24x8 (x2), 8x8 (x2), 32x8 (x2), 8x32 (x2), 5x7, the 3-D 2x8x16; on the CPU,
    # whose compiled step steps the stacks' members alone, one per matrix; after: 8x24, 8x8,
    # 8x32 (the wide stack and the tall one, transposed where tall matrices do not keep their layout), 5x7, 2x8x16
    assert count_ns_calls(graphs["bucket_before"]) == (10 if device == "cpu" else 6)
    assert count_ns_calls(graphs["bucket_after"]) == muon_compile.counters["bucket.buckets"] == bucket_count(MIXED_SHAPES, device)
    assert muon_compile.counters["bucket.matrices"] == 11
    step.assert_close(NS_RTOL[device][torch.bfloat16])


def product_calls(rows, cols, device, steps=5, algorithm=None):
    """The batched products of one bucket of ``rows x cols`` bf16 matrices: three per
    iteration for the textbook algorithm, ``4 T - 1`` for Gram; ``algorithm``, or whichever
    ``auto`` picks on ``device``."""
    algorithm = algorithm or ns_cost.choose(rows, cols, steps, torch.bfloat16, device).algorithm
    return sum(p.count for p in ns_cost.products(algorithm, rows, cols, steps, torch.bfloat16))


# One bucket of seven 8x24 bf16 matrices (one stored tall), five Keller iterations, on the
# CPU: (products, generated kernels, other op calls) in Inductor's code. Textbook: the
# three products of each iteration, their scalars in one pointwise kernel per iteration
# (B = c A A + b A + a I: the polynomial form, which this CPU's table has faster,
# ns_cost.choose_epilogue; the epilogue form puts them in the products' alpha / beta
# instead: test_epilogue_form_has_no_pointwise_kernel), and two kernels around them, no
# op call (a step compiled for this CPU gathers by torch.stack and writes member by member,
# muon_compile/optim/stacks.py): the gradients' gather fused with the momentum, the norm and the
# cast; every member's write, the tall one's included. Gram:
# its products (4T - 1 and 2 per restart), one kernel per iteration for Z = c R R + b R + a I
# (its scalars scale with each matrix's norm, so they stay tensors), one per rescaled R (its
# trace and the exact division fused: after the restart and after each R = Z Z R, four; see
# ns.evaluate.gram_iteration); its fp16 cast fused with the normalisation; and, its fp16 products
# formed in fp32 on the CPU (ns.cost.WIDE: fp16 products run 30x slower there), seven roundings of a
# product back to fp16 that join no other kernel (where torch's CPU fusion drops a round trip, every
# operand's upcast and result's rounding an opaque cast instead: 54 op calls, ns.evaluate._upcast).
LAUNCHES = {"textbook": (15, 7, 0), "gram": (18, 12, 54) if CPU_FUSION_DROPS_ROUND_TRIP else (18, 18, 0)}


def _one_bucket_step(algorithm, **config_changes):
    """One compiled step of the bucket of seven 8x24 matrices (one stored tall, joining as its
    transpose: ``MUON_COMPILE_NS_ORIENTATION=off``) under ``config_changes``, checked against
    eager: Inductor's generated code."""
    config_changes.setdefault("ns_orientation", "off")
    shapes = [(8, 24)] * 6 + [(24, 8)]
    eager_params, params = make_params(shapes), make_params(shapes)
    eager = muon_compile.Muon(eager_params, ns_algorithm=algorithm)
    opt = muon_compile.Muon(params, ns_algorithm=algorithm)
    set_grads(params, 0)
    set_grads(eager_params, 0)
    with config.override(**config_changes):
        _, code = run_and_get_code(torch.compile(opt.step, backend="muon"))
        eager.step()
    for p, e in zip(params, eager_params):
        torch.testing.assert_close(p, e, rtol=NS_RTOL["cpu"][torch.bfloat16], atol=1e-3)
    return code


@pytest.mark.parametrize("algorithm", LAUNCHES)
def test_launches_per_step_are_the_algorithms(algorithm):
    launches = count_launches(_one_bucket_step(algorithm))
    assert launches.products == product_calls(8, 24, "cpu", algorithm=algorithm)
    assert (launches.products, launches.kernels, launches.ops) == LAUNCHES[algorithm], launches.describe()


def test_epilogue_form_has_no_pointwise_kernel():
    """``MUON_COMPILE_NS_EPILOGUE=on`` (the form a device without a measured table runs):
    the textbook scalars in the products' alpha / beta, so the bucket's code is its 15
    products and the two kernels around them, no kernel between the products."""
    code = _one_bucket_step("textbook", ns_epilogue="on")
    launches = count_launches(code)
    assert (launches.products, launches.kernels, launches.ops) == (15, 2, 0), launches.describe()
    assert code[0].count("extern_kernels.baddbmm") == 10, "two of each iteration's three products carry its scalars"


def test_matmul_kernels_per_step_are_one_set_per_bucket(device):
    shapes = [(8, 24)] * 6 + [(24, 8)]
    eager_params, params = make_params(shapes, device=device), make_params(shapes, device=device)
    eager, opt = muon_compile.Muon(eager_params), muon_compile.Muon(params)
    step = torch.compile(opt.step, backend="muon")
    for seed in range(2):
        set_grads(params, seed)
        set_grads(eager_params, seed)
        eager.step()
        with config.override(ns_orientation="off"):  # the tall matrix joins the wide ones' bucket, as on CUDA
            if seed == 0:
                step()
                continue
            with torch.profiler.profile() as prof:
                step()
    names = [e.name for e in prof.events()]
    matmuls = sum(names.count(k) for k in ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"))
    assert matmuls == names.count("aten::bmm") + names.count("aten::baddbmm") == product_calls(8, 24, device)
    for p, e in zip(params, eager_params):
        torch.testing.assert_close(p, e, rtol=NS_RTOL[device][torch.bfloat16], atol=1e-3)


@pytest.mark.slow
def test_padded_buckets_match_eager_in_fp32(device):
    shapes = [(8, 24), (8, 20), (6, 24), (20, 8)]
    with config.override(pad_waste=0.5):
        compare_steps(muon(ns_dtype=torch.float32), shapes, rtol=NS_RTOL[device][torch.float32], device=device)
    assert muon_compile.counters["bucket.padded_buckets"] == 1


def _chained(xs):
    """NS of an NS result next to NS of independent inputs: two levels."""
    args = keller_args(torch.float32)
    first = newton_schulz_op(xs[0], args)
    second = newton_schulz_op(first * 2 + xs[1], args)
    third = newton_schulz_op(xs[2], args)
    return second + third, first


def test_chained_ns_ops_are_never_bucketed_with_their_producer(device):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(8, 24, generator=g).to(device) for _ in range(3)]
    got = torch.compile(_chained, backend="muon")(xs)
    want = _chained(xs)
    assert_rel_close(got[0], want[0], NS_RTOL[device][torch.float32])
    assert_rel_close(got[1], want[1], NS_RTOL[device][torch.float32])
    # `first` is a graph output: left alone; `second` (level 1) and `third` (level 0) apart
    assert muon_compile.counters["bucket.skipped"] == 1
    assert muon_compile.counters["bucket.buckets"] == 2


def test_dump_dir_and_debug_log_show_each_pass(device, tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="muon_compile.passes"):
        graphs, step = compile_with_dump(muon(), MIXED_SHAPES[:4], tmp_path, device=device)
    assert list(graphs) == ["bucket_before", "bucket_after", "lower_before", "lower_after"]
    assert graphs["bucket_after"] == graphs["lower_before"]
    assert count_ns_calls(graphs["lower_after"]) == 0
    # tall matrices bucket as they are where their iterates keep the tall layout (this CPU)
    tall_apart = ns_cost.choose_orientation(32, 8, torch.bfloat16, torch.device(device).type).kind == ns_cost.NATIVE
    buckets = [(24, 8), (8, 8), (32, 8), (8, 32)] if tall_apart else [(8, 24), (8, 8), (8, 32)]
    assert lowered_products(graphs["lower_after"]) == sum(product_calls(r, c, device) for r, c in buckets)
    text = caplog.text
    assert "algorithm plan:\nns " in text
    assert "bucket plan for 4 NS ops" in text
    assert ("bucket 3: 1 matrices 8x32 from sites [3]" if tall_apart else "bucket 2: 2 matrices 8x32 from sites [2, 3]") in text
    assert "lowering" in text and "5 steps (3.4445, -4.775, 2.0315) x5" in text
    step.assert_close(NS_RTOL[device][torch.bfloat16])


def _tiny_graph():
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.neg.default, (x,))
    g.output((y,))
    return g, y


def test_contract_rejects_missing_meta_and_new_aliasing():
    g, y = _tiny_graph()
    with pytest.raises(GraphContractError, match="without meta"):
        check_contract(g, "demo", alias_pattern(g))
    y.meta["val"] = torch.empty(2)
    with pytest.raises(GraphContractError, match="real tensor"):
        check_contract(g, "demo", alias_pattern(g))
    with torch._subclasses.FakeTensorMode():
        y.meta["val"] = torch.empty(2)
    before = alias_pattern(g)
    check_contract(g, "demo", before)
    x = next(iter(g.nodes))
    with g.inserting_before(g.output_node()):
        z = g.call_function(torch.ops.aten.neg.default, (x,))
        z.meta["val"] = y.meta["val"]
    g.output_node().args = ((z,),)
    check_contract(g, "demo", before)  # a new producer is fine
    g.output_node().args = ((x,),)
    with pytest.raises(GraphContractError, match="alias"):
        check_contract(g, "demo", before)  # returning the input itself is new aliasing



# ------------------------------------------------------------------ distributed plan
from muon_compile.config import Strategy  # noqa: E402
from muon_compile.passes.distribute.plan import EVERY_RANK, plan_distributed  # noqa: E402
from muon_compile.advisor.recommend import sharded_sites  # noqa: E402

# the distributed benchmark's model: gpt-small plus two odd-row matrices and a single row
BENCH_SHAPES = [(1152, 384), (384, 384), (1536, 384), (384, 1536)] * 6 + [(1001, 384), (383, 1536), (1, 384)]


def test_owners_balance_ns_flops_on_the_benchmark_model():
    for world in (2, 3, 8):
        sites = sharded_sites(BENCH_SHAPES, world, ARGS)
        plan = plan_distributed(sites, bucket_mb=64, strategy=Strategy.ALL_TO_ALL)
        flops = plan.flops_per_rank["0"]
        share = sum(flops) / world
        assert all(abs(f - share) <= 0.1 * share for f in flops), (world, flops)
        assert "NS GFLOP per rank" in plan.describe()


def test_all_ranks_plan_the_same_collectives_and_owners():
    shapes = [(24, 16), (10, 16), (7, 16), (1, 16), (40, 12), (12, 40)]
    plans = [
        plan_distributed(sharded_sites(shapes, 3, ARGS, rank=rank), bucket_mb=0.002, strategy=Strategy.ALL_TO_ALL)
        for rank in range(3)
    ]
    assert len(plans[0].buckets) == 2, len(plans[0].buckets)  # 0.002 MB buckets split the six
    for plan in plans[1:]:
        assert [b.collectives() for b in plan.buckets] == [b.collectives() for b in plans[0].buckets]
        assert [[m.owner for m in b.members] for b in plan.buckets] == [[m.owner for m in b.members] for b in plans[0].buckets]
    # each rank's local rows follow torch.chunk: 7 rows over 3 ranks are 3, 3, 1
    seven = [next(m for b in p.buckets for m in b.members if m.site == 2) for p in plans]
    assert [m.local_rows for m in seven] == [3, 3, 1] and {m.rows_per_shard for m in seven} == {3}


def test_tall_and_wide_share_a_distributed_bucket_and_groups_never_mix():
    other_group = sharded_sites([(12, 40)], 2, ARGS, group="hsdp-shard")[0]
    sites = [*sharded_sites([(40, 12), (12, 40)], 2, ARGS), dataclasses.replace(other_group, index=2)]
    plan = plan_distributed(sites, bucket_mb=64, strategy=Strategy.ALL_TO_ALL)
    assert [[m.site for m in b.members] for b in plan.buckets] == [[0, 1], [2]]
    assert plan.buckets[1].group_name == "hsdp-shard"
    # the owner regroups the bucket by canonical shape: one NS call for 40x12 and 12x40
    both = plan_distributed(sites[:2], bucket_mb=64, strategy=Strategy.ALL_GATHER)
    assert [len(g) for g in both.buckets[0].ns_groups()] == [2]
    assert all(m.owner == EVERY_RANK for m in both.buckets[0].members)
    assert both.buckets[0].collectives() == [("all_gather_into_tensor", "0", (40 // 2) * 12 + (12 // 2) * 40)]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("strategy", [Strategy.ALL_GATHER, Strategy.ALL_TO_ALL])
def test_each_layout_travels_as_one_block_and_is_reassembled_as_one(world, strategy):
    """The transport order puts each NS group's members side by side, by layout, for every
    owner; the reassembly reads each layout's members as one block of what a rank receives
    and returns every group's stacked canonical matrices (the tall ones transposed),
    whatever the graph order of the members and the padding of the last shard; the cut-back
    of the results writes them back as they came, zero padding included."""
    from muon_compile.passes.distribute.apply import _pad_rows, _received_groups, _scatter_rows
    from muon_compile.passes.distribute.plan import by_ns_group

    shapes = [(40, 12), (7, 16), (12, 40), (40, 12), (7, 16), (1, 16), (12, 40), (40, 12)]
    matrices = [torch.randn(r, c) for r, c in shapes]
    bucket = plan_distributed(sharded_sites(shapes, world, ARGS), bucket_mb=64, strategy=strategy).buckets[0]
    order = bucket.owner_order()
    assert sorted(m.site for m in order) == list(range(len(shapes)))

    def shard(m, rank):  # FSDP2's rows of the matrix on rank (torch.chunk's), zero-padded
        chunks = matrices[m.site].chunk(world)
        return _pad_rows(chunks[rank] if rank < len(chunks) else matrices[m.site][:0], m.rows_per_shard)

    for owner in sorted({m.owner for m in order}):
        received = [m for m in order if m.owner == owner]
        # one run per layout, and one stretch per NS group: a block, or a concatenation of blocks
        layouts, canonical = {m.layout for m in received}, {m.canonical for m in received}
        assert len(list(itertools.groupby(received, key=lambda m: m.layout))) == len(layouts)
        assert len(list(itertools.groupby(received, key=lambda m: m.canonical))) == len(canonical)
        # each rank sends the owner its shards in transport order; the owner stacks them by rank
        grid = torch.stack([torch.cat([shard(m, rank).reshape(-1) for m in received]) for rank in range(world)])
        groups = _received_groups(grid, received)
        assert [[m.site for m in members] for members, _ in groups] == [[m.site for m in g] for g in by_ns_group(received)]
        for members, stacked in groups:
            want = torch.stack([matrices[m.site].mT if m.rows > m.cols else matrices[m.site] for m in members])
            assert torch.equal(stacked, want)
        # the cut-back is its mirror: the stacked matrices, returned as they came, are the grid
        assert torch.equal(_scatter_rows(groups, world), grid.reshape(-1))
    if strategy is Strategy.ALL_GATHER:
        assert len(layouts) == 4 and len(canonical) == 3


def test_the_table_of_passes_is_what_the_configuration_and_the_docs_name():
    """One list of passes (muon_compile/passes/table.py): MUON_COMPILE_PASSES takes its names
    in its order, and docs/design.md's table of passes has one row per pass in that order
    (besides ``find``, which always runs)."""

    from muon_compile.passes.table import PASSES, Level

    names = tuple(p.name for p in PASSES)
    assert config.pass_names() == names == config.parse_passes("")
    assert config.parse_passes("-bucket") == tuple(n for n in names if n != "bucket")
    assert [p.level for p in PASSES].count(Level.TORCH) == 1 and PASSES[0].level is Level.TORCH
    design = (ROOT / "docs" / "design.md").read_text()
    table = design.split("| pass | module | what it does |")[1].split("\n\n")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert tuple(r for r in rows if r != "find") == names, rows
    with pytest.raises(ValueError, match="known passes"):
        config.current().enabled("plan_buckets")
