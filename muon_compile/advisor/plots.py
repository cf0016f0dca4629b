"""Plots of the advisor's predictions for the docs.

    python -m muon_compile.advisor.plots [--out docs] [--device h100] [--network nvlink-ib]
        [--tokens 4194304] [--mfu 0.4]

Needs matplotlib (``pip install matplotlib``). Writes two PNGs into ``--out``:

* ``advisor_step_time.png``: per model, the predicted optimizer step against the world
  size (8 to 1,024) for each strategy, over FSDP (the whole world one shard group) and
  over HSDP with shard groups of 8 (one node), each point at its best bucket size and
  prefetch depth among the advisor's defaults whose buffers fit in its default share of
  the device's memory;
* ``advisor_overhead_share.png``: per model and world size, the recommended
  configuration's step as a share of a training step of ``--tokens`` tokens at ``--mfu``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..config import Strategy
from . import recommend as advisor
from ..models import MODELS
from .network_profiles import PROFILES as NETWORKS
from .step_cost import DEVICES

WORLDS = [8, 16, 32, 64, 128, 256, 512, 1024]
SHARE_WORLDS = [8, 64, 1024]


def _step(rows: list, limit: float) -> float:
    """The step of the fastest configuration in ``rows`` whose buffers fit in ``limit``, in
    seconds; NaN, drawn as no point, where none fits."""
    chosen = advisor.best(rows, limit)
    return chosen.cost.step if chosen else math.nan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m muon_compile.advisor.plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs", help="the folder the PNGs are written to (default %(default)s)")
    parser.add_argument("--device", default="h100", choices=sorted(DEVICES))
    parser.add_argument("--network", default="nvlink-ib", choices=sorted(NETWORKS))
    parser.add_argument("--tokens", type=int, default=4 * 2**20)
    parser.add_argument("--mfu", type=float, default=0.4)
    args = parser.parse_args(argv)
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        raise SystemExit("python -m muon_compile.advisor.plots needs matplotlib: pip install matplotlib") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    device, network = DEVICES[args.device], NETWORKS[args.network]
    limit = advisor.memory_limit(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    shares: dict[str, list[float]] = {}
    for ax, (name, shapes) in zip(axes.flat, MODELS.items()):
        lines: dict[str, list[float]] = {}
        for world in WORLDS:
            rows = advisor.sweep(
                list(shapes.matrices), world, device, network, advisor.BUCKET_MBS, advisor.PREFETCHES, advisor.SHARDS
            )
            for strategy in Strategy:
                for shard, layout in ((world, "FSDP"), (8, "HSDP x8")):
                    picked = [r for r in rows if r.strategy is strategy and r.shard == shard]
                    lines.setdefault(f"{strategy.value}, {layout}", []).append(_step(picked, limit) * 1e3)
            if world in SHARE_WORLDS:
                step = _step(rows, limit)
                train = advisor.training_seconds(shapes, args.tokens, world, device, args.mfu)
                shares.setdefault(name, []).append(100 * step / (step + train))
        for label, ms in lines.items():
            ax.plot(WORLDS, ms, marker="o", label=label, linestyle="--" if "HSDP" in label else "-")
        ax.set_title(f"{name} ({len(shapes.matrices)} matrices, {shapes.muon_params / 1e9:.1f}B)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("world size (GPUs)")
        ax.set_ylabel("predicted Muon step (ms)")
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"Predicted optimizer step, {device.name} / {network.name} (published figures; best bucket and prefetch)")
    fig.tight_layout()
    fig.savefig(out / "advisor_step_time.png", dpi=110)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(SHARE_WORLDS)
    names = list(shares)
    for i, world in enumerate(SHARE_WORLDS):
        xs = [j + (i - (len(SHARE_WORLDS) - 1) / 2) * width for j in range(len(names))]
        values = [shares[n][i] for n in names]
        bars = ax.bar(xs, values, width, label=f"{world} GPUs")
        ax.bar_label(bars, labels=["none fits" if math.isnan(v) else f"{v:.1f}" for v in values], fontsize=7)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("Muon step, % of a training step")
    ax.set_yscale("log")
    ax.set_title(f"Muon's share of a step of {args.tokens / 2**20:g}M tokens at {args.mfu:.0%} MFU (recommended configuration)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "advisor_overhead_share.png", dpi=110)
    print(f"wrote {out / 'advisor_step_time.png'} and {out / 'advisor_overhead_share.png'}")
    for name in names:
        print(f"{name}: " + ", ".join(f"{w} GPUs " + ("none fits" if math.isnan(s) else f"{s:.2f}%") for w, s in zip(SHARE_WORLDS, shares[name])))


if __name__ == "__main__":
    main()
