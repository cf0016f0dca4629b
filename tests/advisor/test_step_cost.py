"""The cost model (muon_compile/advisor/step_cost.py): a plan's predicted step, by hand on
one bucket, the overlap that prefetch buys, the all_gather strategy's compute, the fixed
costs, host time on a device that queues its kernels."""

import dataclasses
import math

import pytest
import torch

from muon_compile.ns import coefficients
from muon_compile.config import Strategy
from muon_compile.ns.matmul_rates import (
    _CUDA_BF16_FAMILIES,
    ASPECT,
    FAMILIES,
    LONG_INNER,
    LONG_OUTER,
    PROFILES,
    MatmulRates,
    family_product,
)
from muon_compile.advisor.network_profiles import Link, NetworkProfile
from muon_compile.ns.cost import predicted_seconds
from muon_compile.passes.distribute.plan import EVERY_RANK, DistBucket, DistMember, DistPlan
from muon_compile.distributed.sharded_op import ShardLayout
from muon_compile.advisor.step_cost import (
    FIXED_COSTS,
    TIE,
    UPDATE_ACCESSES,
    DeviceProfile,
    buffer_bytes,
    predict,
    tied,
)

ARGS = coefficients.ns_args("keller", 5, compute_dtype=torch.bfloat16, algorithm="textbook")
NET = NetworkProfile("test", "made up", intra=Link(1e-5, 1e9), inter=Link(1e-5, 1e9), ranks_per_node=8)
BW = 10e9


# the NS passes of one 8x16 matrix: the norm, X / norm (read twice, write once), per
# iteration B from A A and A, bf16
NS_PASS_BYTES = 3 * 8 * 16 * 2 + 5 * 3 * 8 * 8 * 2


def _device(overlap, queues=False):
    return DeviceProfile("test", "made up", PROFILES["cpu"], BW, overlap, queues)


def _member(site, rows, cols, world, owner):
    """A 5-step member of rank 0's FSDP2 rows of a ``rows x cols`` matrix over ``world`` ranks."""
    return DistMember(site, ShardLayout.row_chunks(rows, cols, "0", world), math.ceil(rows / world), cols, owner, 5)


def _bucket(strategy=Strategy.ALL_TO_ALL, owners=(0, 1), rows=8, cols=16):
    members = tuple(_member(i, rows, cols, 2, owner) for i, owner in enumerate(owners))
    return DistBucket("0", 2, 0, strategy, ARGS, members)


def _one_bucket_by_hand() -> dict[str, float]:
    """The seconds of the one-bucket all_to_all step of ``_bucket()`` (each rank owning one
    8x16 matrix), priced by hand, part by part."""
    shard = 2 * 4 * 16  # two members, 4 rows of 16 each
    compute = 2 * 2 * (8 * 16) * 2 / BW  # reassemble and cut one owned 8x16 matrix, bf16
    compute += NS_PASS_BYTES / BW
    return {
        "pack": shard * (4 + 2) / BW,
        "collective": NET.seconds("all_to_all_single", shard * 2, 2),
        "ns": predicted_seconds("textbook", 8, 16, 5, torch.bfloat16, PROFILES["cpu"]),
        "compute": compute,
        "update": UPDATE_ACCESSES * shard * 4 / BW,
    }


def _before_and_after_compute() -> tuple[float, float]:
    """The device's seconds of that step up to the end of its compute stage, and after it."""
    t = _one_bucket_by_hand()
    return t["update"] + t["pack"] + t["collective"] + t["ns"] + t["compute"], t["collective"] + t["pack"]


def test_one_bucket_without_overlap_by_hand():
    cost = predict(DistPlan((_bucket(),), (), {}), 1, _device(False), NET)
    t = _one_bucket_by_hand()
    pack, collective, ns = t["pack"], t["collective"], t["ns"]
    expected = pack + collective + ns + t["compute"] + collective + pack + t["update"]
    assert cost.total == pytest.approx((expected, expected))
    assert cost.exposed == pytest.approx((2 * collective, 2 * collective))
    assert cost.communication == pytest.approx(2 * collective)
    assert cost.ns == pytest.approx((ns, ns))


def test_newton_schulz_passes_run_at_their_own_bandwidth_where_the_device_has_one():
    plan = DistPlan((_bucket(),), (), {})
    copy = _device(False)
    assert copy.ns_passes == BW  # none of its own: a copy's
    slower = dataclasses.replace(copy, ns_pass_bandwidth=BW / 4)
    assert slower.ns_passes == BW / 4
    before, after = predict(plan, 1, copy, NET), predict(plan, 1, slower, NET)
    extra = NS_PASS_BYTES * (4 - 1) / BW  # each rank's one owned matrix
    assert after.total == pytest.approx(tuple(t + extra for t in before.total))
    assert after.pointwise == pytest.approx(tuple(p + extra for p in before.pointwise))
    assert after.ns == before.ns and after.exposed == before.exposed


def test_prefetch_hides_communication_where_it_can_overlap():
    plan = DistPlan(tuple(_bucket(rows=64, cols=256) for _ in range(3)), (), {})
    serial, prefetched = (predict(plan, k, _device(True), NET) for k in (0, 1))
    assert serial.exposed[0] == pytest.approx(serial.communication)  # k = 0: every wait stalls
    assert prefetched.exposed[0] < 0.7 * serial.exposed[0]
    assert prefetched.step < serial.step
    no_overlap = predict(plan, 1, _device(False), NET)
    assert no_overlap.exposed[0] == pytest.approx(no_overlap.communication)


def test_a_collective_in_flight_takes_the_network_profiles_share_of_the_compute():
    """On a device whose collectives run on its compute cores (the CPU's gloo threads),
    each rank's compute loses the profile's share of a collective's time at its issue:
    nothing changes where every collective is waited for at once (prefetch 0); with
    prefetch, the step rises with the share, from the step of free overlap (share 0, a
    GPU's) to at most the step of a device whose collectives hold its cores (share 1)."""
    plan = DistPlan(tuple(_bucket(rows=64, cols=256) for _ in range(3)), (), {})
    sharing = [dataclasses.replace(NET, compute_share={"all_to_all_single": ((1.0, s),)}) for s in (0.0, 0.3, 0.7, 1.0)]
    holding = [predict(plan, k, _device(False), NET) for k in (0, 1)]
    for net in sharing:
        cost = predict(plan, 0, _device(True), net)
        assert (cost.total, cost.exposed) == (pytest.approx(holding[0].total), pytest.approx(holding[0].exposed))
    steps = [predict(plan, 1, _device(True), net) for net in sharing]
    assert steps[0] == predict(plan, 1, _device(True), NET)
    assert [c.step for c in steps] == sorted(c.step for c in steps) and len({c.step for c in steps}) == 4
    assert steps[-1].step <= holding[1].step
    # the share is paid whatever the prefetch hides: exposed >= share x communication
    for share, cost in zip((0.0, 0.3, 0.7, 1.0), steps):
        assert min(cost.exposed) >= share * cost.communication * (1 - 1e-9)


def test_a_collective_after_a_stretch_of_compute_costs_the_network_profiles_figure_more():
    """Where ranks share cores, every rank waits for the last to end the stretch before a
    collective: with a cost after compute flat at ``x`` for any stretch, the one-bucket
    all_to_all step (two collectives, each after some compute) rises by ``2x`` at prefetch
    0, all of it exposed; with three buckets and prefetch, by more than nothing and at most
    ``6x`` (a wait it would have made anyway absorbs part of it); the kind without a figure
    costs nothing more."""
    x = 3e-5
    late = dataclasses.replace(NET, after_compute={"all_to_all_single": ((1e-12, x),)})
    one = DistPlan((_bucket(),), (), {})
    before, after = (predict(one, 0, _device(True), net) for net in (NET, late))
    assert after.total == pytest.approx(tuple(t + 2 * x for t in before.total))
    assert after.exposed == pytest.approx(tuple(e + 2 * x for e in before.exposed))
    three = DistPlan(tuple(_bucket(rows=64, cols=256) for _ in range(3)), (), {})
    before, after = (predict(three, 1, _device(True), net) for net in (NET, late))
    assert all(a > b for a, b in zip(after.exposed, before.exposed))
    assert before.step < after.step <= before.step + 6 * x * (1 + 1e-9)
    other = dataclasses.replace(NET, after_compute={"all_gather_into_tensor": ((1e-12, x),)})
    assert predict(one, 0, _device(True), other) == predict(one, 0, _device(True), NET)


def test_a_collective_after_one_ranks_compute_costs_the_one_rank_figure():
    """The one-bucket all_to_all step whose single matrix rank 0 owns, the costs after
    compute flat at ``x`` with every rank computing and ``y`` with one: its first
    collective follows the update and the packing, alike on both ranks (``x``), its
    return collective the compute stage, rank 0's alone (``y``); without the one-rank
    figure, ``x`` both."""
    x, y = 3e-5, 1e-5
    late = dataclasses.replace(NET, after_compute={"all_to_all_single": ((1e-12, x),)})
    alone = dataclasses.replace(late, after_compute_alone={"all_to_all_single": ((1e-12, y),)})
    one = DistPlan((_bucket(owners=(0,)),), (), {})
    before, every, some = (predict(one, 0, _device(True), net) for net in (NET, late, alone))
    assert every.total == pytest.approx(tuple(t + 2 * x for t in before.total))
    assert some.total == pytest.approx(tuple(t + x + y for t in before.total))


def test_ranks_sharing_cores_compute_faster_where_fewer_of_them_compute():
    """Three one-thread ranks on two cores: the profile's rates are those of all three
    computing at once (2/3 of a core each); a rank computing alone, or with one other,
    has a core (x1.5). The one-bucket all_to_all step whose single matrix rank 0 owns: its
    compute stage takes 2/3 of the time; the all_gather step, every rank computing the
    same, is unchanged; and with cores to spare nothing changes."""
    shared = dataclasses.replace(_device(True), shared_cores=2)
    assert [shared.speed(k, 3) for k in (1, 2, 3)] == pytest.approx([1.5, 1.5, 1.0])
    assert _device(True).speed(1, 3) == 1.0 and dataclasses.replace(shared, rank_threads=2).speed(1, 3) == pytest.approx(3.0)

    def plan(strategy, owners):
        members = tuple(_member(i, 8, 16, 3, owner) for i, owner in enumerate(owners))
        return DistPlan((DistBucket("0", 3, 0, strategy, ARGS, members),), (), {})

    one_owner = plan(Strategy.ALL_TO_ALL, (0,))
    alone, sharing = (predict(one_owner, 0, d, NET) for d in (_device(True), shared))
    assert sharing.ns[0] == pytest.approx(alone.ns[0] / 1.5)
    # every rank waits for rank 0's return collective: all gain what its compute stage
    # gains, a third of it, which holds its NS and less than all its own work
    gains = [a - b for a, b in zip(alone.total, sharing.total)]
    assert gains == pytest.approx([gains[0]] * 3)
    assert alone.ns[0] / 3 <= gains[0] * (1 + 1e-9) and gains[0] < (alone.total[0] - alone.exposed[0]) / 3
    everyone = plan(Strategy.ALL_GATHER, (EVERY_RANK,))
    assert predict(everyone, 0, shared, NET) == predict(everyone, 0, _device(True), NET)
    spare = dataclasses.replace(shared, shared_cores=4)  # 3 ranks x 1 thread on 4 cores
    assert predict(one_owner, 0, spare, NET) == alone


def test_all_gather_computes_every_matrix_on_every_rank():
    a2a = predict(DistPlan((_bucket(),), (), {}), 1, _device(False), NET)
    gather = predict(DistPlan((_bucket(Strategy.ALL_GATHER, (EVERY_RANK, EVERY_RANK)),), (), {}), 1, _device(False), NET)
    assert gather.ns[0] == pytest.approx(2 * a2a.ns[0])
    assert gather.ns == pytest.approx(gather.ns[::-1])
    assert len([c for c in _bucket(Strategy.ALL_GATHER).collectives()]) == 1


def test_one_group_per_prediction():
    other = DistBucket("1", 2, 0, Strategy.ALL_TO_ALL, ARGS, _bucket().members)
    with pytest.raises(ValueError, match="one process group"):
        predict(DistPlan((_bucket(), other), (), {}), 1, _device(True), NET)


def test_fixed_costs_add_per_step_parameter_call_bucket_and_collective():
    plan = DistPlan((_bucket(owners=(0, 0)),), (), {})  # two members of one shape, both on rank 0
    # one step, two parameters, one NS call on the busiest rank, one bucket, two collectives (an all_to_all pair)
    base = predict(plan, 1, _device(False), NET)
    costs = dict(zip(FIXED_COSTS, (1e-3, 1e-4, 1e-5, 1e-6, 1e-7)))
    fixed = dataclasses.replace(_device(False), **costs)
    cost = predict(plan, 1, fixed, NET)
    # rank 0's NS call delays the return collective, which every rank waits for
    added = 1e-3 + 2 * 1e-4 + 1e-5 + 1e-6 + 2 * 1e-7
    assert [t - b for t, b in zip(cost.total, base.total)] == pytest.approx([added, added])
    assert cost.ns == base.ns  # fixed costs are not Newton–Schulz arithmetic
    # the cost per collective is the collectives' time, the rest pointwise
    assert cost.communication - base.communication == pytest.approx(2 * 1e-7)
    assert predict(plan, 1, dataclasses.replace(fixed, **dict.fromkeys(FIXED_COSTS, 0.0)), NET) == base


def test_buffer_bytes_hold_the_shards_to_send_and_the_matrices_in_flight():
    a2a = DistPlan((_bucket(owners=(0, 0)), _bucket(owners=(1, 1), rows=16)), (), {})
    s1 = 2 * (2 * 8 * 16)  # bf16 bytes of the second bucket's shard on one rank
    owned = {0: (2 * (2 * 8 * 16), 0), 1: (0, 2 * (2 * 16 * 16))}  # rank 0 owns the first bucket's matrices
    # during bucket 0: bucket 1's shard to send, bucket 0's matrices three times (received,
    # iterated, result); during bucket 1: its own, all shards sent
    prefetch0 = [max(s1 + 3 * o0, 3 * o1) for o0, o1 in owned.values()]
    assert buffer_bytes(a2a, 0) == max(prefetch0)
    # prefetch 1: bucket 1's matrices are received during bucket 0
    prefetch1 = [max(s1 + 3 * o0 + o1, 3 * o1) for o0, o1 in owned.values()]
    assert buffer_bytes(a2a, 1) == max(prefetch1)
    gather = DistPlan((_bucket(Strategy.ALL_GATHER, (EVERY_RANK, EVERY_RANK)),), (), {})
    s0 = 2 * (2 * 4 * 16)
    assert buffer_bytes(gather, 0) == 3 * 2 * s0  # every rank holds the whole bucket, two shards, three times
    assert buffer_bytes(DistPlan((), (), {}), 2) == 0


def test_rates_interpolate_the_call_latency_in_log_size_and_hold_its_ends():
    rates = dataclasses.replace(PROFILES["cpu"], latency={torch.bfloat16: ((8, 2e-6), (32, 10e-6))})
    assert rates.call_seconds(torch.bfloat16, 4, 4, 4) == 2e-6  # below the table: its first entry
    assert rates.call_seconds(torch.bfloat16, 16, 16, 16) == pytest.approx(6e-6)  # halfway in log size
    assert rates.call_seconds(torch.bfloat16, 64, 512, 64) == 10e-6  # beyond it: its last
    assert rates.call_seconds(torch.float32, 16, 16, 16) == 0.0  # no table for the dtype: none
    assert PROFILES["cpu"].call_seconds(torch.bfloat16, 16, 16, 16) == 0.0


def test_call_latency_is_paid_per_product_call_whatever_the_batch():
    # two members of one shape owned by rank 0 and one of another shape: two NS calls on rank 0
    members = (*_bucket(owners=(0, 0)).members, _member(2, 8, 32, 2, 0))
    plan = DistPlan((DistBucket("0", 2, 0, Strategy.ALL_TO_ALL, ARGS, members),), (), {})
    latency = 1e-5
    slow = dataclasses.replace(PROFILES["cpu"], latency={torch.bfloat16: ((8, latency),)})
    base = predict(plan, 1, _device(False), NET)
    cost = predict(plan, 1, dataclasses.replace(_device(False), matmul=slow), NET)
    calls, products = 2, 3 * ARGS.steps  # the textbook iteration: three products per step
    assert cost.ns[0] - base.ns[0] == pytest.approx(calls * products * latency)
    assert cost.ns[1] == base.ns[1] == 0.0  # rank 1 orthogonalises nothing


def test_a_non_square_product_is_priced_between_the_square_rate_and_its_familys_by_log_aspect():
    bf16 = torch.bfloat16
    flat = lambda rate: ((16.0, rate), (4096.0, rate))  # noqa: E731 - one rate at every size
    families = {LONG_INNER: {bf16: flat(50.0)}, LONG_OUTER: {bf16: flat(25.0)}}
    rates = MatmulRates("cpu", "test", {bf16: flat(100.0)}, families=families)
    assert ASPECT == 4
    assert rates.rate(bf16, 128, 128, 128) == pytest.approx(100.0)  # square: the square table
    assert rates.rate(bf16, 128, 512, 128) == pytest.approx(50.0)  # X X^T of a 1:4 matrix
    assert rates.rate(bf16, 128, 128, 512) == pytest.approx(25.0)  # B X of one
    assert rates.rate(bf16, 512, 128, 128) == pytest.approx(25.0)  # the long outer dimension as rows
    assert rates.rate(bf16, 128, 256, 128) == pytest.approx((100.0 * 50.0) ** 0.5)  # aspect 2: halfway in log
    assert rates.rate(bf16, 64, 4096, 64) == pytest.approx(50.0)  # beyond ASPECT: the family's rate
    # without the families' tables (a profile that did not time them): the cube rule
    assert dataclasses.replace(rates, families={}).rate(bf16, 128, 512, 128) == pytest.approx(100.0)
    assert dataclasses.replace(rates, families={LONG_INNER: {torch.float16: flat(1.0)}}).rate(bf16, 128, 512, 128) == pytest.approx(100.0)


def test_two_step_times_within_the_models_resolution_are_tied_either_way_round():
    assert tied(1.0, 1.0 + 0.9 * TIE) and tied(1.0 + 0.9 * TIE, 1.0)
    assert not tied(1.0, 1.0 + 1.1 * TIE) and not tied(1.0 + 1.1 * TIE, 1.0)


def test_measured_family_products_are_priced_at_their_measured_rates():
    # the cuda table's families are measured by short side and held by cube size
    bf16 = torch.bfloat16
    for family in FAMILIES:
        for side, rate in _CUDA_BF16_FAMILIES[family]:
            assert PROFILES["cuda"].rate(bf16, *family_product(family, side)) == pytest.approx(rate), (family, side)


def test_a_device_that_queues_kernels_pays_host_time_only_where_it_would_wait():
    plan = DistPlan((_bucket(),), (), {})
    queued = _device(True, queues=True)
    base = predict(plan, 1, queued, NET)
    # no host time: the same step as a device whose host computes, nothing launch-bound
    assert base == predict(plan, 1, _device(True), NET)
    assert base.launch_bound == (0.0, 0.0)
    before, after = _before_and_after_compute()
    assert base.total == pytest.approx((before + after,) * 2)
    # each rank's one NS call launched while its device works through the stages before it:
    # hidden up to the device's time to the end of the compute stage, paid beyond it
    hidden = predict(plan, 1, dataclasses.replace(queued, call_overhead=0.99 * before), NET)
    assert hidden.total == pytest.approx(base.total) and hidden.launch_bound == (0.0, 0.0)
    paid = predict(plan, 1, dataclasses.replace(queued, call_overhead=2 * before), NET)
    assert paid.total == pytest.approx((2 * before + after,) * 2)
    assert paid.launch_bound == pytest.approx((before, before))
    assert paid.ns == base.ns and paid.pointwise == pytest.approx(base.pointwise)  # host time is neither
    assert paid.host == pytest.approx((2 * before,) * 2) and base.host == (0.0, 0.0)
    # where the host computes, the same cost adds in full, as pointwise time
    cpu = predict(plan, 1, dataclasses.replace(_device(True), call_overhead=2 * before), NET)
    assert cpu.total == pytest.approx((3 * before + after,) * 2) and cpu.launch_bound == (0.0, 0.0)
    assert cpu.host == paid.host  # the same host seconds, within the total here
    # the step's own overhead comes before any launch: the device waits for it in full
    guarded = predict(plan, 1, dataclasses.replace(queued, step_overhead=1e-3), NET)
    assert guarded.total == pytest.approx((1e-3 + before + after,) * 2)
    assert guarded.launch_bound == pytest.approx((1e-3, 1e-3))


def test_the_call_latency_is_host_time_on_a_device_that_queues_kernels():
    plan = DistPlan((_bucket(),), (), {})
    slow = dataclasses.replace(PROFILES["cpu"], latency={torch.bfloat16: ((8, 1.0),)})  # a second a product call
    queued = _device(True, queues=True)
    cost = predict(plan, 1, dataclasses.replace(queued, matmul=slow), NET)
    base = predict(plan, 1, queued, NET)
    assert cost.ns == base.ns  # the arithmetic alone
    products = 3 * ARGS.steps  # one call of the textbook iteration on each rank
    assert cost.launch_bound[0] == pytest.approx(products - _before_and_after_compute()[0])


@pytest.mark.parametrize("queues", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("strategy", list(Strategy))
def test_a_steps_parts_add_up_to_its_total(strategy, overlap, queues):
    owners = (0, 0, 1) if strategy is Strategy.ALL_TO_ALL else (EVERY_RANK,) * 3
    members = tuple(_member(i, 8, cols, 2, owner) for i, (owner, cols) in enumerate(zip(owners, (16, 16, 32))))
    plan = DistPlan(tuple(DistBucket("0", 2, i, strategy, ARGS, members) for i in range(3)), (), {})
    costs = dict(zip(FIXED_COSTS, (3e-4, 2e-5, 4e-5, 1e-5, 1e-6)))
    device = dataclasses.replace(_device(overlap, queues), **costs)
    for prefetch in (0, 1, 2):
        cost = predict(plan, prefetch, device, NET)
        parts = [n + p + e + h for n, p, e, h in zip(cost.ns, cost.pointwise, cost.exposed, cost.launch_bound)]
        assert cost.total == pytest.approx(parts)
        assert min(cost.exposed) >= 0 and min(cost.launch_bound) >= 0 and min(cost.pointwise) > 0
        assert queues or cost.launch_bound == (0.0, 0.0)
