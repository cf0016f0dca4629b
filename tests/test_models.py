"""The one registry of models (muon_compile/models.py): the benchmarks, the GPU check and the
advisor name its models, each model once with its own shapes."""

import re
import sys

import pytest

from muon_compile import models
from muon_compile.advisor import recommend

from script_runs import ROOT, SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import bench_distributed  # noqa: E402
import bench_single_device  # noqa: E402
import bench_write  # noqa: E402


def test_llama_3_2_1b_has_grouped_key_value_heads_and_the_dense_1b_does_not():
    """The two 1B decoders the project measures are two names (issue 78: "llama-1b" was both)."""
    llama, dense = models.model("llama-1b"), models.model("dense-1b")
    assert llama.matrices[:7] == ((2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048), (2048, 8192))
    assert dense.matrices[:7] == ((2048, 2048),) * 4 + ((5632, 2048), (5632, 2048), (2048, 5632))
    assert models.model("dense-1b-2l").matrices == dense.matrices[:14]
    assert models.model("llama-8b-4l").matrices == models.model("llama-8b").matrices[:28]


def test_every_reader_names_models_of_the_registry_with_their_shapes():
    for name, workload in bench_single_device.WORKLOADS.items():
        assert workload.shapes == models.model(name).matrices and workload.large == models.model(name).large
    for name, shapes in bench_distributed.WORKLOADS.items():
        assert tuple(shapes) == models.model(name).matrices
    stacks = [tuple(int(x) for x in s.split("x")) for s in bench_write.STACKS.split(",")]
    assert stacks == models.stacks("llama-1b") + models.stacks("llama-8b-4l")
    gpu_check = (ROOT / "scripts" / "gpu_check.sh").read_text()
    named = {w for line in re.findall(r"--workload ([\w,.-]+)", gpu_check) for w in line.split(",")}
    assert named and named <= {*bench_single_device.WORKLOADS, "all"}, named
    assert set(recommend.MODELS) == set(models.MODELS)


def test_stacks_count_each_shape_in_order_of_first_appearance():
    assert models.stacks("gpt-small") == [(6, 1152, 384), (6, 384, 384), (6, 1536, 384), (6, 384, 1536)]
    with pytest.raises(ValueError, match="unknown model 'llama-1b-2l'; known:"):
        models.model("llama-1b-2l")
