"""Do symmetric products pay on this device? ``X X^T`` computed whole against block-triangular.

    python scripts/bench_symmetric_products.py [--reps 9]

``X X^T`` (and the other symmetric products of Newton–Schulz: ``A A``, ``Z R``, ``Z Q``)
needs only one triangle. Without a symmetric GEMM kernel (``torch.bmm`` has none), a
triangle is computed as ``k`` block rows, block row ``i`` being ``X_i X_{0..i}^T``
(``(k + 1) / 2k`` of the FLOPs), and the strict upper triangle is mirrored. For bf16
batches of the benchmarks' shapes this prints the median time of the whole product and of
the block-triangular one for ``k = 2, 4``, with the FLOP share of each; docs/design.md
quotes the result.
"""

import argparse
import statistics
import time

import torch

SHAPES = ((12, 384, 1536), (6, 384, 384), (1, 2048, 5632), (1, 2048, 2048), (96, 128, 256))


def median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def whole(x: torch.Tensor) -> torch.Tensor:
    return torch.bmm(x, x.mT)


def block_triangular(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x x^T`` from its ``k`` lower block rows, the upper triangle mirrored."""
    m = x.size(1)
    size = m // k
    out = x.new_empty(x.size(0), m, m)
    for i in range(k):
        rows = slice(i * size, (i + 1) * size)
        out[:, rows, : (i + 1) * size] = torch.bmm(x[:, rows], x[:, : (i + 1) * size].mT)
    for i in range(k):
        for j in range(i + 1, k):
            out[:, i * size : (i + 1) * size, j * size : (j + 1) * size] = out[:, j * size : (j + 1) * size, i * size : (i + 1) * size].mT
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, bf16, median of {args.reps}")
    for batch, m, n in SHAPES:
        x = torch.randn(batch, m, n).bfloat16()
        reference = whole(x)
        base = median_s(lambda: whole(x), args.reps)
        cells = [f"{batch}x{m}x{n}: whole {base * 1e3:.2f} ms"]
        for k in (2, 4):
            assert torch.equal(block_triangular(x, k).tril(), reference.tril())
            t = median_s(lambda: block_triangular(x, k), args.reps)
            cells.append(f"k={k} {t * 1e3:.2f} ms ({t / base:.2f}x the time, {(k + 1) / (2 * k):.2f}x the FLOPs)")
        print("; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
