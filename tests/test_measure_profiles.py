"""scripts/measure_profiles.py's pure parts (the collective fit, the shuffled turns, the
instances' round medians, the device profile of saved figures, a GPU's fixed costs fitted
to its host times and their report), its timed collectives on
two gloo ranks, and, in the slow tier, scripts/validate_step_cost.py end to end with one
rank, as scripts/gpu_check.sh runs it on one GPU (there with NCCL, here with gloo)."""

import dataclasses
import json
import math
import os
import threading
from pathlib import Path

import pytest
import torch
from dist_harness import run_world
from script_runs import python, torchrun
from torch._inductor.utils import fresh_cache

ROOT = Path(__file__).resolve().parents[1]

import bench_distributed  # noqa: E402
import measure_profiles  # noqa: E402
import validate_step_cost  # noqa: E402
from muon_compile.config import Config, Strategy  # noqa: E402
from muon_compile.matmul_rates import LONG_INNER, LONG_OUTER  # noqa: E402
from muon_compile.network_profiles import Link, NetworkProfile, alpha_beta  # noqa: E402
from muon_compile.plan import plan_for  # noqa: E402
from muon_compile.step_cost import FIXED_COSTS, overhead_counts, predict  # noqa: E402

SAVED = ROOT / "docs" / "runs" / "2026-11-24-world2-shuffled.json"
SAVED_GPU = ROOT / "docs" / "runs" / "gpu" / "2026-11-26-h100-world1-gpt-small.json"


def timed_collectives(rank, world):
    """Each kind's call from measure_profiles.collective on 4 KiB per rank (fp32 for the
    reductions): its output's shape and values, every rank sending its rank + 1."""
    out = {}
    for kind in measure_profiles.COLLECTIVES:
        result = measure_profiles.collective(kind, 4096, world, value=rank + 1)()
        out[kind] = (tuple(result.shape), sorted(set(result.tolist())))
    out["probes"] = {key: count for key, (_, count) in measure_profiles.probe_calls().items()}
    bench_distributed.note_group_threads({threading.get_native_id(): "main"})  # the others are gloo's
    points, out["cpu"] = measure_profiles.measure_network(1)
    out["points"] = {kind: [b for b, _ in kind_points] for kind, kind_points in points.items()}
    out["cpu_expected"] = {"cores": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads(), "points": points}
    measure_profiles.AFTER_GAPS, measure_profiles.AFTER_TIMING = (3e-4, 3e-3), 0.02  # short, for the test
    out["after"] = measure_profiles.measure_after_compute(1)
    out["after_alone"] = measure_profiles.measure_after_compute(1, alone=True)
    return out


def test_collectives_are_timed_as_the_functional_ops_the_step_calls():
    """measure_profiles times what the compiled graph runs (the _c10d_functional op and
    its wait), each on its bytes per rank, with the results the kind defines; the probes
    timed in turns with the validation's steps are the matmul probe and the profile's
    sweep, each kind at each size."""
    sweep = [(kind, nbytes) for kind in measure_profiles.COLLECTIVES for nbytes in measure_profiles.SIZES]
    results = run_world(timed_collectives, 2, timeout=300)
    # a collective's cost after compute: per kind, after each stretch, its products'
    # time (longer after the longer gap) and the cost beyond back to back; the slowest
    # rank's timings, so the same on every rank
    # (and with rank 0 alone computing: its products the stretch, the same on every rank)
    for key in ("after", "after_alone"):
        after = [result.pop(key) for result in results]
        assert after[0] == after[1] and list(after[0]) == list(measure_profiles.AFTER_KINDS)
        for kind, rows in after[0].items():
            assert len(rows) == 2 and 0 < rows[0][0] < rows[1][0], (key, kind, rows)
    for result in results:
        probes = result.pop("probes")
        assert list(probes) == ["matmul", *sweep]
        assert all(count > 0 for count in probes.values())
        assert result.pop("points") == {kind: measure_profiles.SIZES for kind in measure_profiles.COLLECTIVES}
        # with the seconds per call, the seconds gloo's threads ran on a core per call: some at every size
        cpu, expected = result.pop("cpu"), result.pop("cpu_expected")
        assert {**cpu, "points": None} == {**expected, "points": None}
        for kind, kind_points in cpu["points"].items():
            assert [(b, t) for b, t, _ in kind_points] == [tuple(p) for p in expected["points"][kind]]
            assert all(c > 0 for _, _, c in kind_points), (kind, kind_points)
        assert result == {
            "all_gather_into_tensor": ((4096,), [1.0, 2.0]),  # 2048 bf16 per rank, gathered
            "all_to_all_single": ((2048,), [1.0, 2.0]),  # half from each rank
            "all_reduce": ((1024,), [3.0]),  # 1024 fp32, summed
            "reduce_scatter_tensor": ((512,), [3.0]),  # a half of 1024 fp32, summed
        }


def test_a_collectives_share_of_the_compute_is_its_threads_cores_beyond_those_the_compute_leaves_idle():
    """measure_profiles.compute_shares: threads running ``c`` seconds on a core per call of
    ``t`` seconds on each of ``world`` ranks use ``world * c / t`` cores; the ranks' compute
    runs on ``min(cores, world * threads)``, and an idle core takes the threads' work first."""
    def shares(world, cores, threads, *ratios):
        points = [(4096 * 4**i, 1e-3, r * 1e-3) for i, r in enumerate(ratios)]
        cpu = {"cores": cores, "threads": threads, "points": {"all_to_all_single": points}}
        return [s for _, s in measure_profiles.compute_shares(cpu, world)["all_to_all_single"]]

    assert shares(3, 2, 1, 0.3, 0.6) == pytest.approx([0.45, 0.9])  # three ranks on two cores
    assert shares(2, 2, 1, 0.5, 0.8) == pytest.approx([0.5, 0.8])  # a core each
    assert shares(1, 2, 1, 0.3, 1.5) == pytest.approx([0.0, 0.5])  # the idle core first
    assert shares(2, 8, 2, 0.5, 3.0) == pytest.approx([0.0, 0.5])  # four cores idle, four computing
    assert shares(3, 2, 1, 0.9) == [1.0]  # at most all of it
    # the points keep their sizes, as floats, in the profile the validation fits
    cpu = {"cores": 2, "threads": 1, "points": {"all_gather_into_tensor": [(4096, 1e-3, 5e-4)]}}
    network = measure_profiles.network_profile({"all_gather_into_tensor": [(4096, 1e-3)], "all_to_all_single": [(4096, 1e-3)]},
                                               2, "gloo", lambda *_: None, cpu)
    assert network.compute_share == {"all_gather_into_tensor": ((4096.0, 0.5),)}
    assert network.share("all_gather_into_tensor", 10**6) == 0.5 and network.share("all_to_all_single", 4096) == 0.0


def test_fit_recovers_latency_and_bandwidth_and_has_nothing_to_fit_on_one_rank():
    latency, bandwidth = 50e-6, 2e9
    points = [(b, 1 * latency + 0.5 * b / bandwidth) for b in (4096, 65536, 2**20, 2**24)]
    fitted_latency, fitted_bandwidth, worst = measure_profiles.fit(points, 1, 0.5)
    assert fitted_latency == pytest.approx(latency, rel=1e-6)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert worst < 1e-6
    # world 1: alpha_beta gives (0, 0) for every kind, the model prices the collective at 0
    assert measure_profiles.fit([(4096, 3e-5), (65536, 2.9e-5)], 0, 0) == (0.0, math.inf, 0.0)


def test_fit_keeps_both_terms_non_negative():
    # times that fall with the size: latency alone, the least-squares relative fit of a constant
    latency, bandwidth, worst = measure_profiles.fit([(4096, 2e-3), (65536, 1.8e-3), (2**18, 1.5e-3)], 2, 2)
    assert bandwidth == math.inf
    times = (2e-3, 1.8e-3, 1.5e-3)
    assert 2 * latency == pytest.approx(sum(1 / t for t in times) / sum(1 / t**2 for t in times))
    assert worst == pytest.approx(max(abs(2 * latency - t) / t for t in times))


def test_fit_link_splits_sizes_only_where_one_line_misses_a_point_by_more_than_the_tolerance():
    sizes = [2**k for k in range(12, 26, 2)]
    linear = [(b, 1e-3 + b / 1e9) for b in sizes]
    link, worst = measure_profiles.fit_link(linear, 1, 1)
    assert link.large is None and worst < 1e-6
    # gloo's all_gather on the VM: flat up to 256 KiB, then steeper than any one line
    small, large = Link(1e-3, 2e9), Link(0.0, 0.5e9)
    bent = [(b, small.seconds(1, 1, b) if b <= 2**18 else large.seconds(1, 1, b)) for b in sizes]
    link, worst = measure_profiles.fit_link(bent, 1, 1)
    assert measure_profiles.fit(bent, 1, 1)[2] > measure_profiles.TOLERANCE
    assert worst < 1e-6
    assert link.large_from == pytest.approx(2**19)  # halfway between 256 KiB and 1 MiB
    assert (link.latency, link.bandwidth) == pytest.approx((small.latency, small.bandwidth))
    assert link.large.latency == pytest.approx(0.0, abs=1e-12)
    assert link.large.bandwidth == pytest.approx(large.bandwidth)


def pair_predictions(record: dict, **kwargs) -> tuple[dict, list[str]]:
    """validate_step_cost's report of ``record`` (``kwargs`` its options): each of its 16
    pairs' predicted ms by (workload, bucket MiB, buckets, strategy, prefetch), and its lines."""
    lines = []
    validate_step_cost.report(record, lines.append, **kwargs)
    rows = [line.split() for line in lines if line.startswith(("gpt-small ", "small-14 ")) and line.endswith("%")]
    assert len(rows) == 16
    return {tuple(row[:5]): float(row[5]) for row in rows}, lines


def test_collectives_timed_during_the_steps_price_that_workloads_steps():
    """validate_step_cost fits a network profile to the sweep timed in turns with a
    workload's steps (each size's median over the rounds) and prices that workload's
    collectives with it; a run without that sweep (saved before it, or of one rank)
    keeps the profile timed before the steps."""
    latency, bandwidth = 2e-4, 1e9
    during = {}
    for kind in measure_profiles.COLLECTIVES:
        steps, factor = alpha_beta(kind, 2)
        seconds = [steps * latency + factor * b / bandwidth for b in measure_profiles.SIZES]
        during[kind] = [(b, [t, 3 * t, t]) for b, t in zip(measure_profiles.SIZES, seconds)]  # median: t
    record = {"world": 2, "backend": "gloo", "network_during": {"w": during, "v": {}}}
    lines = []
    network = validate_step_cost.network_during(record, "w", lines.append)
    assert lines[0] == "w: the collectives timed in turns with its steps:"
    for kind in measure_profiles.COLLECTIVES:
        link = network.kinds[kind]
        assert (link.latency, link.bandwidth) == pytest.approx((latency, bandwidth), rel=1e-6)
        assert link.large is None  # one line fits all sizes
    assert validate_step_cost.network_during(record, "v", lines.append) is None  # one rank: nothing timed
    assert validate_step_cost.network_during({"world": 2}, "w", lines.append) is None  # saved before


def test_report_prices_each_workload_by_the_collectives_timed_during_its_steps():
    """A saved run given a sweep during small-14's steps with every collective three
    times as slow as the profile timed before: with collectives_during, small-14's
    predictions rise and gpt-small's (no sweep) stay; by default the run reports as saved."""
    record = json.loads(SAVED.read_text())
    slow = {kind: [(b, [3 * t]) for b, t in points] for kind, points in record["network"].items()}
    record["network_during"] = {"small-14": slow}

    during, lines = pair_predictions(record, collectives_during=True)
    before, default_lines = pair_predictions(record)
    assert "small-14: the collectives timed in turns with its steps:" in lines
    assert not any("timed in turns with its steps" in line for line in default_lines)
    del record["network_during"]
    assert pair_predictions(record)[0] == before
    assert any(line.startswith("    with the profiles as timed before the steps") for line in lines)
    for case, predicted in during.items():
        if case[0] == "gpt-small":
            assert predicted == before[case]
        else:
            assert predicted > before[case]


def test_report_fits_each_workloads_fixed_costs_to_the_fixed_cost_steps_timed_during_its_steps():
    """A saved run given fixed-cost steps timed in turns with small-14's steps, each twice
    as slow as the ones timed before: by default (fixed_costs_during), small-14's
    predictions rise and gpt-small's (none timed with its steps) stay; without it the run
    reports as the fixed-cost steps timed before the steps price it.
    The steps are saved as measured (in measure_profiles' FIXED_COST_CASES order, each
    naming its workload and strategy), and a failed one is named."""
    record = json.loads(SAVED.read_text())
    fixed = record["device"]["fixed"]
    record["fixed_during"] = {
        "small-14": [
            {"workload": name, "strategy": strategy.value, "times": [2 * fixed[name][strategy.value]] * 3}
            for name, strategy in measure_profiles.FIXED_COST_CASES
        ]
    }

    during, lines = pair_predictions(record)
    before, before_lines = pair_predictions(record, fixed_costs_during=False)
    assert "small-14: the fixed-cost steps timed in turns with its steps:" in lines
    assert not any("fixed-cost steps timed in turns" in line for line in before_lines)
    for case, predicted in during.items():
        if case[0] == "gpt-small":
            assert predicted == before[case]
        else:
            assert predicted > before[case]
    failed = [dict(step) for step in record["fixed_during"]["small-14"]]
    failed[3] = {"workload": failed[3]["workload"], "strategy": failed[3]["strategy"], "error": "RuntimeError: boom"}
    with pytest.raises(RuntimeError, match="muon-gather on 32 x 8x8 failed: RuntimeError: boom"):
        measure_profiles.fixed_step_medians(failed)


def test_turns_time_each_function_once_a_round_in_an_order_shuffled_alike_on_every_rank(monkeypatch):
    def run(rounds):
        calls = []
        monkeypatch.setattr(measure_profiles, "timed_once", lambda fn: calls.append(fn()) or float(fn()))
        fns = [lambda i=i: i for i in range(5)]
        return measure_profiles.turns(fns, rounds), calls

    times, calls = run(6)
    assert times == [[float(i)] * 6 for i in range(5)]  # each function's own times
    orders = [calls[r * 5 : (r + 1) * 5] for r in range(6)]
    assert all(sorted(order) == list(range(5)) for order in orders)
    assert len({tuple(order) for order in orders}) > 1  # shuffled, not one fixed order
    assert run(6)[1] == calls  # the same order in another process: every rank's collectives match
    # another timer (measure_arms' host times on a GPU) in the same turns
    assert measure_profiles.turns([lambda: 1, lambda: 2], 3, timer=lambda fn: 10.0 * fn()) == [[10.0] * 3, [20.0] * 3]


def test_timed_rounds_follow_the_longest_step_up_to_the_cap():
    rounds = measure_profiles.timed_rounds
    assert rounds(0.01, 5, 2.0) == 200  # 2 s of 10 ms steps
    assert rounds(1.0, 5, 2.0) == 5  # never below reps
    assert rounds(0.01, 5, 0.0) == 5  # arm_seconds 0: reps rounds
    assert rounds(0.002, 5, 2.0, max_rounds=40) == 40  # 1,000 capped
    assert rounds(0.01, 50, 2.0, max_rounds=40) == 50  # the cap never below reps
    assert rounds(0.1, 5, 2.0, max_rounds=40) == 20  # under the cap
    assert rounds(0.0, 5, 2.0) == 0  # no step timed


def test_round_medians_take_the_middle_instance_of_each_round():
    instances = [[1.0, 9.0, 2.0], [2.0, 1.0, 8.0], [3.0, 2.0, 3.0]]
    assert measure_profiles.round_medians(instances) == [2.0, 2.0, 3.0]
    assert measure_profiles.round_medians([[1.0, 2.0]]) == [1.0, 2.0]
    with pytest.raises(ValueError):
        measure_profiles.round_medians([[1.0, 2.0], [1.0]])


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_device_profile_of_saved_figures_overlaps_collectives_only_off_the_cpu(kind):
    figures = dict(json.loads(SAVED.read_text())["device"], kind=kind)
    network = NetworkProfile("flat", "test", intra=Link(1e-4, 1e9), inter=Link(1e-4, 1e9), ranks_per_node=2)
    profile = measure_profiles.device_profile(figures, network, 2, log=lambda *_: None)
    assert profile.name == f"{kind}-w2" and profile.matmul.device == kind
    assert profile.overlaps_communication is profile.queues_kernels is (kind == "cuda")
    assert profile.matmul.tables[next(iter(profile.matmul.tables))] == tuple(tuple(p) for p in figures["matmul"])


def test_the_products_count_is_calibrated_to_the_gap(monkeypatch):
    """``products`` (the probe's, and the validation's cost after a stretch) runs as many
    products as the gap over one product's time, without timing anything here (the
    timings themselves swing with the host's load, so a test of them could fail on a busy
    machine without a fault in the script)."""
    monkeypatch.setattr(measure_profiles, "seconds_per_call", lambda fn, calls: 1e-4)
    calls = []
    monkeypatch.setattr(measure_profiles.torch, "bmm", lambda a, b: calls.append(a.shape))
    measure_profiles.products(0.5e-3)()
    assert calls == [(8, 96, 96)] * 5
    calls.clear()
    measure_profiles.products(0.01e-3)()  # a gap shorter than one product: one
    assert calls == [(8, 96, 96)]


def test_device_profile_prices_the_newton_schulz_passes_where_the_figures_measure_them():
    figures = json.loads(SAVED.read_text())["device"]  # saved before the passes were measured
    network = NetworkProfile("flat", "test", intra=Link(1e-4, 1e9), inter=Link(1e-4, 1e9), ranks_per_node=2)
    old = measure_profiles.device_profile(figures, network, 2, log=lambda *_: None)
    assert "ns_pass_bandwidth" not in figures and old.ns_passes == old.memory_bandwidth == figures["memory_bandwidth"]
    lines = []
    new = measure_profiles.device_profile(dict(figures, ns_pass_bandwidth=3.5e9), network, 2, log=lines.append)
    assert new.ns_passes == new.ns_pass_bandwidth == 3.5e9 and new.memory_bandwidth == old.memory_bandwidth
    assert "Newton–Schulz passes: 3.50 GB/s" in lines


def test_the_newton_schulz_passes_probe_times_ns_kernels_passes_on_their_bytes(monkeypatch):
    """The probe's passes normalise a stack of wide bf16 matrices and take one polynomial
    step on square ones, and its bandwidth is the bytes the cost model counts for them over
    one normalisation and an iteration's steps (timings made up: their values swing)."""
    monkeypatch.setattr(measure_profiles, "rank_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(measure_profiles, "NS_PASS_BATCH", {"cpu": 2})
    outputs = []

    def per_call(fns, reps):
        outputs.extend(fn() for fn in fns)
        return [1e-3, 2e-3]

    monkeypatch.setattr(measure_profiles, "per_call", per_call)
    with fresh_cache():
        bandwidth = measure_profiles._ns_pass_bandwidth(1)
    rows, cols = measure_profiles.NS_PASS_SHAPE
    normalised, step = outputs
    assert normalised.shape == (2, rows, cols) and normalised.dtype == torch.bfloat16
    assert torch.linalg.vector_norm(normalised.float(), dim=(-2, -1)).tolist() == pytest.approx([1.0, 1.0], rel=1e-2)
    assert step.shape == (2, rows, rows) and step.dtype == torch.bfloat16
    steps = measure_profiles.NS_STEPS
    passes = 2 * (rows * cols * 3 * 2 + steps * 3 * rows * rows * 2)  # ns_cost.pointwise_bytes, textbook, bf16
    assert bandwidth == pytest.approx(passes / (1e-3 + steps * 2e-3))


def test_device_profile_shares_the_cores_only_where_the_ranks_threads_outnumber_them():
    figures = json.loads(SAVED.read_text())["device"]  # one thread per rank
    network = NetworkProfile("flat", "test", intra=Link(1e-4, 1e9), inter=Link(1e-4, 1e9), ranks_per_node=3)

    def shared(world, cores, kind="cpu"):
        return measure_profiles.device_profile(dict(figures, kind=kind), network, world, log=lambda *_: None, cores=cores).shared_cores

    assert figures["threads"] == 1
    assert shared(3, 2) == 2  # three ranks on two cores
    assert shared(2, 2) == 0 and shared(3, 0) == 0  # a core each; not recorded
    assert shared(3, 2, "cuda") == 0  # a GPU's ranks compute on devices of their own


def test_device_profile_prices_non_square_products_where_the_figures_time_them():
    figures = json.loads(SAVED.read_text())["device"]
    network = NetworkProfile("flat", "test", intra=Link(1e-4, 1e9), inter=Link(1e-4, 1e9), ranks_per_node=2)
    lines = []
    before = measure_profiles.device_profile(figures, network, 2, log=lambda *_: None)
    assert before.matmul.families == {}  # saved before the families were timed: the cube rule
    families = {LONG_INNER: [[s, r / 2] for s, r in figures["matmul"]], LONG_OUTER: [[s, r / 4] for s, r in figures["matmul"]]}
    after = measure_profiles.device_profile(dict(figures, matmul_families=families), network, 2, log=lines.append)
    assert sum(" (x4), by short side: " in line for line in lines) == 2
    bf16 = torch.bfloat16
    # a family's product of short side s is timed at cube size s * 4 ** (1/3): s = 256 is
    # priced at its own measured rate
    rate = dict(figures["matmul"])[256]
    assert after.matmul.rate(bf16, 256, 1024, 256) == pytest.approx(rate / 2)
    assert after.matmul.rate(bf16, 256, 256, 1024) == pytest.approx(rate / 4)
    assert after.matmul.rate(bf16, 256, 256, 256) == before.matmul.rate(bf16, 256, 256, 256)


def _fixed_figures_of(figures: dict, network: NetworkProfile, world: int, costs: dict[str, float]) -> dict:
    """``figures`` with fixed-cost steps that take the cost model's price with ``costs``
    (seconds per :data:`~muon_compile.step_cost.FIXED_COSTS` term)."""
    bare = measure_profiles.device_profile(figures, network, world, log=lambda *_: None).without_fixed_costs()
    device = dataclasses.replace(bare, **costs)
    fixed = {}
    for name, (shapes, mb) in measure_profiles.FIXED_COST_WORKLOADS.items():
        for strategy in measure_profiles.STRATEGY_ARMS:
            plan = plan_for(shapes, world, strategy, mb)
            fixed.setdefault(name, {})[strategy.value] = predict(plan, Config.prefetch, device, network).step
    return dict(figures, fixed=fixed)


def test_fixed_cost_fit_recovers_a_cost_per_collective_only_where_one_is_constant():
    figures = json.loads(SAVED.read_text())["device"]
    network = NetworkProfile("flat", "test", intra=Link(1e-4, 1e9), inter=Link(1e-4, 1e9), ranks_per_node=2)
    costs = dict(zip(FIXED_COSTS, (300e-6, 40e-6, 70e-6, 20e-6, 150e-6)))
    steps = _fixed_figures_of(figures, network, 2, costs)
    fitted = measure_profiles.device_profile(steps, network, 2, log=lambda *_: None)
    assert {term: getattr(fitted, term) for term in FIXED_COSTS} == pytest.approx(costs, abs=1e-9)
    # gloo's threads at ordinary priority: no cost per collective is fitted, the rest still is
    assert measure_profiles.collectives_wait_behind_compute("gloo", realtime_gloo=False)
    assert not measure_profiles.collectives_wait_behind_compute("gloo", realtime_gloo=True)
    assert not measure_profiles.collectives_wait_behind_compute("nccl", realtime_gloo=False)
    ordinary = measure_profiles.device_profile(steps, network, 2, log=lambda *_: None, per_collective=False)
    assert ordinary.collective_overhead == 0 and ordinary.step_overhead > 0
    # a saved run says how its gloo threads ran: the report fits the cost per collective by it
    record = {"device": steps, "world": 2, "backend": "gloo"}
    assert validate_step_cost.recorded_device(record, network, lambda *_: None).collective_overhead == 0
    realtime = validate_step_cost.recorded_device(dict(record, realtime_gloo=True), network, lambda *_: None)
    assert realtime.collective_overhead == pytest.approx(costs["collective_overhead"], abs=1e-9)
    # one rank issues no collective: nothing to fit per collective
    alone = measure_profiles.device_profile(_fixed_figures_of(figures, network, 1, costs), network, 1, log=lambda *_: None)
    assert alone.collective_overhead == 0


def test_fixed_cost_fit_prices_its_own_steps_where_the_costs_delay_the_collectives_after_them():
    # a collective after a stretch of compute starts later (NetworkProfile.after), and the
    # fixed costs lengthen the stretches: fitted to the steps less their price without
    # fixed costs, the costs would hold that delay and the model would charge it again
    figures = json.loads(SAVED.read_text())["device"]
    after = {kind: ((1e-3, 0.4e-3), (4e-3, 1.2e-3)) for kind in ("all_to_all_single", "all_gather_into_tensor")}
    network = NetworkProfile("flat", "test", intra=Link(1e-4, 1e9), inter=Link(1e-4, 1e9), ranks_per_node=3,
                             after_compute=after)
    costs = dict(zip(FIXED_COSTS, (1200e-6, 90e-6, 200e-6, 20e-6, 100e-6)))
    steps = _fixed_figures_of(figures, network, 3, costs)
    lines = []
    fitted = measure_profiles.device_profile(steps, network, 3, log=lines.append)
    assert {term: getattr(fitted, term) for term in FIXED_COSTS} == pytest.approx(costs, abs=1e-7)
    assert any("as priced with its fixed costs: median |error| 0.0%, worst" in line for line in lines), lines
    bare = fitted.without_fixed_costs()
    delayed = 0
    for shapes, mb in measure_profiles.FIXED_COST_WORKLOADS.values():
        plan = plan_for(shapes, 3, Strategy.ALL_TO_ALL, mb)
        counts = dict(zip(FIXED_COSTS, overhead_counts(plan)))
        linear = predict(plan, Config.prefetch, bare, network).step + sum(costs[t] * counts[t] for t in FIXED_COSTS)
        delayed += predict(plan, Config.prefetch, fitted, network).step > linear + 1e-4
    assert delayed  # the costs delay collectives beyond their own seconds: a fit that ignored it would miss


def test_fit_by_rounds_halves_a_round_that_overshoots_and_keeps_a_negative_term_at_zero():
    # each step's price rises 2.5 times as fast as its counts say: a whole round's change
    # overshoots further each round, and the fit settles only by halving it
    counts = torch.tensor([[1.0, 1.0, 0.0], [1.0, 3.0, 0.0], [1.0, 5.0, 1.0], [1.0, 2.0, 2.0]], dtype=torch.float64)
    terms = ["step", "param", "extra"]
    truth = {"step": 2e-3, "param": 1e-4, "extra": 0.0}

    def price(costs):
        return [2.5 * sum(float(n) * costs[t] for n, t in zip(row, terms)) for row in counts]

    measured = [p - 1e-5 * (i == 3) for i, p in enumerate(price(truth))]  # the last step asks for a negative extra
    lines = []
    fitted, prices = measure_profiles.fit_by_rounds(price, counts, measured, terms, lines.append)
    assert not lines  # settled within the rounds
    assert fitted["extra"] == 0.0
    assert fitted["step"] == pytest.approx(truth["step"], rel=1e-2)
    assert fitted["param"] == pytest.approx(truth["param"], rel=5e-2)
    assert prices == price(fitted)
    assert sum((m - p) ** 2 for m, p in zip(measured, prices)) < 1e-10


def arms_timed_as_on_a_gpu(rank, world):
    """measure_arms on gloo ranks with its GPU branch taken and each arm a plain function
    (no compile): its results, and how many calls each arm had."""
    calls = {}

    def arm(key, shapes, mesh, overrides, warmup):
        calls[key] = 0

        def step():
            calls[key] += 1
        return step

    measure_profiles.on_gpu = lambda: True
    measure_profiles.compiled_arm = arm
    arms = [("muon-a2a", [], {}), ("muon-gather", [], {})]
    results, _ = measure_profiles.measure_arms(arms, None, 0, 3, arm_seconds=0.0)
    return results, calls


def test_arms_timed_on_a_gpu_keep_the_time_their_host_took_to_issue_each_call():
    for results, calls in run_world(arms_timed_as_on_a_gpu, 2, timeout=120):
        # 3 rounds timed, then as many host timings (fewer than HOST_ROUNDS), after one call
        # that finds the longest step
        assert calls == {"muon-a2a": 1 + 3 + 3, "muon-gather": 1 + 3 + 3}
        for result in results:
            assert len(result["times"]) == len(result["host_times"]) == 3
            assert all(t > 0 for t in result["host_times"])


def arms_with_their_own_instance_counts(rank, world):
    """measure_arms on gloo ranks with each arm a plain function (no compile), the first
    built twice and the second once: its results, and how many instances each arm built."""
    built = {}

    def arm(key, shapes, mesh, overrides, warmup):
        built[key] = built.get(key, 0) + 1
        return lambda: None

    measure_profiles.compiled_arm = arm
    arms = [("muon-a2a", [], {}), ("muon-gather", [], {})]
    results, _ = measure_profiles.measure_arms(arms, None, 0, 3, instances=[2, 1], arm_seconds=0.0)
    try:
        measure_profiles.measure_arms(arms, None, 0, 3, instances=[2], arm_seconds=0.0)
    except ValueError as exc:
        return results, built, str(exc)


def test_each_arm_may_have_its_own_count_of_compiled_instances():
    for results, built, error in run_world(arms_with_their_own_instance_counts, 2, timeout=120):
        assert built == {"muon-a2a": 2, "muon-gather": 1}
        assert len(results[0]["times"]) == 3 and len(results[0]["instance_times"]) == 2
        assert results[0]["times"] == pytest.approx([(a + b) / 2 for a, b in zip(*results[0]["instance_times"])])
        assert len(results[1]["times"]) == 3 and "instance_times" not in results[1]
        assert error == "measure_arms: 1 instance counts for 2 arms"


def arms_built_in_caches(rank, world):
    """The Inductor cache directory that each arm (a plain function, no compile) was built
    in: measure_arms twice with caches of its own, then twice in one cache of the caller's;
    and that cache."""
    seen = []

    def arm(key, shapes, mesh, overrides, warmup):
        seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        return lambda: None

    measure_profiles.compiled_arm = arm
    arms = [("muon-a2a", [], {})]
    for _ in range(2):
        measure_profiles.measure_arms(arms, None, 0, 1, arm_seconds=0.0)
    with fresh_cache():
        for _ in range(2):
            measure_profiles.measure_arms(arms, None, 0, 1, arm_seconds=0.0, own_cache=False)
        return seen, os.environ["TORCHINDUCTOR_CACHE_DIR"]


def test_arms_compile_in_a_cache_of_their_own_or_in_the_callers():
    for seen, caller in run_world(arms_built_in_caches, 2, timeout=120):
        assert None not in seen and seen[0] != seen[1] and caller not in seen[:2]
        assert seen[2:] == [caller, caller]  # a step compiled the second time is read back


def runs_with_the_measurements_stubbed(rank, world):
    """The cache directory, and ``own_cache``, that validate_step_cost.measure_run gives
    the device profile and each workload's steps (stubs: nothing measured), in two runs."""
    seen = []

    def device(reps, arm_seconds, own_cache=True):
        seen.append(("device", os.environ.get("TORCHINDUCTOR_CACHE_DIR"), own_cache))
        return {}

    def interleaved(name, *args, own_cache=True):
        seen.append((name, os.environ.get("TORCHINDUCTOR_CACHE_DIR"), own_cache))
        return [], {"matmul": []}, []

    validate_step_cost.measure_device = device
    validate_step_cost.measure_network = lambda reps: ({}, {})
    validate_step_cost.measure_interleaved = interleaved
    for _ in range(2):
        validate_step_cost.measure_run(["small-14", "gpt-small"], 1, 0, 1, 1, 0.0, None)
    return seen


def test_a_validation_run_compiles_every_step_in_one_fresh_cache():
    for seen in run_world(runs_with_the_measurements_stubbed, 2, timeout=120):
        first, second = seen[:3], seen[3:]
        assert [name for name, _, _ in seen] == ["device", "small-14", "gpt-small"] * 2
        assert not any(own for _, _, own in seen)  # the run's cache, not one of their own
        assert len({d for _, d, _ in first}) == len({d for _, d, _ in second}) == 1
        assert first[0][1] not in (None, second[0][1])  # a fresh one for each run


def test_a_gpus_fixed_costs_are_fitted_to_its_host_times_where_the_run_has_them():
    """Fixed-cost steps whose host times are the model's host seconds plus made-up costs,
    and whose step times are something else (a busy device): the fit to the host times
    recovers the costs; without them, the fit to the step times cannot."""
    figures = dict(json.loads(SAVED_GPU.read_text())["device"])
    network = NetworkProfile("flat", "test", intra=Link(1e-4, 1e9), inter=Link(1e-4, 1e9), ranks_per_node=1)
    costs = dict(zip(FIXED_COSTS, (300e-6, 40e-6, 70e-6, 20e-6, 0.0)))  # one rank: no collective
    bare = measure_profiles.device_profile(figures, network, 1, log=lambda *_: None).without_fixed_costs()
    assert bare.queues_kernels
    host, busy = {}, {}
    for name, (shapes, mb) in measure_profiles.FIXED_COST_WORKLOADS.items():
        for strategy in measure_profiles.STRATEGY_ARMS:
            plan = plan_for(shapes, 1, strategy, mb)
            counts = dict(zip(FIXED_COSTS, overhead_counts(plan)))
            issued = max(predict(plan, Config.prefetch, bare, network).host)
            host.setdefault(name, {})[strategy.value] = issued + sum(costs[t] * counts[t] for t in FIXED_COSTS)
            busy.setdefault(name, {})[strategy.value] = 0.05  # 50 ms whatever the step: not its host
    lines = []
    fitted = measure_profiles.device_profile(dict(figures, fixed=busy, fixed_host=host), network, 1, log=lines.append)
    # one rank's steps make one NS call per bucket (muon_compile.plan.local_plan): the fit
    # prices the two together, per NS call
    expected = dict(costs, call_overhead=costs["call_overhead"] + costs["bucket_overhead"], bucket_overhead=0.0)
    assert {term: getattr(fitted, term) for term in FIXED_COSTS} == pytest.approx(expected, abs=1e-9)
    assert any(line.startswith("compiled Muon step's host time beyond its arithmetic: ") for line in lines)
    by_steps = measure_profiles.device_profile(dict(figures, fixed=busy), network, 1, log=lambda *_: None)
    assert by_steps.step_overhead > 0.01  # the 50 ms steps, priced as fixed costs
    # the CPU's host computes: its host times, were they recorded, are not fitted apart
    on_cpu = dict(figures, fixed=busy, kind="cpu")
    cpu = [measure_profiles.device_profile(f, network, 1, log=lambda *_: None) for f in (on_cpu, dict(on_cpu, fixed_host=host))]
    # the same fit twice: equal but for lstsq's last bits, which differed when the test ran
    # after others in its xdist worker (3.881335630247516e-06 against ...17e-06 per parameter)
    assert {term: getattr(cpu[1], term) for term in FIXED_COSTS} == pytest.approx(
        {term: getattr(cpu[0], term) for term in FIXED_COSTS}, rel=1e-12
    )
    assert cpu[1] == dataclasses.replace(cpu[0], **{term: getattr(cpu[1], term) for term in FIXED_COSTS})


def test_a_gpus_fixed_costs_timed_during_the_steps_are_fitted_to_their_host_times():
    """On a GPU the fixed costs are fitted to host times: the fixed-cost steps timed in
    turns with a workload's steps bring theirs, which replace the ones timed before."""
    record = json.loads(SAVED_GPU.read_text())
    before = record["device"]["fixed"]
    record["device"]["fixed_host"] = {n: {s: t / 2 for s, t in by.items()} for n, by in before.items()}
    record["fixed_during"] = {
        "gpt-small": [
            {"workload": name, "strategy": strategy.value, "times": [before[name][strategy.value]],
             "host_times": [0.8 * before[name][strategy.value]]}
            for name, strategy in measure_profiles.FIXED_COST_CASES
        ]
    }

    def quiet(*_):
        pass

    network = validate_step_cost.network_profile(record["network"], 1, record["backend"], quiet)
    during = validate_step_cost.during_device(record, network, "gpt-small", quiet)
    host = {n: {s: 0.8 * t for s, t in by.items()} for n, by in before.items()}
    expected = measure_profiles.device_profile(dict(record["device"], fixed_host=host), network, 1, quiet)
    as_before = validate_step_cost.recorded_device(record, network, quiet)

    def costs(device):
        return {term: getattr(device, term) for term in FIXED_COSTS}

    assert costs(during) == pytest.approx(costs(expected), rel=1e-12)
    assert costs(during) != pytest.approx(costs(as_before), rel=1e-3)
    assert validate_step_cost.during_device(record, network, "small-14", quiet) is None  # none timed with it


def test_report_prints_each_pairs_host_time_beside_the_models_where_the_run_has_them():
    record = json.loads(SAVED_GPU.read_text())
    plain = []
    validate_step_cost.report(record, plain.append)
    assert not any(" host issued the step " in line for line in plain)
    for entry in record["steps"]:
        entry["host_times"] = [0.004, 0.005, 0.006]  # a median of 5 ms
    lines = []
    validate_step_cost.report(record, lines.append)
    host = [line for line in lines if " host issued the step " in line]
    assert len(host) == 8 and all("in 5.00 ms (median of 3), predicted " in line for line in host)
    errors = [float(line.split("predicted ")[1].split("(")[1].split("%")[0]) for line in host]
    summary = next(line for line in lines if line.startswith("host time, 8 pairs: median |error| "))
    assert f"worst {max(abs(e) for e in errors):.1f}%" in summary
    assert [line for line in lines if " host issued the step " not in line and not line.startswith("host time")] == plain


@pytest.mark.slow(seconds=200)
def test_validate_step_cost_runs_end_to_end_on_one_rank(tmp_path):
    saved = tmp_path / "world1.json"
    out = torchrun(
        "validate_step_cost.py", "--backend", "gloo", "--workload", "small-14", "--reps", "3", "--profile-reps", "3",
        "--instances", "1", "--arm-seconds", "0", "--split-steps", "2", "--save", str(saved), world=1, timeout=600,
    ).stdout
    record = json.loads(saved.read_text())
    assert record["world"] == 1 and record["device"]["kind"] == "cpu"
    assert record["device"]["fixed_timing"].startswith("in turns with the probes")
    assert "fixed-cost steps in turns with the probes, 40 rounds at most" in out
    steps = record["steps"]
    assert len(steps) == 8 and all("error" not in s for s in steps), steps
    assert all(len(s["times"]) == 3 for s in steps)  # --arm-seconds 0: --reps rounds, no more
    assert all("instance_times" not in s for s in steps)  # one instance each (several: measure_arms' test)
    # by default the fixed-cost steps are timed in the same rounds, one instance each, and
    # the workload's fixed costs fitted to them
    fixed = record["fixed_during"]["small-14"]
    assert [(f["workload"], f["strategy"]) for f in fixed] == [
        (name, strategy.value) for name, strategy in measure_profiles.FIXED_COST_CASES
    ]
    assert all(len(f["times"]) == 3 and "instance_times" not in f for f in fixed)
    assert "small-14: the fixed-cost steps timed in turns with its steps:" in out
    assert "8 pairs: median |error|" in out
    # the one-rank network: nothing priced, nothing fitted
    assert "all_to_all_single: latency 0.0 us, bandwidth unbounded" in out
    assert record["network_during"] == {"small-14": {}}  # no collective to time on one rank
    # what gloo's threads cost the cores, per kind and size, and the shares fitted to it
    cpu = record["network_cpu"]
    assert (cpu["cores"], cpu["threads"]) == (len(os.sched_getaffinity(0)), record["device"]["threads"])
    assert {kind: [p[0] for p in points] for kind, points in cpu["points"].items()} == {
        kind: measure_profiles.SIZES for kind in measure_profiles.COLLECTIVES
    }
    assert out.count("    share of the compute in flight: 4 KiB ") == len(measure_profiles.COLLECTIVES)
    assert len(record["probe"]["small-14"]) == len(steps[0]["times"])  # the matmul probe, each round
    for s in steps:  # each arm profiled in 2 more rounds and 2 steps alone, its one rank's split of each
        for split in (*s["split"], *s["split_alone"]):
            assert split["matmul"] > 0 and split["wall"] > split["matmul"] + split["collectives"]
            assert sum(split[k] for k in ("matmul", "kernels", "collectives", "rest")) == pytest.approx(split["wall"])
    assert out.count("profiled in turns ") == 8 and "(alone " in out and "(NS " in out and "+ fixed " in out
    reloaded = python(str(ROOT / "scripts" / "validate_step_cost.py"), "--load", str(saved), timeout=300).stdout
    assert reloaded.splitlines()[-4:] == out.splitlines()[-4:]  # a saved run reports as measured


# a step's buffers, ten of 6 MiB, freed at its end; prints whether the first came from
# glibc's heap, the heap's end before and after they were freed, and the minor page faults
# of five steps after four
STEP_FAULTS = """
import resource, sys, torch
sys.path.insert(0, sys.argv[1])
import bench_distributed
if sys.argv[2] == "kept":
    bench_distributed.keep_freed_memory()
def heap():
    line = next(line for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]"))
    return [int(address, 16) for address in line.split()[0].split("-")]
buffers = [torch.ones(6 * 2**18) for _ in range(10)]
start, end = heap()
in_heap = start <= buffers[0].data_ptr() < end
del buffers
print(in_heap, end, heap()[1])
def step():
    buffers = [torch.ones(6 * 2**18) for _ in range(10)]
for _ in range(4):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_freed_memory_kept_spares_each_step_faulting_its_buffers_back_in():
    """glibc by default maps a 6 MiB block afresh (its first mmap threshold is 128 KiB) and
    trims its heap's freed top; kept, the block comes from the heap, the heap keeps its end
    once the step's buffers are freed, and steps after the first few fault no page in."""
    def run(mode):
        out = python("-c", STEP_FAULTS, str(ROOT / "scripts"), mode, timeout=120).stdout.split()
        return out[0] == "True", int(out[1]), int(out[2]), int(out[3])

    assert not run("default")[0]
    in_heap, end, end_after_free, faults = run("kept")
    assert in_heap and end_after_free == end and faults == 0
