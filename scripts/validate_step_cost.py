"""Validate the cost model on this machine: predicted against measured distributed steps.

    torchrun --nproc-per-node W scripts/validate_step_cost.py [--workload all] [--reps 15]
        [--profile-reps 15] [--instances 3] [--arm-seconds 2] [--split-steps 10]
        [--backend gloo|nccl] [--realtime-gloo] [--keep-freed-memory] [--no-fixed-costs-during-steps] [--save run.json]
    python scripts/validate_step_cost.py --load run.json [--collectives-during-steps]
        [--no-fixed-costs-during-steps]

First the raw figures of the profiles (scripts/measure_profiles.py: gloo or NCCL collectives,
matmul rates, memory bandwidth and the compiled step on small matrices, all ranks at
once), because this VM's speed drifts between days. Then, for each workload of
scripts/bench_distributed.py, each strategy (all_to_all, all_gather), each prefetch depth
(0, 1) and two bucket sizes (the default, one bucket here, and a split into several
buckets, where prefetch changes the schedule): the measured step (bench_distributed's
arms, the slowest rank's median), the eight arms of a workload compiled first and then
timed in turns, ``--reps`` rounds or more, up to ``--arm-seconds`` (measure_profiles'
``ARM_SECONDS``) of the slowest arm's steps (:func:`measure_interleaved`), each round
also timing measure_profiles' ``probe_calls`` (the matmul probe, and the network
profile's sweep of collectives), in an order shuffled each round. Each arm is
``--instances`` compiled instances of its step, and its time in a round is their median
(instances of one step measured medians up to 13% apart). Then, on the CPU, each arm's
split (scripts/step_split.py: matmuls, collectives, the rest) in ``--split-steps`` more
rounds profiled in the same turns, and its first instance's alone. Unless
``--no-fixed-costs-during-steps``, measure_profiles' fixed-cost steps are built again
for each workload (one instance each, read from the run's Inductor cache) and timed in
the same rounds as its steps. ``--save`` writes all of it as JSON.

The report fits the profiles to the figures and prints, beside each measured step, the
cost model's prediction from the plan of the same shapes
(``muon_compile.plan.plan_for`` and ``muon_compile.step_cost.predict``), the device's
matmul rates scaled per workload by the probe's rate during its steps over the profile's
(:func:`drift_corrected`), the collectives priced by the network profile timed before
the steps (``--collectives-during-steps``: per workload by the one fitted to the sweep
timed in turns with its steps, :func:`network_during`), the fixed costs fitted per
workload to the fixed-cost steps timed in turns with its steps (:func:`during_device`;
to those timed before the steps with ``--no-fixed-costs-during-steps``, or where the run
has none, as runs saved before 2026-11-27), and its error (under it,
where the run has it, the measured split of the predicted slowest rank beside the
model's, :func:`split_line`), and per workload, bucket size and depth whether the predicted ranking of the strategies
is the measured one, and whether the predictions lie further apart than
``muon_compile.step_cost.TIE`` (closer, the model calls them a tie): by the arms'
medians, and round by round (:func:`sign_test`: the rounds pair steps taken moments
apart; a ranking the rounds do not resolve at 5% is "unresolved"), and whether the
medians lie further apart than two arms of one plan did (:func:`same_plan_spread`;
before measure_profiles' turns were shuffled, the sign test separated even those, the
arm timed first after the probe always slower). ``--load`` prints the report of a saved
run without measuring (no torchrun): the current model against the same measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics

import torch
import torch.distributed as dist
from torch._inductor.utils import fresh_cache
from torch.distributed.device_mesh import init_device_mesh

from bench_distributed import WORKLOADS, add_backend_argument, machine, rank_device, start_backend
from measure_profiles import (
    ARM_SECONDS,
    FIXED_COST_ARMS,
    FIXED_COST_CASES,
    FIXED_COST_INSTANCES,
    PROBE_SIZE,
    STRATEGY_ARMS,
    by_kind,
    collectives_wait_behind_compute,
    device_profile,
    fixed_step_medians,
    measure_after_compute,
    measure_arms,
    measure_device,
    measure_network,
    network_profile,
    summary,
)
from step_split import predicted_split

from muon_compile.config import Config
from muon_compile.network_profiles import NetworkProfile
from muon_compile.plan import plan_for
from muon_compile.step_cost import TIE, DeviceProfile, StepCost, predict, stages, tied

# a bucket size per workload that splits it into several buckets
SPLIT_MB = {"gpt-small": 4.0, "small-14": 0.02}


# The order of a compiled step's collectives, as saved runs record it. Runs saved before
# 2026-11-27 (evening) compiled their steps with Inductor's peak-memory reordering on,
# which undid the schedule pass's prefetch (docs/design.md, "Overlap in the generated code").
SCHEDULED_ORDER = "the schedule pass's"
UNSCHEDULED_NOTE = ("# steps compiled before the backend kept the schedule pass's order: "
                    "the prefetch-1 arms ran without prefetch, bar one return")


def cases(names: list[str]):
    """``(workload, bucket MiB, prefetch)`` of each comparison of the strategies."""
    for name in names:
        for mb in (Config.bucket_mb, SPLIT_MB[name]):
            for prefetch in (0, 1):
                yield name, mb, prefetch


def measure_interleaved(
    name: str,
    mesh,
    warmup: int,
    reps: int,
    instances: int,
    arm_seconds: float,
    split_steps: int = 0,
    fixed_costs: bool = False,
    own_cache: bool = True,
) -> tuple[list[dict], dict, list[dict]]:
    """One entry per case of workload ``name`` and strategy, with its step times (or the
    error it failed with), the eight arms timed in turns (measure_profiles'
    :func:`measure_arms`: at least ``reps`` rounds, more for short steps up to
    ``arm_seconds`` of the slowest arm's, each arm as
    ``instances`` compiled instances, a round's time the median of theirs), and the
    probes timed in the same rounds (measure_profiles' ``probe_calls``: the matmul
    probe's GFLOP/s, the network sweep's seconds per call under ``(kind, bytes)``), and,
    with ``split_steps``, every rank's measured split (scripts/step_split.py) of that
    many more rounds, profiled in the same turns, under ``"split"``, and of that many
    steps of its first instance alone under ``"split_alone"``. With ``fixed_costs``, the
    fixed-cost steps (measure_profiles' ``FIXED_COST_ARMS``, ``FIXED_COST_INSTANCES``
    compiled instances each, as measure_device times them before the steps) are timed in
    the same rounds too, and their results returned third, in ``FIXED_COST_CASES``'
    order, each entry naming its workload and strategy (else an empty list).
    ``own_cache``: as :func:`measure_arms` takes it."""
    entries, arms = [], []
    for _, mb, prefetch in cases([name]):
        for strategy, arm in STRATEGY_ARMS.items():
            entries.append({"workload": name, "bucket_mb": mb, "prefetch": prefetch, "strategy": strategy.value})
            arms.append((arm, WORKLOADS[name], {"bucket_mb": mb, "prefetch": prefetch}))
    fixed_arms = FIXED_COST_ARMS if fixed_costs else []
    results, probes = measure_arms(  # the fixed-cost steps as measure_device times them
        arms + fixed_arms, mesh, warmup, reps, True,
        [instances] * len(arms) + [FIXED_COST_INSTANCES] * len(fixed_arms), arm_seconds, split_steps,
        own_cache=own_cache,
    )
    for entry, result in zip(entries, results):
        entry.update(result)
    fixed = [{"workload": n, "strategy": s.value, **r} for (n, s), r in zip(FIXED_COST_CASES, results[len(entries) :])]
    return entries, probes, fixed


@fresh_cache()  # one for the run (a decorator: a fresh one each call)
def measure_run(
    names: list[str],
    reps: int,
    warmup: int,
    profile_reps: int,
    instances: int,
    arm_seconds: float,
    save: str | None,
    realtime_gloo: bool = False,
    split_steps: int = 0,
    fixed_costs_during: bool = True,
    keep_freed_memory: bool = False,
) -> dict:
    """Every figure of a validation run, as plain data: the header, the profiles' raw
    figures, and ``steps``, one entry per case and strategy with its step times (or the
    error it failed with); with ``fixed_costs_during``, ``fixed_during``, per workload the
    fixed-cost steps timed in turns with its steps (their times, and splits as the
    steps'). Rank 0 writes it to ``save`` after each workload's steps, so a
    run stopped early keeps the workloads it measured. Every step is compiled in one
    fresh Inductor cache, so that the fixed-cost steps, compiled again for each workload,
    are read from it (4 of them: 29.4 s compiled, 3.5 s read back, world 1)."""
    world = dist.get_world_size()
    record = {
        "header": f"world {world}, {dist.get_backend()}, torch {torch.__version__}, {machine()}, "
        f"{torch.get_num_threads()} threads per rank" + (", gloo's threads real-time" if realtime_gloo else "")
        + (", freed memory kept" if keep_freed_memory else ""),
        "world": world,
        "realtime_gloo": realtime_gloo,
        "keep_freed_memory": keep_freed_memory,
        "generated_order": SCHEDULED_ORDER,
        "backend": dist.get_backend(),
        "network_timing": "back to back",
        "step_timing": f"interleaved in shuffled order, {reps} rounds or {arm_seconds:g} s of the slowest arm"
        + (f", {instances} compiled instances per arm" if instances > 1 else "")
        + (", the fixed-cost steps in turns with them, one instance each" if fixed_costs_during else ""),
        "device": measure_device(profile_reps, arm_seconds, own_cache=False),
        "steps": [],
        "probe": {},
        "network_during": {},
    }
    record["network"], record["network_cpu"] = measure_network(profile_reps)
    if record["network_cpu"] and world > 1:  # ranks on the cores the collectives' threads use
        record["after_compute"] = measure_after_compute(profile_reps)
        record["after_compute_alone"] = measure_after_compute(profile_reps, alone=True)
    mesh = init_device_mesh(rank_device().type, (world,))
    for name in names:
        steps, probes, fixed = measure_interleaved(
            name, mesh, warmup, reps, instances, arm_seconds, split_steps, fixed_costs_during, own_cache=False
        )
        if fixed:
            record.setdefault("fixed_during", {})[name] = fixed
        record["probe"][name] = probes.pop("matmul")
        record["network_during"][name] = by_kind(probes)
        record["steps"] += steps
        if save and dist.get_rank() == 0:
            with open(save, "w") as f:
                json.dump(record, f, indent=1)
    return record


def report(record: dict, log=print, collectives_during: bool = False, fixed_costs_during: bool = True) -> None:
    """Fit the profiles to ``record``'s figures and print every prediction beside its
    measurement, the collectives priced by the network profile timed before the steps.
    ``collectives_during``: each workload's by the one timed in turns with its steps
    (:func:`network_during`), where the run has it. Not the default: on the two runs
    that have it, it changed no ranking and raised the median error (docs/benchmarks.md).
    ``fixed_costs_during`` (the default): each workload's device with its fixed costs
    fitted to the fixed-cost steps timed in turns with its steps (:func:`during_device`),
    where the run has them; else to those timed before the steps. It is the default since
    2026-11-27: on six runs it left no run with fewer pairs within 20% and raised them
    from 45 to 53 of 64 (docs/benchmarks.md)."""
    world = record["world"]
    # runs saved before 2026-11-24 timed each collective alone after a barrier, and each
    # arm's steps one after another
    timing = f"collectives timed {record.get('network_timing', 'alone after a barrier')}"
    if "step_timing" in record:
        timing += f", steps {record['step_timing']}"
    # runs saved before 2026-11-25 timed the fixed-cost steps in turns among themselves only
    timing += f", fixed-cost steps {record['device'].get('fixed_timing', 'in turns without the probes')}"
    log(f"# {record['header']}; {timing}")
    if record.get("generated_order") != SCHEDULED_ORDER:
        log(UNSCHEDULED_NOTE)
    network = recorded_network(record, log)
    device = recorded_device(record, network, log)
    names = list(dict.fromkeys(s["workload"] for s in record["steps"]))
    devices = {
        name: drift_corrected((fixed_costs_during and during_device(record, network, name, log)) or device, record, name, log)
        for name in names
    }
    networks = {name: (network_during(record, name, log) if collectives_during else None) or network for name in names}
    interleaved = record.get("step_timing", "").startswith("interleaved")
    steps = {(s["workload"], s["bucket_mb"], s["prefetch"], s["strategy"]): s for s in record["steps"]}
    spread = {name: same_plan_spread(steps, name, world, interleaved, log) for name in names}
    log(f"\n{'workload':<10} {'bucket MiB':>10} {'buckets':>7} {'strategy':<10} {'prefetch':>8} "
        f"{'predicted ms':>12} {'(NS':>7} {'pointwise':>9} {'exposed':>9} {'launch)':>8} {'measured ms':>11} {'error':>7}")
    errors, uncorrected, paired_verdicts, resolved_verdicts, rankings, host_errors = [], [], [], [], [], []
    products = {name: [0.0, 0.0, 0] for name in names}  # the model's NS at the profile's rates, profiled matmul, steps
    for name, mb, prefetch in cases(names):
        pair = {}
        for strategy in STRATEGY_ARMS:
            entry = steps.get((name, mb, prefetch, strategy.value))
            if entry is None:  # a run stopped early
                continue
            if "error" in entry:
                log(f"{name:<10} {mb:>10g} {strategy.value}: measurement failed: {entry['error']}")
                continue
            plan = plan_for(WORKLOADS[name], world, strategy, mb)
            cost = predict(plan, prefetch, devices[name], networks[name])
            measured = statistics.median(entry["times"])
            error = cost.step / measured - 1
            errors.append(abs(error))
            followed = devices[name] is not device or networks[name] is not network
            as_profiled = predict(plan, prefetch, device, network) if followed else cost
            uncorrected.append(abs(as_profiled.step / measured - 1))
            pair[strategy] = (cost.step, measured, entry["times"])
            r = cost.slowest_rank
            log(f"{name:<10} {mb:>10g} {len(plan.buckets):>7} {strategy.value:<10} {prefetch:>8} "
                f"{cost.step * 1e3:>12.2f} {cost.ns[r] * 1e3:>7.2f} {cost.pointwise[r] * 1e3:>9.2f} "
                f"{cost.exposed[r] * 1e3:>9.2f} {cost.launch_bound[r] * 1e3:>8.2f} {measured * 1e3:>11.2f} {error:>+7.1%}")
            if "split" in entry or "split_alone" in entry:
                log(split_line(entry, r, predicted_split(plan, prefetch, devices[name], networks[name])[r]))
                tally = products[name]
                tally[0] += as_profiled.ns[r]
                tally[1] += entry["split" if "split" in entry else "split_alone"][r]["matmul"]
                tally[2] += 1
            if "host_times" in entry:  # a GPU run since 2026-11-27
                line, host_error = host_line(entry, cost)
                host_errors.append(abs(host_error))
                log(line)
        if len(pair) == 2:
            order = [sorted(pair, key=lambda s: pair[s][i]) for i in (0, 1)]
            # at one rank both strategies compile to the same step (plan_for's local_plan)
            equal = len({cost for cost, _, _ in pair.values()}) == 1
            verdict = "no ranking" if equal else "matches" if order[0] == order[1] else "DIFFERS"
            predicted = "equal predicted" if equal else f"{' < '.join(s.value for s in order[0])} predicted"
            log(f"{'':<10} ranking {' < '.join(s.value for s in order[1])} measured, {predicted}: {verdict}")
            slower, faster = (pair[s][0] for s in reversed(order[0]))
            ranked = not tied(slower, faster)
            rankings.append((ranked, verdict))
            log(f"{'':<10} predictions {slower / faster - 1:.1%} apart: "
                f"{'ranked' if ranked else f'a tie (within {TIE:.0%})'}")
            gap = pair[order[1][1]][1] / pair[order[1][0]][1] - 1
            if spread[name] is not None:
                resolved = gap > spread[name]
                resolved_verdicts.append(verdict if resolved else "unresolved")
                log(f"{'':<10} medians {gap:.1%} apart, the same plan's {spread[name]:.1%}: "
                    f"{'resolved' if resolved else 'not resolved'}")
            if not interleaved:  # consecutive runs of steps: no rounds to pair
                continue
            first, second = STRATEGY_ARMS
            wins, rounds, p = sign_test(pair[first][2], pair[second][2])
            faster = first if wins > rounds - wins else second
            paired = "unresolved" if p >= 0.05 else verdict if equal else ("matches" if faster == order[0][0] else "DIFFERS")
            paired_verdicts.append(paired)
            log(f"{'':<10} paired rounds: {first.value} faster in {wins}/{rounds} "
                f"(sign test p {p:.2g}): {paired}")
    if errors:
        log(f"\n{len(errors)} pairs: {summary(errors)}")
        if uncorrected != errors:
            log(f"    with the profiles as timed before the steps, nothing followed during them: {summary(uncorrected)}")
    if host_errors:
        log(f"host time, {len(host_errors)} pairs: {summary(host_errors)}")
    if rankings:
        apart = [v for ranked, v in rankings if ranked]
        log(f"rankings predicted more than {TIE:.0%} apart: {len(apart)} of {len(rankings)}, "
            f"{apart.count('matches')} of them as measured")
    if resolved_verdicts:
        resolved = [v for v in resolved_verdicts if v != "unresolved"]
        log(f"rankings by medians further apart than the same plan's: {len(resolved)} of "
            f"{len(resolved_verdicts)}, {resolved.count('matches')} of them as predicted")
    if paired_verdicts:
        resolved = [v for v in paired_verdicts if v != "unresolved"]
        log(f"paired rankings: {len(resolved)} of {len(paired_verdicts)} resolved by the rounds, "
            f"{resolved.count('matches')} of them as predicted")
    for name, (ns, matmul, count) in products.items():
        if count:
            log(products_line(record, name, ns, matmul, count))


def products_line(record: dict, name: str, ns: float, matmul: float, count: int) -> str:
    """How fast workload ``name``'s own products ran against the profile's matmul rates,
    beside how fast the matmul probe timed in turns with them ran: the model's NS of its
    ``count`` profiled steps at the profile's rates (``ns`` seconds, summed) over their
    profiled matmul time (``matmul``). Where the two factors differ, the probe does not
    follow the steps' products (world 3 on 2 cores: docs/benchmarks.md, "The matmul probe
    against the steps' own products")."""
    line = (f"{name}: its own products in {count} profiled steps at x{ns / matmul:.3f} the profile's matmul rates "
            f"(the model's NS at those rates {ns * 1e3:.2f} ms, profiled matmul {matmul * 1e3:.2f} ms)")
    rates = probe_rates(record, name)
    if rates is not None:
        line += f"; the probe in turns with them x{rates[0] / rates[1]:.3f}"
    return line


def host_line(entry: dict, cost: StepCost) -> tuple[str, float]:
    """One pair's host time (measure_arms' ``host_times``, the slowest rank's host issuing
    the step) beside the cost model's host seconds of its busiest host and that rank's
    launch-bound time, ms; and the relative error of the host seconds."""
    issued = statistics.median(entry["host_times"])
    r = cost.host.index(max(cost.host))
    error = cost.host[r] / issued - 1
    return (f"{'':<10} host issued the step in {issued * 1e3:.2f} ms (median of {len(entry['host_times'])}), "
            f"predicted {cost.host[r] * 1e3:.2f} ({error:+.1%}), launch-bound {cost.launch_bound[r] * 1e3:.2f}"), error


def split_line(entry: dict, rank: int, predicted: dict[str, float]) -> str:
    """One pair's measured split (scripts/step_split.py) on ``rank`` beside the cost
    model's ``predicted`` one, ms per step: matmul against NS, collectives against
    exposed communication, generated kernels and the rest against pointwise work and
    fixed costs. The split is the one profiled in turns where ``entry`` has it, with the
    wall time of the steps profiled alone beside; else (the first run that had one) the
    one profiled alone."""
    alone = entry["split_alone"][rank] if "split_alone" in entry else None
    if "split" in entry:
        measured = entry["split"][rank]
        how = f"in turns {measured['wall'] * 1e3:.2f} ms" + (f" (alone {alone['wall'] * 1e3:.2f})" if alone else "")
    else:
        measured, how = alone, f"alone {alone['wall'] * 1e3:.2f} ms"
    ms = {k: v * 1e3 for k, v in measured.items()}
    want = {k: v * 1e3 for k, v in predicted.items()}
    return (f"{'':<10} profiled {how}: matmul {ms['matmul']:.2f} (NS {want['NS']:.2f}), "
            f"collectives {ms['collectives']:.2f} (exposed {want['exposed']:.2f}), "
            f"kernels and rest {ms['kernels'] + ms['rest']:.2f} (pointwise {want['pointwise']:.2f} + fixed {want['fixed']:.2f})")


def same_plan_spread(steps: dict, name: str, world: int, interleaved: bool, log) -> float | None:
    """How far apart two arms of one plan measured: where prefetch 0 and 1 give a plan
    the same schedule (one bucket: nothing to prefetch), the two arms compile and run
    the same step, so the relative difference of their medians (the larger over the
    strategies) is what this run cannot tell apart from a difference of strategies;
    None where workload ``name`` has no such pair. Logs each pair, with the rounds' sign
    test where the arms were timed in turns."""
    widest = None
    for mb in (Config.bucket_mb, SPLIT_MB[name]):
        for strategy in STRATEGY_ARMS:
            plan = plan_for(WORKLOADS[name], world, strategy, mb)
            if stages(plan, 0) != stages(plan, 1):
                continue
            arms = [steps.get((name, mb, prefetch, strategy.value), {}).get("times") for prefetch in (0, 1)]
            if not all(arms):
                continue
            medians = [statistics.median(t) for t in arms]
            apart = max(medians) / min(medians) - 1
            widest = apart if widest is None else max(widest, apart)
            rounds = ""
            if interleaved:
                wins, count, p = sign_test(*arms)
                rounds = f"; prefetch 0 faster in {wins}/{count} rounds (sign test p {p:.2g})"
            log(f"{name} {strategy.value} {mb:g} MiB: prefetch 0 and 1 run the same schedule, "
                f"medians {medians[0] * 1e3:.2f} and {medians[1] * 1e3:.2f} ms, {apart:.1%} apart{rounds}")
    return widest


def probe_rates(record: dict, name: str) -> tuple[float, float] | None:
    """The matmul probe's median rate in turns with workload ``name``'s steps and the
    profile's rate at the probe's size (GFLOP/s); None for runs saved without a probe."""
    rates = record.get("probe", {}).get(name)
    return (statistics.median(rates), dict(record["device"]["matmul"])[PROBE_SIZE]) if rates else None


def drift_corrected(device: DeviceProfile, record: dict, name: str, log) -> DeviceProfile:
    """``device`` with its matmul rates scaled by the probe timed in turns with workload
    ``name``'s steps (measure_profiles' ``probe``) over the table's rate at the probe's
    size: the rates that held while the steps ran; ``device`` itself for runs saved
    before 2026-11-24's probe."""
    rates = probe_rates(record, name)
    if rates is None:
        return device
    during, profiled = rates
    factor = during / profiled
    log(f"{name}: matmul probe ({PROBE_SIZE}, bf16) in turns with the steps {during:.1f} GFLOP/s, "
        f"the profile's {profiled:.1f}: its matmul rates x{factor:.3f}")
    why = f"the probe in turns with {name}'s steps"
    return dataclasses.replace(device, matmul=device.matmul.scaled(factor, why))


def workload_profiles(record: dict, name: str, log=lambda *_: None) -> tuple[DeviceProfile, NetworkProfile]:
    """The profiles that :func:`report` prices workload ``name``'s steps of ``record`` with
    by default: fitted to the figures timed before the steps, the matmul rates
    :func:`drift_corrected` for ``name``."""
    network = recorded_network(record, log)
    return drift_corrected(recorded_device(record, network, log), record, name, log), network


def recorded_network(record: dict, log) -> NetworkProfile:
    """The network profile fitted (measure_profiles' ``network_profile``) to ``record``'s
    collectives timed before the steps, with what they cost the compute where the run
    measured it (:func:`compute_costs`)."""
    return network_profile(record["network"], record["world"], record["backend"], log, **compute_costs(record))


def compute_costs(record: dict) -> dict:
    """``network_profile``'s arguments of what the collectives cost the ranks' compute, as
    ``record`` measured them before the steps: the shares of the compute they take in
    flight (``network_cpu``; runs saved before 2026-11-27's evening have none) and their
    cost after a stretch of compute (``after_compute``; none before 2026-11-28), and with one
    rank computing (``after_compute_alone``; none before 2026-11-28's morning)."""
    return {"cpu": record.get("network_cpu"), "after": record.get("after_compute"),
            "after_alone": record.get("after_compute_alone")}


def recorded_device(record: dict, network: NetworkProfile, log) -> DeviceProfile:
    """The device profile fitted (measure_profiles' ``device_profile``) to ``record``'s
    figures, with ``network`` pricing its fixed-cost steps' collectives; a cost per
    collective among its fixed costs unless gloo's threads ran at ordinary priority
    (``collectives_wait_behind_compute``; runs saved before 2026-11-25 did not raise them);
    the cores its ranks share where the run recorded them (``network_cpu``)."""
    realtime = record.get("realtime_gloo", False)
    per_collective = not collectives_wait_behind_compute(record["backend"], realtime)
    cores = (record.get("network_cpu") or {}).get("cores", 0)
    return device_profile(record["device"], network, record["world"], log, per_collective, cores)


def during_device(record: dict, network: NetworkProfile, name: str, log) -> DeviceProfile | None:
    """The device profile of :func:`recorded_device` with its fixed costs fitted to the
    fixed-cost steps timed in turns with workload ``name``'s steps (``fixed_during``, saved
    unless ``--no-fixed-costs-during-steps``), logged under the workload's name: the step's fixed
    costs while its steps ran, as the matmul probe gives the matmul rates' (on a GPU their
    host times too, which the fit takes there). None for runs saved without them."""
    steps = record.get("fixed_during", {}).get(name)
    if not steps:
        return None
    log(f"{name}: the fixed-cost steps timed in turns with its steps:")
    figures = {**record["device"], "fixed": fixed_step_medians(steps)}
    if host := fixed_step_medians(steps, "host_times"):
        figures["fixed_host"] = host
    return recorded_device({**record, "device": figures}, network, lambda line: log(f"  {line}"))


def network_during(record: dict, name: str, log) -> NetworkProfile | None:
    """The network profile fitted (measure_profiles' ``network_profile``) to the
    collectives timed in turns with workload ``name``'s steps (each kind at each size of
    the profile's sweep, the median of the rounds), logged under the workload's name:
    the collectives' speed while the steps ran, as the matmul probe gives the matmul
    rates'; what they cost the compute is what was measured before the steps
    (:func:`compute_costs`, where the run has it). None for runs saved without that
    sweep (before it was timed, or of one rank): the collectives of the profile timed
    before the steps price the steps then."""
    during = record.get("network_during", {}).get(name)
    if not during:
        return None
    points = {kind: [(nbytes, statistics.median(series)) for nbytes, series in sizes] for kind, sizes in during.items()}
    log(f"{name}: the collectives timed in turns with its steps:")
    return network_profile(points, record["world"], record["backend"], lambda line: log(f"  {line}"), **compute_costs(record))


def sign_test(first: list[float], second: list[float]) -> tuple[int, int, float]:
    """Two arms timed in turns, compared round by round: ``(rounds the first was faster,
    rounds without a tie, two-sided sign-test p-value of no difference)``. Rounds pair
    steps taken moments apart, so a slow spell of the VM slows both arms of a round."""
    wins = sum(a < b for a, b in zip(first, second))
    rounds = sum(a != b for a, b in zip(first, second))
    tail = min(wins, rounds - wins)
    p = min(1.0, 2 * sum(math.comb(rounds, k) for k in range(tail + 1)) / 2**rounds) if rounds else 1.0
    return wins, rounds, p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile-reps", type=int, default=15)
    parser.add_argument("--instances", type=int, default=3, help="compiled instances of each arm (a round's time: their median)")
    parser.add_argument("--arm-seconds", type=float, default=ARM_SECONDS,
                        help="time each arm's steps for this long at least (0: --reps rounds only, a quick check)")
    parser.add_argument("--save", metavar="JSON", help="write the run's figures here")
    add_backend_argument(parser)
    parser.add_argument("--load", metavar="JSON", help="report a saved run instead of measuring")
    parser.add_argument("--split-steps", type=int, default=10,
                        help="profile this many steps of each arm after its timing, for the measured split (0: none)")
    parser.add_argument("--collectives-during-steps", action="store_true",
                        help="price each workload's collectives by the profile timed in turns with its steps, "
                        "not the one timed before them")
    parser.add_argument("--fixed-costs-during-steps", action=argparse.BooleanOptionalAction, default=True,
                        help="time the fixed-cost steps in turns with each workload's steps too (ten more steps "
                        "per workload, read from the run's Inductor cache), and fit each workload's fixed costs to "
                        "those (default); with --no-..., to the fixed-cost steps timed before the steps only")
    args = parser.parse_args()
    if args.load:
        with open(args.load) as f:
            report(json.load(f), collectives_during=args.collectives_during_steps,
                   fixed_costs_during=args.fixed_costs_during_steps)
        return
    start_backend(parser, args)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    record = measure_run(
        names, args.reps, args.warmup, args.profile_reps, args.instances, args.arm_seconds, args.save,
        args.realtime_gloo, args.split_steps, args.fixed_costs_during_steps, args.keep_freed_memory,
    )
    if dist.get_rank() == 0:
        report(record, collectives_during=args.collectives_during_steps,
               fixed_costs_during=args.fixed_costs_during_steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
