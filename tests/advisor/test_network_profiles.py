"""The network profile of the cost model: the alpha-beta price of each collective."""

import dataclasses

import pytest

from muon_compile.advisor.network_profiles import Link, NetworkProfile, profile

NET = NetworkProfile("test", "made up", intra=Link(1e-5, 100e9), inter=Link(2e-5, 10e9), ranks_per_node=4)


def test_collective_prices_within_a_node():
    b = 8e6
    assert NET.seconds("all_gather_into_tensor", b, 4) == pytest.approx(3 * 1e-5 + 3 * b / 100e9)
    assert NET.seconds("all_to_all_single", b, 4) == pytest.approx(3 * 1e-5 + 0.75 * b / 100e9)
    assert NET.seconds("reduce_scatter_tensor", b, 4) == pytest.approx(3 * 1e-5 + 0.75 * b / 100e9)
    assert NET.seconds("all_reduce", b, 4) == pytest.approx(6 * 1e-5 + 1.5 * b / 100e9)


def test_a_group_beyond_a_node_pays_the_inter_node_link():
    assert NET.seconds("all_to_all_single", 8e6, 8) == pytest.approx(7 * 2e-5 + 7 / 8 * 8e6 / 10e9)


def test_one_rank_costs_nothing_and_unknown_kinds_are_refused():
    assert NET.seconds("all_reduce", 1e9, 1) == 0.0
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        NET.seconds("broadcast", 1.0, 2)
    with pytest.raises(ValueError, match="known: \\['nvlink-ib'\\]"):
        profile("ethernet")


def test_a_link_prices_messages_above_its_boundary_by_its_large_messages_link():
    large = Link(0.0, 1e9)
    net = NetworkProfile("test", "made up", intra=Link(1e-3, 1e12, large_from=2**20, large=large),
                         inter=Link(2e-5, 10e9), ranks_per_node=4)
    assert net.seconds("all_gather_into_tensor", 2**20, 3) == pytest.approx(2 * 1e-3 + 2 * 2**20 / 1e12)
    assert net.seconds("all_gather_into_tensor", 2**20 + 1, 3) == pytest.approx(2 * (2**20 + 1) / 1e9)
    with pytest.raises(ValueError, match="both or neither"):
        Link(1e-3, 1e9, large=large)
    with pytest.raises(ValueError, match="both or neither"):
        Link(1e-3, 1e9, large_from=2**20)


def test_an_all_to_all_whose_exchanges_overlap_pays_fewer_latencies():
    overlapping = dataclasses.replace(NET, exchanges_in_flight=3)
    b = 8e6  # 7 exchanges, 3 at a time: 3 latencies; the bytes sent are the same
    assert overlapping.seconds("all_to_all_single", b, 8) == pytest.approx(3 * 2e-5 + 7 / 8 * b / 10e9)
    assert dataclasses.replace(NET, exchanges_in_flight=8).seconds("all_to_all_single", b, 8) == pytest.approx(
        2e-5 + 7 / 8 * b / 10e9)
    for kind in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"):  # rings: one step after another
        assert overlapping.seconds(kind, b, 8) == NET.seconds(kind, b, 8)
    with pytest.raises(ValueError, match="exchanges_in_flight must be >= 1, got 0"):
        dataclasses.replace(NET, exchanges_in_flight=0)


def test_a_collectives_share_of_the_compute_is_interpolated_in_log_size_and_flat_beyond_its_points():
    net = dataclasses.replace(NET, compute_share={"all_to_all_single": ((4096.0, 0.5), (65536.0, 0.7))})
    assert net.share("all_to_all_single", 16384) == pytest.approx(0.6)  # half way in log size
    assert net.share("all_to_all_single", 1024) == 0.5 and net.share("all_to_all_single", 2**24) == 0.7
    assert net.share("all_gather_into_tensor", 16384) == 0.0 == NET.share("all_to_all_single", 16384)  # none given
    with pytest.raises(ValueError, match="unknown collective kinds \\['broadcast'\\]"):
        dataclasses.replace(NET, compute_share={"broadcast": ((4096.0, 0.5),)})
    with pytest.raises(ValueError, match="compute_share\\['all_reduce'\\] must be points with shares in \\[0, 1\\]"):
        dataclasses.replace(NET, compute_share={"all_reduce": ((4096.0, 1.5),)})


def test_a_collectives_cost_after_compute_is_linear_from_none_and_flat_beyond_its_points():
    kind = "all_gather_into_tensor"
    net = dataclasses.replace(NET, after_compute={kind: ((1e-3, 4e-4), (1e-2, 2e-3))})
    assert net.after(kind, 0.0) == 0.0 and net.after(kind, 5e-4) == pytest.approx(2e-4)  # from none after none
    assert net.after(kind, 5.5e-3) == pytest.approx(1.2e-3)  # half way between the points
    assert net.after(kind, 1.0) == pytest.approx(2e-3)  # flat beyond the last
    assert net.after("all_to_all_single", 5e-3) == 0.0 == NET.after(kind, 5e-3)  # none given
    with pytest.raises(ValueError, match="unknown collective kinds \\['broadcast'\\]"):
        dataclasses.replace(NET, after_compute={"broadcast": ((1e-3, 0.0),)})
    for bad in (((1e-2, 1e-3), (1e-3, 1e-3)), ((0.0, 1e-3),), ((1e-3, -1e-4),), ()):
        with pytest.raises(ValueError, match="after_compute\\['all_reduce'\\] must be points of increasing positive"):
            dataclasses.replace(NET, after_compute={"all_reduce": bad})


def test_a_collectives_cost_after_compute_lies_between_one_rank_computing_and_every_rank():
    kind = "all_to_all_single"
    net = dataclasses.replace(NET, after_compute={kind: ((1e-3, 4e-4),)}, after_compute_alone={kind: ((1e-3, 1e-4),)})
    assert net.after(kind, 1e-3) == pytest.approx(4e-4)  # every rank computing, as before
    assert net.after(kind, 1e-3, 3, 3) == pytest.approx(4e-4)
    assert net.after(kind, 1e-3, 1, 3) == pytest.approx(1e-4)  # one rank computing
    assert net.after(kind, 1e-3, 2, 3) == pytest.approx(2.5e-4)  # linear in the ranks between
    assert net.after(kind, 5e-4, 1, 3) == pytest.approx(5e-5)  # from none after none
    # without the one-rank figure, every rank's, however few computed
    assert dataclasses.replace(net, after_compute_alone={}).after(kind, 1e-3, 1, 3) == pytest.approx(4e-4)
    with pytest.raises(ValueError, match="after_compute_alone\\['all_reduce'\\] must be points of increasing positive"):
        dataclasses.replace(NET, after_compute_alone={"all_reduce": ((1e-3, -1e-4),)})


def test_published_profile_orders_links():
    net = profile("nvlink-ib")
    assert net.seconds("all_gather_into_tensor", 64e6, 8) < net.seconds("all_gather_into_tensor", 64e6, 16)
