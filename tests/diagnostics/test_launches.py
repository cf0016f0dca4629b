"""muon_compile.diagnostics.launches on wrapper code as Inductor writes it: a CUDA module (Triton
launches and templates, cuBLAS products, a collective), read without a GPU; the CPU form is
read off real generated code in test_passes.py."""

from muon_compile.diagnostics.launches import count_launches

CUDA_WRAPPER = '''
class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def call(self, args):
        arg0_1, arg1_1 = args
        with torch.cuda._DeviceGuard(0):
            stream0 = get_raw_stream(0)
            buf0 = torch.ops.muon_compile.stack.default([arg0_1, arg1_1])
            triton_red_fused_add_mul_0.run(buf0, buf1, 2, 384, stream=stream0)
            extern_kernels.bmm(buf1, reinterpret_tensor(buf1, (2, 48, 16), (768, 1, 48), 0), out=buf2)
            extern_kernels.baddbmm(buf2, buf2, buf2, alpha=2.0315, beta=-4.775, out=buf3)
            triton_tem_fused_baddbmm_1.run(buf1, buf3, buf4, stream=stream0)
            buf5 = torch.ops._c10d_functional.all_to_all_single.default(buf4, [1, 1], [1, 1], '0')
            torch.ops._c10d_functional.wait_tensor.default(buf5)
            triton_poi_fused_copy__2.run(buf5, arg0_1, 768, stream=stream0)
        return ()

    def recursively_apply_fns(self, fns):
        triton_poi_fused_never_called_3.run(fns)
'''


def test_counts_each_kind_inside_call_only():
    launches = count_launches(CUDA_WRAPPER)
    assert (launches.products, launches.kernels, launches.ops) == (3, 2, 3)
    assert dict(launches.op_names) == {
        "_c10d_functional.all_to_all_single": 1, "_c10d_functional.wait_tensor": 1, "muon_compile.stack": 1,
    }
    assert launches.total == 8
    assert launches.describe().startswith("3 products, 2 kernels, 3 op calls (")


def test_several_modules_add_up_and_no_call_counts_nothing():
    assert count_launches([CUDA_WRAPPER, CUDA_WRAPPER]).total == 16
    assert count_launches("def other():\n    extern_kernels.bmm(a, b, out=c)\n").total == 0
