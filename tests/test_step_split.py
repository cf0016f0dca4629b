"""scripts/step_split.py: a profiled step's wall time split into matmuls, generated
kernels, collectives and the rest, on the thread that ran it; and the cost model's
split of the same plan, per rank."""

import dataclasses
from types import SimpleNamespace

import pytest
import step_split
from test_step_cost import NET, _bucket, _device

from muon_compile.passes.plan_distributed import DistPlan


def _event(key, us, thread=1):
    return SimpleNamespace(key=key, self_cpu_time_total=us, thread=thread)


def test_split_divides_the_wall_time_of_the_thread_that_ran_the_steps():
    events = [
        _event("aten::bmm", 600), _event("aten::mm", 200), _event("graph_1_cpp_fused_add_0", 100),
        _event("c10d::alltoall_base_", 150), _event("_c10d_functional::wait_tensor", 250),
        _event("c10d::barrier", 900),  # between the steps, outside their wall time
        _event("TorchDynamo Cache Lookup", 80), _event("aten::empty", 20),
        _event("gloo:all_to_all", 700, thread=2), _event("aten::bmm", 500, thread=2),  # another thread
    ]
    parts = step_split.split(events, steps=2, wall=4e-3)
    assert parts == pytest.approx({
        "wall": 2e-3, "matmul": 400e-6, "kernels": 50e-6, "collectives": 200e-6, "rest": 2e-3 - 650e-6,
    })
    assert tuple(parts) == step_split.PARTS


def test_splits_by_label_take_each_labelled_range_as_a_step():
    def call(*children, name="aten::bmm", us=0, total=0):
        return SimpleNamespace(name=name, key=name, self_cpu_time_total=us, cpu_time_total=total, thread=1, cpu_children=list(children))

    a = [call(call(us=300), call(call(name="_c10d_functional::wait_tensor", us=100), name="Torch-Compiled Region", us=50),
              name="arm 0", total=1000) for _ in range(2)]
    b = call(call(us=700), name="arm 1", total=800)
    outside = call(name="aten::bmm", us=5000)  # a probe between the steps
    splits = step_split.splits_by_label([*a, b, outside], ["arm 0", "arm 1"])
    assert splits["arm 0"] == pytest.approx({"wall": 1e-3, "matmul": 300e-6, "kernels": 0, "collectives": 100e-6, "rest": 600e-6})
    assert splits["arm 1"] == pytest.approx({"wall": 800e-6, "matmul": 700e-6, "kernels": 0, "collectives": 0, "rest": 100e-6})


def test_predicted_split_adds_up_to_the_total_and_prices_each_ranks_fixed_costs():
    plan = DistPlan((_bucket(owners=(0, 0)),), (), {})  # rank 0 makes the one NS call
    device = dataclasses.replace(_device(False), step_overhead=1e-3, param_overhead=1e-4, call_overhead=1e-5, bucket_overhead=1e-6)
    ranks = step_split.predicted_split(plan, 1, device, NET)
    assert [tuple(r) for r in ranks] == [step_split.PREDICTED] * 2
    for r in ranks:
        assert r["NS"] + r["pointwise"] + r["fixed"] + r["exposed"] == pytest.approx(r["total"])
    # per step, two parameters, the bucket; rank 0's NS call besides
    assert [r["fixed"] for r in ranks] == pytest.approx([1e-3 + 2e-4 + 1e-5 + 1e-6, 1e-3 + 2e-4 + 1e-6])
    bare = step_split.predicted_split(plan, 1, device.without_fixed_costs(), NET)
    assert [r["pointwise"] for r in bare] == pytest.approx([r["pointwise"] for r in ranks])
    assert all(r["fixed"] == 0 for r in bare)
