"""The bucket pass on its own (muon_compile/passes/bucket/): the plan from NS sites as plain data
(orientation, dtype and argument groups, the size cap, padding within its waste bound, batched
and skipped sites), and the stacking it applies, against the members it stacks."""

import dataclasses

import torch

from muon_compile.ns.args import NSArgs
from muon_compile.passes.bucket.apply import stack_members, unstack_members
from muon_compile.passes.bucket.plan import plan_buckets

from helpers import keller_args, ns_site

ARGS = keller_args()
site = ns_site


def shapes_of(plan):
    return [(b.rows, b.cols, [m.site for m in b.members]) for b in plan.buckets]


def test_tall_and_wide_share_a_bucket_in_canonical_orientation():
    """Where the device keeps tall matrices transposed (CUDA: no measured table), a tall one
    joins the wide ones as its transpose."""
    sites = [site(0, 48, 16, device="cuda"), site(1, 16, 16, device="cuda"), site(2, 16, 48, device="cuda")]
    plan = plan_buckets(sites, bucket_mb=64, pad_waste=0)
    assert shapes_of(plan) == [(16, 48, [0, 2]), (16, 16, [1])]
    assert [m.transpose for m in plan.buckets[0].members] == [True, False]
    assert not plan.buckets[0].padded and plan.buckets[0].rewrites and not plan.buckets[1].rewrites
    assert shapes_of(plan_buckets(sites, bucket_mb=64, pad_waste=0, orientation="on")) == [(48, 16, [0]), (16, 16, [1]), (16, 48, [2])]


def test_tall_matrices_keep_their_layout_where_the_device_measured_it_faster():
    """On this CPU the textbook iteration of a tall matrix is faster in its own layout
    (matmul_rates' ``orientation`` table, ns.cost.choose_orientation): tall sites bucket as
    they are, apart from wide ones; the Gram iteration, and ``MUON_COMPILE_NS_ORIENTATION=off``,
    transpose them."""
    plan = plan_buckets([site(0, 48, 16), site(1, 16, 16), site(2, 16, 48), site(3, 48, 16)], bucket_mb=64, pad_waste=0)
    assert shapes_of(plan) == [(48, 16, [0, 3]), (16, 16, [1]), (16, 48, [2])]
    assert not any(m.transpose for b in plan.buckets for m in b.members)
    gram = dataclasses.replace(ARGS, algorithm="gram")
    assert shapes_of(plan_buckets([site(0, 48, 16, args=gram), site(1, 16, 48, args=gram)], bucket_mb=64, pad_waste=0)) == [(16, 48, [0, 1])]
    off = plan_buckets([site(0, 48, 16), site(1, 16, 48)], bucket_mb=64, pad_waste=0, orientation="off")
    assert shapes_of(off) == [(16, 48, [0, 1])]


def test_different_dtype_arguments_or_level_never_share():
    other_args = NSArgs.repeating([(3.0, -3.0, 1.0)], 5, compute_dtype=torch.bfloat16)
    sites = [
        site(0, 8, 8),
        site(1, 8, 8, dtype=torch.bfloat16),
        site(2, 8, 8, args=other_args),
        site(3, 8, 8, level=1),
        site(4, 8, 8),
    ]
    plan = plan_buckets(sites, bucket_mb=64, pad_waste=0)
    assert shapes_of(plan) == [(8, 8, [0, 4]), (8, 8, [1]), (8, 8, [2]), (8, 8, [3])]


def test_size_cap_splits_buckets_in_graph_order():
    sites = [site(i, 16, 48) for i in range(5)]  # 1.5 KiB each in the bf16 compute dtype
    plan = plan_buckets(sites, bucket_mb=2 * 16 * 48 * 2 / 2**20, pad_waste=0)
    assert shapes_of(plan) == [(16, 48, [0, 1]), (16, 48, [2, 3]), (16, 48, [4])]
    big = plan_buckets([site(0, 64, 64), site(1, 64, 64)], bucket_mb=0.001, pad_waste=0)
    assert len(big.buckets) == 2  # a site above the cap still gets its own bucket


def test_padding_merges_near_shapes_within_the_waste_bound():
    sites = [site(0, 16, 48), site(1, 16, 40), site(2, 12, 48), site(3, 20, 30)]
    # NS FLOPs waste when padded to 16x48: 16x40 loses 14.3%, 12x48 loses 45.8%;
    # 20x30 has more rows than 16x48 and can never join it
    assert len(plan_buckets(sites, bucket_mb=64, pad_waste=0).buckets) == 4
    assert len(plan_buckets(sites, bucket_mb=64, pad_waste=0.14).buckets) == 4
    some = plan_buckets(sites, bucket_mb=64, pad_waste=0.2)
    assert shapes_of(some) == [(16, 48, [0, 1]), (12, 48, [2]), (20, 30, [3])]
    assert some.buckets[0].padded and not some.buckets[1].padded
    most = plan_buckets(sites, bucket_mb=64, pad_waste=0.5)
    assert shapes_of(most) == [(16, 48, [0, 1, 2]), (20, 30, [3])]


def test_batched_sites_count_their_matrices_and_skipped_sites_are_reported():
    plan = plan_buckets(
        [site(0, 8, 16, batch=4, device="cuda"), site(1, 16, 8, device="cuda"), site(2, 8, 16, skip="result is a graph output")],
        bucket_mb=64,
        pad_waste=0,
    )
    assert plan.buckets[0].matrices == 5
    assert plan.skipped == ((2, "result is a graph output"),)
    assert "site 2 not bucketed: result is a graph output" in plan.describe()


def test_stacking_is_exact_and_unstacking_gives_each_member_back():
    """Members of one padded bucket (a tall one transposed, a 3-D batch, a smaller one
    zero-padded) stacked in the compute dtype and cut back to their shapes and dtypes."""
    args = keller_args(torch.float64)
    plan = plan_buckets(
        [site(0, 16, 48, args=args), site(1, 48, 16, args=args), site(2, 16, 40, args=args), site(3, 16, 48, batch=2, args=args)],
        bucket_mb=64,
        pad_waste=0.2,
    )
    (bucket,) = plan.buckets
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(shape, generator=g) for shape in [(16, 48), (48, 16), (16, 40), (2, 16, 48)]]
    stacked = stack_members(xs, bucket)
    assert stacked.shape == (5, 16, 48) and stacked.dtype == torch.float64
    assert torch.equal(stacked[1], xs[1].mT.double()) and torch.equal(stacked[2, :, 40:], torch.zeros(16, 8, dtype=torch.float64))
    back = unstack_members(stacked, bucket, xs)
    assert [(b.shape, b.dtype) for b in back] == [(x.shape, x.dtype) for x in xs]
    assert all(torch.equal(b, x) for b, x in zip(back, xs))
