"""The advisor (muon_compile/advisor/recommend.py, muon_compile/models.py):
published model shapes, plans from shapes alone at any world size, HSDP layouts, the
command line, the plots' missing dependency; and that the compile path imports none of
muon_compile.advisor."""

import dataclasses
import re
import sys
import textwrap

import pytest
import torch

from dist_harness import run_world
from dist_workers import fsdp_muon, reference_run
from muon_compile.advisor import plots
from muon_compile.advisor import recommend as advisor
from muon_compile.config import Strategy, TPMode
from muon_compile.distributed.sharded_op import ShardLayout
from muon_compile.models import MODELS, model
from muon_compile.advisor.network_profiles import profile
from muon_compile.advisor.step_cost import DEVICES, TIE
import script_runs
from numerics import NS_RTOL, assert_updates_close


@pytest.mark.parametrize(
    "name, matrices, total",
    [("llama-1b", 16 * 7, 1.236e9), ("llama-8b", 32 * 7, 8.030e9), ("llama-70b", 80 * 7, 70.55e9)],
)
def test_llama_shapes_add_up_to_the_published_sizes(name, matrices, total):
    shapes = model(name)
    assert len(shapes.matrices) == matrices
    assert shapes.active == pytest.approx(total, rel=0.005)  # the release's parameter count


def test_moe_counts_two_of_sixteen_experts_as_active():
    moe, dense = model("moe-16x1b"), model("llama-1b")
    ffn = 3 * 2048 * 8192 * 16  # one expert's three matrices, 16 layers
    assert moe.muon_params == dense.muon_params + 15 * ffn
    assert moe.active == dense.active + ffn
    with pytest.raises(ValueError, match="unknown model 'gpt-5'; known: \\[.*'llama-1b'"):
        model("gpt-5")


def test_plans_from_shapes_balance_owners_at_any_world():
    for world in (8, 64):
        p = advisor.plan_for(list(MODELS["llama-1b"].matrices), world, Strategy.ALL_TO_ALL, 256)
        assert sum(len(b.members) for b in p.buckets) == 112
        flops = p.flops_per_rank["0"]
        largest = max(m.flops for b in p.buckets for m in b.members)
        # the least-loaded-rank guarantee: no rank above an even share plus one matrix
        assert max(flops) <= sum(flops) / world + largest
        if world == 8:  # many matrices per rank: within 10% of an even share
            assert max(flops) <= 1.1 * sum(flops) / world
        assert all(b.group_size == world for b in p.buckets)


def _ns_calls(plan):
    """The NS calls of a one-rank plan's step: one per canonical shape of each bucket."""
    return sum(len({m.canonical for m in b.members}) for b in plan.buckets)


@pytest.mark.distributed
@pytest.mark.slow
def test_one_rank_plan_is_the_compiled_steps():
    """At one rank the FSDP2 step is the single-device path's (a mesh of one rank leaves
    the parameters local): buckets of one shape, one NS call each, as the compiled step
    plans them, not the distribute pass's buckets of mixed shapes."""
    shapes = [(8, 16), (16, 8), (12, 12), (8, 16), (12, 12), (20, 8), (8, 16)]
    mb = 2 * 8 * 16 * 4 / 2**20  # two 8x16 matrices in fp32, the iteration's dtype here
    args = dataclasses.replace(advisor.DEFAULT_ARGS, compute_dtype=torch.float32)
    kw = dict(lr=0.05, ns_dtype=torch.float32)
    (result,) = run_world(fsdp_muon, 1, shapes, 1, "all_to_all", kw, None, "muon_compile", {"bucket_mb": mb})
    initial, reference = reference_run(shapes, 0), reference_run(shapes, 1, **kw)
    assert_updates_close(result["weights"], reference, initial, NS_RTOL["cpu"][torch.float32], "matrix")
    (compiled,) = [p for p in result["plans"] if p.startswith("bucket 0:")]
    sites = [[int(i) for i in re.search(r"sites \[([\d, ]+)\]", line).group(1).split(", ")] for line in compiled.splitlines()]
    assert len(sites) == 5  # four 8x16 (transposes join) two a bucket, the 12x12s one each, 8x20
    for strategy in Strategy:
        plan = advisor.plan_for(shapes, 1, strategy, mb, args)
        assert [[m.site for m in b.members] for b in plan.buckets] == sites
        assert sum(len(b.members) for b in plan.buckets) == len(shapes)
        assert _ns_calls(plan) == len(plan.buckets) == len(sites)
        assert all(b.group_size == 1 for b in plan.buckets)  # no collective
    distributed = advisor.plan_distributed(advisor.sharded_sites(shapes, 1, args), bucket_mb=mb, strategy=Strategy.ALL_TO_ALL)
    assert _ns_calls(distributed) != len(sites)  # what the model priced before


def test_shard_sizes_divide_the_world():
    assert advisor.shard_sizes(1024, [8, 64]) == [8, 64, 1024]
    assert advisor.shard_sizes(12, [8, 64]) == [12]
    assert advisor.shard_sizes(8, [8, 64]) == [8]


def test_sweep_covers_every_configuration_and_prices_hsdp_within_the_shard_group():
    shapes = list(MODELS["llama-1b"].matrices)
    rows = advisor.sweep(shapes, 64, DEVICES["h100"], profile("nvlink-ib"), [64, 256], [0, 1], [8])
    assert len(rows) == 2 * 2 * 2 * 2  # shard groups x strategies x bucket sizes x depths
    assert {r.layout for r in rows} == {"HSDP 8x8", "FSDP"}
    hsdp = next(r for r in rows if r.shard == 8)
    assert len(hsdp.cost.total) == 8  # one entry per rank of the shard group
    fastest = advisor.best(rows)
    assert all(fastest.cost.step <= r.cost.step for r in rows)
    table = advisor.describe(rows)
    assert table.count("<- fastest") == 1 and len(table.splitlines()) == 1 + 2 * 2 * 2


def test_tp_layouts_are_the_routings_and_the_modes_are_priced_apart(capsys):
    """``--tp``: the layout of a column- and of a row-parallel matrix is the one the routing
    gives the DTensor FSDP2 makes over TP (mesh, dims, split: test_shard_layouts checks the
    routing against DTensor); every TP mode is priced; ``duplicated`` is every rank computing
    every matrix; ``blockwise`` orthogonalises a TP block over the data-parallel ranks and is
    never the recommendation, only shown beside it."""
    assert advisor.tp_layout(12, 10, 8, "g", 2, 0, TPMode.DISTRIBUTED) == ShardLayout(12, 10, "g", (4, 2), (0, 0), (2, 0))
    assert advisor.tp_layout(10, 12, 8, "g", 2, 1, TPMode.DUPLICATED) == ShardLayout(10, 12, "g", (4, 2), (0, 1), (0, 0), "duplicated")
    assert advisor.tp_layout(10, 7, 2, "g", 2, 1, TPMode.DISTRIBUTED) == ShardLayout(10, 7, "g", (2,), (1,), (0,))
    assert advisor.tp_layout(7, 10, 8, "g", 2, 0, TPMode.BLOCKWISE) == ShardLayout(4, 10, "g", (4,), (0,), (0,), "blockwise")
    llama = MODELS["llama-1b"]
    assert llama.tp_split[:7] == (0, 0, 0, 1, 0, 0, 1) and len(llama.tp_split) == len(llama.matrices)
    rows = advisor.sweep(list(llama.matrices), 16, DEVICES["h100"], profile("nvlink-ib"), [1024], [1], tp=2, tp_split=llama.tp_split)
    assert {(r.layout, r.mode, r.strategy) for r in rows} == {
        ("FSDP 8 x TP 2", TPMode.DISTRIBUTED, Strategy.ALL_TO_ALL),
        ("FSDP 8 x TP 2", TPMode.DISTRIBUTED, Strategy.ALL_GATHER),
        ("FSDP 8 x TP 2", TPMode.DUPLICATED, Strategy.ALL_GATHER),
        ("FSDP 8 x TP 2", TPMode.BLOCKWISE, Strategy.ALL_TO_ALL),
        ("FSDP 8 x TP 2", TPMode.BLOCKWISE, Strategy.ALL_GATHER),
    }
    by = {(r.mode, r.strategy): r.cost for r in rows}
    assert by[TPMode.DUPLICATED, Strategy.ALL_GATHER].ns == by[TPMode.DISTRIBUTED, Strategy.ALL_GATHER].ns
    # the whole matrices over the 16 ranks of (dp, tp); a TP block over the 8 data-parallel ranks
    assert len(by[TPMode.DISTRIBUTED, Strategy.ALL_TO_ALL].ns) == 16 and len(by[TPMode.BLOCKWISE, Strategy.ALL_TO_ALL].ns) == 8
    assert advisor.best(rows).mode is not TPMode.BLOCKWISE
    advisor.main(["--model", "llama-1b", "--world", "8,12", "--tp", "8", "--bucket-mb", "1024", "--prefetch", "1"])
    out = capsys.readouterr().out
    assert "TP 8" in out and "MUON_COMPILE_TP_MODE=" in out and "not Muon's exact update: " in out
    assert "skipped: --tp 8 does not divide it" in out  # world 12
    assert "recommended: " in out and "recommended: TP 8, MUON_COMPILE_TP_MODE=blockwise" not in out


def test_owner_compute_beats_every_rank_computing_everything_within_a_node():
    rows = advisor.sweep(list(MODELS["llama-8b"].matrices), 8, DEVICES["h100"], profile("nvlink-ib"), [1024], [1])
    by = {r.strategy: r.cost for r in rows}
    assert by[Strategy.ALL_TO_ALL].step < by[Strategy.ALL_GATHER].step
    # all_gather: every rank runs all of the NS; all_to_all: about an eighth of it each
    assert max(by[Strategy.ALL_TO_ALL].ns) < 0.2 * by[Strategy.ALL_GATHER].ns[0]


def test_the_launch_bound_share_is_the_devices_wait_for_its_host():
    shapes, network = list(MODELS["llama-1b"].matrices), profile("nvlink-ib")
    slow_host = dataclasses.replace(DEVICES["h100"], call_overhead=5e-3)  # 5 ms of launches an NS call
    for device in (slow_host, dataclasses.replace(slow_host, queues_kernels=False)):
        (row,) = advisor.sweep(shapes, 8, device, network, [64], [1], strategies=(Strategy.ALL_TO_ALL,))
        cost = row.cost
        assert row.launch_share == pytest.approx(cost.launch_bound[cost.slowest_rank] / cost.step)
        # a host that queues kernels runs ahead: the step waits for it, in part
        assert (row.launch_share > 0.1) is device.queues_kernels
    assert "launch-bound" in advisor.describe([row]).splitlines()[0]


def test_command_line_prints_a_recommendation(capsys):
    advisor.main(["--model", "llama-1b", "--world", "8,16", "--bucket-mb", "256", "--prefetch", "1"])
    out = capsys.readouterr().out
    assert "=== world 8 ===" in out and "=== world 16 ===" in out
    assert out.count("recommended: ") == 2
    assert "HSDP 2x8" in out  # 16 ranks: shard groups of 8 tried besides FSDP
    with pytest.raises(SystemExit):
        advisor.main(["--model", "llama-1b", "--world", "eight"])


def test_recommendation_keeps_the_bucket_buffers_within_the_memory_share(capsys):
    shapes = list(MODELS["llama-70b"].matrices)
    rows = advisor.sweep(shapes, 64, DEVICES["h100"], profile("nvlink-ib"), [1024, 16384], [0, 2], strategies=(Strategy.ALL_GATHER,))
    limit = advisor.memory_limit(DEVICES["h100"])
    assert limit == 0.25 * 80e9
    over = [r for r in rows if r.buffers > limit]
    assert over  # all_gather of 16 GiB buckets: every rank holds whole buckets
    chosen = advisor.best(rows, limit)
    assert chosen.buffers <= limit and advisor.best(rows, 1.0) is None
    assert advisor.describe(rows, limit).count("(over memory)") == 1
    # large buckets let all_to_all put every rank to work on a model of large matrices
    advisor.main(["--model", "llama-70b", "--world", "64", "--shard", "64", "--prefetch", "1"])
    out = capsys.readouterr().out
    assert "MUON_COMPILE_STRATEGY=all_to_all MUON_COMPILE_BUCKET_MB=16384" in out
    # at sixteen ranks the buffers of llama-70b's 4 GiB buckets are over a tenth of an H100's memory
    advisor.main(["--model", "llama-70b", "--world", "16", "--bucket-mb", "4096", "--prefetch", "0", "--memory-share", "0.1"])
    out = capsys.readouterr().out
    assert "recommended: none; no configuration's buffers fit in 7.5 GiB (the smallest take 9.04 GiB)" in out
    # at eight ranks its fp32 state alone is over the whole of it: 12 bytes x 68.45B
    # parameters / 8, in every layout, whatever the buffers
    advisor.main(["--model", "llama-70b", "--world", "8", "--bucket-mb", "4096", "--prefetch", "0"])
    out = capsys.readouterr().out
    assert "recommended: none; a rank's fp32 Muon parameters, gradients and momentum take 102.7 GB or more" in out
    assert out.count("(over memory)") == 2
    with pytest.raises(SystemExit):
        advisor.main(["--model", "llama-1b", "--memory-share", "0"])


def test_the_overlapped_all_to_all_bound_reprices_only_the_all_to_all_rows(capsys):
    shapes = list(MODELS["llama-8b"].matrices)
    args = (DEVICES["h100"], profile("nvlink-ib"), [4096, 16384], [0, 2])
    rows = advisor.sweep(shapes, 1024, *args, [64])
    bound = advisor.with_overlapped_exchanges(rows, shapes, *args, [64])
    gather = [r for r in rows if r.strategy is Strategy.ALL_GATHER]
    assert [r for r in bound if r.strategy is Strategy.ALL_GATHER] == gather
    a2a = [r for r in rows if r.strategy is Strategy.ALL_TO_ALL]
    repriced = [r for r in bound if r.strategy is Strategy.ALL_TO_ALL]
    assert [(r.shard, r.bucket_mb, r.prefetch, r.buffers) for r in repriced] == [
        (r.shard, r.bucket_mb, r.prefetch, r.buffers) for r in a2a]
    assert all(o.cost.step <= r.cost.step for o, r in zip(repriced, a2a))
    # FSDP over 1024 ranks: 1023 inter-node latencies per all-to-all, or one
    fsdp = [(o, r) for o, r in zip(repriced, a2a) if r.shard == 1024]
    assert fsdp and all(o.cost.step < 0.5 * r.cost.step for o, r in fsdp)
    # the command line prints both recommendations: at 1024 ranks they differ
    advisor.main(["--model", "llama-8b", "--world", "1024", "--shard", "64", "--bucket-mb", "4096,16384", "--prefetch", "0,2"])
    out = capsys.readouterr().out
    recommended, overlapped = (line for line in out.splitlines() if "recommended: " in line or "overlapped its" in line)
    assert "HSDP 16x64" in recommended
    assert "(1 latency, not W - 1): FSDP, MUON_COMPILE_STRATEGY=all_to_all" in overlapped


def test_ties_are_the_other_layouts_and_strategies_predicted_within_the_models_resolution(capsys):
    rows = advisor.sweep(list(MODELS["llama-1b"].matrices), 16, DEVICES["h100"], profile("nvlink-ib"), [256, 1024], [1], [8])
    chosen = advisor.best(rows)

    def priced(strategy, shard, bucket_mb, factor, buffers=None):
        row = next(r for r in rows if (r.strategy, r.shard, r.bucket_mb) == (strategy, shard, bucket_mb))
        step = chosen.cost.step * factor
        cost = dataclasses.replace(row.cost, total=(step,) * len(row.cost.total))
        return dataclasses.replace(row, cost=cost, buffers=row.buffers if buffers is None else buffers)

    other = Strategy.ALL_GATHER if chosen.strategy is Strategy.ALL_TO_ALL else Strategy.ALL_TO_ALL
    hsdp = 8 if chosen.shard == 16 else 16
    near = priced(other, chosen.shard, 256, 1 + 0.9 * TIE)
    nearer = priced(other, chosen.shard, 1024, 1 + 0.5 * TIE)  # the same layout and strategy: the faster one stands for both
    far = priced(chosen.strategy, hsdp, 256, 1 + 1.1 * TIE)
    same = priced(chosen.strategy, chosen.shard, 256 if chosen.bucket_mb == 1024 else 1024, 1.01)
    assert advisor.ties([chosen, near, nearer, far, same], chosen) == [nearer]
    too_big = dataclasses.replace(nearer, buffers=10**12)
    assert advisor.ties([chosen, near, too_big, far], chosen, 10**11) == [near]
    assert advisor.ties([chosen, far, same], chosen) == []
    # one rank: every strategy compiles to the same single-device step, priced once
    advisor.main(["--model", "llama-1b", "--world", "1", "--bucket-mb", "1024", "--prefetch", "1"])
    out = capsys.readouterr().out
    assert "recommended: FSDP, MUON_COMPILE_STRATEGY=all_to_all MUON_COMPILE_BUCKET_MB=1024" in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("FSDP ")] == ["all_to_all"]
    assert "a tie, within" not in out


def test_the_plots_name_their_missing_dependency(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        plots.main(["--out", str(tmp_path)])


# Compiles and runs a step of muon_compile.Muon on two matrices, then checks the modules loaded.
_COMPILE_PATH = textwrap.dedent("""
    import sys
    import torch
    import muon_compile

    params = [torch.nn.Parameter(torch.randn(8, 16)), torch.nn.Parameter(torch.randn(16, 8))]
    for p in params:
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in params]
    opt = muon_compile.Muon(params, lr=0.02)
    torch.compile(opt.step, backend="muon")()
    assert all(not torch.equal(p, b) for p, b in zip(params, before)), "the step changed nothing"
    loaded = sorted(name for name in sys.modules if name.startswith("muon_compile"))
    assert "muon_compile.compile.backend" in loaded, loaded
    advisor = [name for name in loaded if name.startswith(("muon_compile.advisor", "muon_compile.models"))]
    assert not advisor, f"the compile path imported {advisor}"
""")


@pytest.mark.slow
def test_compiling_a_step_imports_no_advisor_module():
    """The advisor is a tool beside the backend: importing muon_compile, compiling a step
    and running it loads no module of muon_compile.advisor (in a fresh interpreter: this
    one has imported them)."""
    script_runs.python("-c", _COMPILE_PATH, timeout=600)
