"""The calibration (muon_compile/advisor/calibrate.py) and its profile files
(muon_compile/advisor/profiles.py): a device profile measured on the CPU at tiny sizes
that the advisor runs with, a network profile measured on two gloo ranks, the fit of a
link, and files saved and loaded back exactly or refused naming the bad field."""

import dataclasses
import json
import math

import pytest
import torch

from dist_harness import run_world
from muon_compile.ns.matmul_rates import FAMILIES
from muon_compile.advisor import calibrate, profiles, recommend
from muon_compile.advisor.network_profiles import COLLECTIVES, PROFILES, Link, alpha_beta
from muon_compile.advisor.step_cost import DEVICES, FIXED_COSTS

CPU = torch.device("cpu")


def test_a_cpu_calibration_at_tiny_sizes_is_a_profile_the_advisor_runs_with(tmp_path, capsys):
    path = tmp_path / "cpu.json"
    lines = []
    device, network = calibrate.calibrate(str(path), CPU, max_size=64, max_bytes=16384, reps=1, log=lines.append)
    assert network is None and lines[-1] == f"wrote {path}"
    assert profiles.load(path) == (device, None)
    rates = device.matmul
    assert rates.device == "cpu" and set(rates.tables) == set(calibrate.DTYPES)
    assert all([s for s, _ in table] == [32, 64] and min(r for _, r in table) > 0 for table in rates.tables.values())
    assert set(rates.families) == set(FAMILIES)  # at short side 32, their long side 128
    assert [s for s, _ in rates.latency[torch.bfloat16]] == [8, 16, 32, 64]  # a CPU's single products
    assert device.memory_bandwidth > 0 and not device.queues_kernels and not device.overlaps_communication
    assert all(getattr(device, name) == 0.0 for name in FIXED_COSTS)  # not measured: none on a CPU
    timings = json.loads(path.read_text())["measurements"]["rows"]
    assert ["copy", 2.0 * calibrate.COPY_BYTES["cpu"]] == timings[-1][:2]
    recommend.main(["--model", "llama-1b", "--world", "2,8", "--bucket-mb", "256", "--prefetch", "1", "--profile", str(path)])
    out = capsys.readouterr().out
    assert "device cpu-calibrated: measured by muon_compile.advisor.calibrate" in out
    assert "network nvlink-ib" in out  # the file has none: --network's default
    # a configuration for each world: which one depends on this CPU's timings (one repetition)
    assert out.count("recommended: ") == 2 and "recommended: none" not in out


def _calibrate_rank(rank, world, path):
    return calibrate.calibrate(path, CPU, max_size=32, max_bytes=16384, reps=1, log=lambda line: None)


@pytest.mark.distributed
@pytest.mark.slow  # two processes started: about 10 s
def test_a_two_rank_calibration_fits_a_link_per_collective_kind(tmp_path):
    path = tmp_path / "gloo.json"
    results = run_world(_calibrate_rank, 2, str(path), timeout=300)
    assert results[0] == results[1]  # the slowest rank's timings, fitted alike on both
    device, network = results[0]
    assert profiles.load(path) == (device, network)
    assert network.name == "gloo-w2" and network.ranks_per_node == 2
    assert set(network.kinds) == set(COLLECTIVES)
    assert all(link.latency >= 0 and link.bandwidth > 0 and link.large is None for link in network.kinds.values())
    assert network.intra == network.inter == network.kinds["all_to_all_single"]  # one node: no link between nodes
    timings = json.loads(path.read_text())["measurements"]["rows"]
    collectives = [t[1:4] for t in timings if t[0] == "collective"]
    assert collectives == [[kind, 2, nbytes] for kind in COLLECTIVES for nbytes in (4096, 16384)]


def test_the_fit_recovers_a_link_and_drops_a_negative_term():
    link = Link(2e-5, 5e9)
    points = [(*alpha_beta(kind, g), b, link.seconds(*alpha_beta(kind, g), b))
              for kind in ("all_gather_into_tensor", "all_reduce") for g in (2, 4) for b in (4096, 2**20, 2**24)]
    fitted, worst = calibrate.fit_link(points)
    assert fitted.latency == pytest.approx(2e-5, rel=1e-3) and fitted.bandwidth == pytest.approx(5e9, rel=1e-3)
    assert worst < 1e-3
    flat = [(1, 1, b, 1e-3) for b in (4096, 16384, 65536)]  # no time grows with the size: latency alone
    assert calibrate.fit_link(flat)[0] == Link(1e-3, math.inf)
    assert calibrate.group_sizes(6) == [2, 4, 6] and calibrate.group_sizes(8) == [2, 4, 8] and calibrate.group_sizes(1) == []


def test_a_saved_profile_loads_back_equal(tmp_path):
    large = Link(3e-5, 2e9, large_from=2**20, large=Link(1e-4, 1e9))
    network = dataclasses.replace(PROFILES["nvlink-ib"], kinds={"all_reduce": large, "all_to_all_single": Link(0.0, math.inf)})
    path = tmp_path / "h100.json"
    profiles.save(path, DEVICES["h100"], network, {"anything": [1, "two"]})
    assert profiles.load(path) == (DEVICES["h100"], network)
    profiles.save(path, DEVICES["h100"])
    assert profiles.load(path) == (DEVICES["h100"], None)
    with pytest.raises(ValueError, match="network.compute_share: a profile file does not hold it"):
        profiles.to_json(DEVICES["h100"], dataclasses.replace(network, compute_share={"all_reduce": ((1.0, 0.5),)}))


def _edited(tmp_path, edit):
    data = profiles.to_json(DEVICES["h100"], PROFILES["nvlink-ib"])
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["device"]["matmul"]["rates"].update(bfloat16=[[64, 1.0], [32, 2.0]]), "device.matmul.rates.bfloat16: must be"),
        (lambda d: d["device"]["matmul"]["rates"].pop("float16"), "device.matmul.rates: needs .* missing \\['float16'\\]"),
        (lambda d: d["device"].pop("memory_bandwidth"), "device.memory_bandwidth: missing"),
        (lambda d: d["device"].update(memory_bandwith=1.0), "device: unknown fields \\['memory_bandwith'\\]"),
        (lambda d: d["device"].update(kind="tpu"), "device.kind: must be one of \\['cpu', 'cuda'\\]"),
        (lambda d: d["device"].update(queues_kernels=1), "device.queues_kernels: must be true or false"),
        (lambda d: d["network"]["intra"].update(bandwidth=-1), "network.intra.bandwidth: must be a number > 0 or null"),
        (lambda d: d["network"]["inter"].update(large_from=1024), "network.inter.large: missing"),
        (lambda d: d["network"].update(kinds={"broadcast": {"latency": 0, "bandwidth": 1}}), "network.kinds: unknown collective kinds"),
        (lambda d: d["network"].update(ranks_per_node=0), "network.ranks_per_node: must be an integer >= 1"),
        (lambda d: d.update(version=2), "version: must be 1"),
        (lambda d: d.update(device=None), "device: must be an object, got null"),
    ],
)
def test_load_names_the_file_and_the_bad_field(tmp_path, edit, message):
    path = _edited(tmp_path, edit)
    with pytest.raises(ValueError, match=f"profile {path}: {message}"):
        profiles.load(path)


def test_missing_fixed_costs_are_the_h100_estimates_on_cuda_and_none_on_a_cpu(tmp_path):
    def without_fixed_costs(data):
        for name in FIXED_COSTS:
            del data["device"][name]

    device, _ = profiles.load(_edited(tmp_path, without_fixed_costs))
    assert device == DEVICES["h100"]
    device, _ = profiles.load(_edited(tmp_path, lambda d: (without_fixed_costs(d), d["device"].update(kind="cpu"))))
    assert all(getattr(device, name) == 0.0 for name in FIXED_COSTS)
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(ValueError, match="text.json: not JSON"):
        profiles.load(tmp_path / "text.json")


def test_the_command_line_refuses_sizes_it_cannot_fit(tmp_path):
    for argv in (["--max-bytes", "4096"], ["--max-size", "16"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            calibrate.main(["--out", str(tmp_path / "p.json"), *argv])
