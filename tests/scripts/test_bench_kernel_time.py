"""The time by kind of kernel that scripts/bench_single_device.py reports
(``bench_common.kernel_kind``, ``kernel_time``, ``outermost_known`` and the report's table):
kernel names as an H100/H200 profile shows them, classified here without a GPU, and a CPU
step's calls as its profile shows them; and its steps timed in turn (``--in-turn``)."""

import sys

import pytest

from script_runs import SCRIPTS

sys.path.insert(0, str(SCRIPTS))

import bench_common  # noqa: E402
import bench_single_device  # noqa: E402


@pytest.mark.parametrize(
    "name, kind",
    [
        ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT", "products"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "products"),
        ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8", "products"),
        ("triton_tem_fused_mm_0", "products"),
        ("_sym_bmm_kernel", "products"),
        ("triton_poi_fused__to_copy_add_lerp_mul_0", "generated"),
        ("triton_red_fused_linalg_vector_norm_1", "generated"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)"
         "::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>>",
         "writes"),
        ("_scale_add_kernel", "writes"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)"
         "::OpaqueType<4u>, unsigned int, 4, 64, 64>", "copies"),
        ("Memcpy HtoD (Pageable -> Device)", "copies"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)", "copies"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul>>",
         "copies"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collectives"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps>>", "other"),
        ("aten::bmm", "products"),
        ("aten::baddbmm", "products"),
        ("graph_0_cpp_fused_add_copy__mul_rsub_stack_unbind_4", "generated"),
        ("muon_compile::unstack_scale_add_", "writes"),
        ("aten::_foreach_add_", "writes"),
        ("muon_compile::stack", "copies"),
        ("aten::copy_", "copies"),
        ("gloo:all_to_all", "collectives"),
        ("aten::matmul", "other"),
        ("aten::bmm_backward", "other"),
        ("Torch-Compiled Region: 0/0", "other"),
    ],
)
def test_kernels_are_classified_by_name(name, kind):
    assert bench_common.kernel_kind(name) == kind


def test_kernel_time_sums_by_kind_and_names_the_costliest_besides_products():
    kernels = [("nvjet_a", 900.0), ("triton_poi_x", 300.0), ("triton_poi_x", 200.0), ("Memset (Device)", 10.0)]
    kernels += [(f"triton_red_{i}", float(i)) for i in range(1, 8)]
    by_kind, top = bench_common.kernel_time(kernels)
    assert set(by_kind) == set(bench_common.KERNEL_KINDS)
    assert by_kind["products"] == pytest.approx(0.9) and by_kind["generated"] == pytest.approx(0.528)
    assert by_kind["copies"] == pytest.approx(0.01) and by_kind["writes"] == 0.0
    assert [(name, calls) for name, _, calls in top] == [
        ("triton_poi_x", 2), ("Memset (Device)", 1), ("triton_red_7", 1), ("triton_red_6", 1), ("triton_red_5", 1)
    ]
    assert top[0][1] == pytest.approx(0.5)


def test_report_prints_the_gpu_time_table_only_for_profiled_arms():
    by_kind = dict.fromkeys(bench_common.KERNEL_KINDS, 0.0) | {"products": 60.0, "generated": 20.0}
    muon = bench_common.ArmResult("muon", "muon muon_compile.Muon (auto)", times_s=[0.086], kernel_ms=by_kind,
                                  top_kernels=(("triton_poi_fused_0", 5.0, 16),))
    eager = bench_common.ArmResult("eager-torch", "eager torch.optim.Muon", times_s=[0.1])
    lines = bench_single_device.kernel_time_lines([eager, muon], "cuda")
    assert lines[0].startswith("GPU ms of one profiled step by kind")
    header, rule, row = lines[1].splitlines()
    assert header.split() == ["arm", *bench_common.KERNEL_KINDS, "busy", "idle"]
    assert row.split()[-8:] == ["60.00", "20.00", "0.00", "0.00", "0.00", "0.00", "80.00", "6.00"]
    assert lines[2:] == ["muon muon_compile.Muon (auto): its costliest kernels besides the products:",
                         "     5.000 ms    16 calls  triton_poi_fused_0"]
    assert bench_single_device.kernel_time_lines([eager], "cuda") == []


def test_cpu_table_has_no_other_column_and_names_the_rest():
    by_kind = dict.fromkeys(bench_common.KERNEL_KINDS, 0.0) | {"products": 40.0, "generated": 30.0}
    muon = bench_common.ArmResult("muon", "muon muon_compile.Muon (auto)", times_s=[0.075], kernel_ms=by_kind)
    lines = bench_single_device.kernel_time_lines([muon], "cpu")
    assert lines[0].startswith("CPU ms of one profiled step by kind of call (rest:")
    header, rule, row = lines[1].splitlines()
    assert header.split() == ["arm", *(k for k in bench_common.KERNEL_KINDS if k != "other"), "busy", "rest"]
    assert row.split()[-7:] == ["40.00", "30.00", "0.00", "0.00", "0.00", "70.00", "5.00"]


def test_a_cpu_step_counts_its_outermost_calls_of_a_known_kind():
    """A compiled CPU step under the profiler (its C++ kernels named by
    ``cpp.enable_kernel_profile``): the products, the generated kernels, and the stacked write
    op once, not again for the ``foreach`` calls inside it."""
    import torch

    from muon_compile.optim import stacks

    a = torch.randn(2, 8, 8)
    dsts = [torch.randn(8, 8) for _ in range(2)]

    @torch.compile(backend="inductor")
    def pointwise(x):
        return (x * 2 + 1).sum()

    with bench_common.kernels_profiled(torch.device("cpu")):
        pointwise(a)
        with torch.profiler.profile() as prof:
            torch.bmm(a, a)
            pointwise(a)
            stacks.unstack_scale_add_(dsts, torch.tensor(0.5, dtype=torch.float64), a, torch.tensor(-1.0, dtype=torch.float64))
    names = [e.name for e in bench_common.outermost_known(prof.events())]
    assert names.count("aten::bmm") == 1 and names.count("muon_compile::unstack_scale_add_") == 1
    assert sum(bench_common.kernel_kind(n) == "generated" for n in names) == 1
    assert not any("foreach" in n for n in names), names


def test_steps_timed_in_turn_run_once_each_per_round():
    """``--in-turn``: after the warm-up rounds every step runs once per round, in the arms'
    order, and each gets one time per round."""
    calls = []
    steps = {key: (lambda key=key: calls.append(key)) for key in ("a", "b", "c")}
    times = bench_common.time_in_turn(steps, warmup=1, reps=2, clock=bench_common.Clock())
    assert calls == ["a", "b", "c"] * 3
    assert {key: len(t) for key, t in times.items()} == {"a": 2, "b": 2, "c": 2}
    assert bench_single_device.parse_args(["--in-turn", "--device", "cpu"]).in_turn
