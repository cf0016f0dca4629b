"""Golden graphs of the single-device pipeline (see golden_graphs/README.md)."""

import muon_compile

from golden import assert_golden
from helpers import compile_with_dump, count_ns_calls, muon

# Per layer: qkv (3d x d), attention out (d x d), MLP up (4d x d), MLP down (d x 4d); d=16, 2 layers.
GPT_SHAPES = [(48, 16), (16, 16), (64, 16), (16, 64)] * 2


def test_gpt_single_device(tmp_path):
    graphs, _ = compile_with_dump(muon(), GPT_SHAPES, tmp_path)
    assert_golden("single_device_gpt.before.txt", graphs["bucket_before"])
    assert_golden("single_device_gpt.bucketed.txt", graphs["bucket_after"])
    assert_golden("single_device_gpt.lowered.txt", graphs["lower_after"])
    assert count_ns_calls(graphs["bucket_after"]) == 3  # 16x48 (qkv), 16x16, 16x64 (up and down)


def test_padding_merge(tmp_path):
    # 16x40 and the tall 40x16 pad into the 16x48 bucket (14% of its NS FLOPs wasted)
    graphs, _ = compile_with_dump(muon(), [(16, 48), (16, 40), (40, 16)], tmp_path, pad_waste=0.2)
    assert_golden("single_device_padded.bucketed.txt", graphs["bucket_after"])
    assert muon_compile.counters["bucket.padded_buckets"] == 1


def test_torch_optim_muon_single_device(tmp_path):
    """Unmodified torch.optim.Muon: canonicalize turns each 5-step addmm loop into the op,
    and the step is then bucketed exactly like muon_compile.Muon's."""
    import torch

    graphs, _ = compile_with_dump(lambda params: torch.optim.Muon(params, lr=0.02), GPT_SHAPES, tmp_path)
    assert_golden("torch_muon_gpt.canonical.txt", graphs["canonicalize_after"])
    assert_golden("torch_muon_gpt.lowered.txt", graphs["lower_after"])
    assert muon_compile.counters["canonicalize.matched"] == len(GPT_SHAPES)
    assert count_ns_calls(graphs["bucket_after"]) == 3  # the same three buckets as muon_compile.Muon
