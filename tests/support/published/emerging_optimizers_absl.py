"""Corpus entry ``emerging_optimizers_absl`` (issue 61): the Muon of NVIDIA-NeMo/
Emerging-Optimizers as released, keeping each absl logging call at the place the source has it.

Read: NVIDIA-NeMo/Emerging-Optimizers@fd7729267109a8848709e9406bf19e53e970c3f4 (as released in 0.3.0 but
for the SYRK choice's log and the float64 norm)
  emerging_optimizers/orthogonalized_optimizers/orthogonalized_optimizer.py:164-212 (step), 214-240 (orthogonalisation)
  emerging_optimizers/orthogonalized_optimizers/muon.py:117-132 (scaled orthogonalisation), 190-216 (scale factor)
  emerging_optimizers/orthogonalized_optimizers/muon_utils.py:30-90 (coefficient tables), 93-129 (triple iterator),
      149-274 (the NS routine), 348-411 (per-iteration helpers for 2-D and 3-D)
  emerging_optimizers/mixin.py (decoupled decay), emerging_optimizers/utils/__init__.py:29-40
      (context manager for fp32 matmul precision)
"""

import contextlib
import itertools

import torch

from muon_corpus import LR, MOMENTUM, WD, Entry, _momentum

from absl import logging  # noqa: E402  (absl-py: a test dependency, as Emerging-Optimizers requires it)


# ------------------------------------------------------------------ NS pieces (from muon_utils)

_TABLES = {
    "simple": [(3.4445, -4.7750, 2.0315)],
    "quintic": [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ],
    "polar_express": [
        (8.2051, -22.9019, 16.4607),
        (4.0664, -2.8612, 0.5184),
        (3.9096, -2.8234, 0.5250),
        (3.2856, -2.4153, 0.4853),
        (2.2779, -1.6198, 0.3985),
        (1.8726, -1.2307, 0.3585),
        (1.8564, -1.2132, 0.3568),
        (1.8750, -1.2500, 0.3750),
    ],
    "cans": [
        (8.4703, -25.1081, 18.6293),
        (4.1828, -3.1087, 0.5806),
        (3.9619, -2.9541, 0.5630),
        (3.2866, -2.4647, 0.5074),
        (2.2737, -1.6447, 0.4162),
    ],
    "aol": [
        (4.0098, -7.0585, 2.4635),
        (3.4585, -5.5479, 2.5959),
        (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169),
    ],
    "deepseekv4": [(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2,
    "cubic5": [
        (3.3656576, -3.3420992, 0.0),
        (2.5744352, -1.4957376, 0.0),
        (2.5368962, -1.4312570, 0.0),
        (2.4418906, -1.2764040, 0.0),
        (2.2230472, -0.9630650, 0.0),
    ],
}


def _triples(n, table, how="cycle"):
    """Yield ``n`` triples from ``table``: round-robin, or the final row held once exhausted."""
    logging.debug("triples: %s iterations, how=%s", n, how)
    logging.debug("table rows: %s", table)
    if not table:
        raise ValueError("empty coefficient table")
    if how == "cycle":
        rows = itertools.cycle(table)
    elif how == "repeat_last":
        rows = itertools.chain(table, itertools.repeat(table[-1]))
    else:
        raise ValueError(f"bad iteration mode {how}")
    return itertools.islice(rows, n)


def _iter2d(X, a, b, c):
    """One iteration for a matrix; with ``c`` zero it is cubic and needs only one ``addmm``."""
    A = X @ X.mT
    if c != 0.0:
        B = torch.addmm(A, A, A, alpha=c, beta=b)
        X = torch.addmm(X, B, X, alpha=1.0, beta=a)
    else:
        X = torch.addmm(X, A, X, alpha=b, beta=a)
    return X


def _iter3d(X, a, b, c):
    """The matrix iteration again, for a stack, with ``baddbmm``."""
    A = X @ X.mT
    if c != 0.0:
        B = torch.baddbmm(A, A, A, alpha=c, beta=b)
        X = torch.baddbmm(X, B, X, alpha=1.0, beta=a)
    else:
        X = torch.baddbmm(X, A, X, alpha=b, beta=a)
    return X


def _ns(x, n, table="quintic", eps=1e-15, flip=None, use_syrk=False, dtype=torch.float32):
    """The released NS routine for a single rank (no tensor-parallel group, no float64 norm).
    Input has to arrive in fp32 (``dtype``: fp32, fp64 in the exact evaluation). Order kept:
    flip to wide, then ``F.normalize``; triple iterator made (and logging) ahead of the loop;
    iteration helper picked by ndim; under "medium" fp32 matmul precision (the optimizer's
    default) the SYRK choice, which logs ``log_first_n(ERROR, ..., 8, shape)`` for a shape not
    16-byte aligned, then a bf16 cast plus ``log_first_n(INFO, ..., 1)``; cast back after the
    loop. The SYRK step itself (a Triton kernel) is not reproduced: an aligned shape with
    ``use_syrk`` raises."""
    if x.ndim < 2 or x.ndim > 3:
        raise TypeError(f"need 2 or 3 dims, got {x.ndim}")
    if x.dtype != dtype:
        raise TypeError(f"need dtype {dtype}, got {x.dtype}")
    if flip is None:
        flip = x.size(-2) > x.size(-1)
    if flip:
        x = x.mT
    X = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=eps)
    if table in _TABLES:
        rows = _TABLES[table]
    else:
        raise ValueError(f"no table called {table}")
    if table == "cubic5" and n != len(rows):
        raise ValueError("cubic5 must run as many iterations as it has rows")
    how = "repeat_last" if table in ("polar_express", "cans", "deepseekv4") else "cycle"
    coeffs = _triples(n, rows, how=how)
    one_iter = _iter2d if X.ndim == 2 else _iter3d
    if torch.get_float32_matmul_precision() == "medium":
        if use_syrk:
            if X.size(-1) % 8 != 0 or X.size(-2) % 8 != 0:
                logging.log_first_n(
                    logging.ERROR,
                    "[SYRK-SKIP] skipping SYRK for shape %s because GEMM M or N is not 16-byte "
                    "aligned, which is incompatible with TMA.",
                    8,
                    tuple(X.shape),
                )
            else:
                raise NotImplementedError("the Triton SYRK step is not reproduced")
        X = X.to(torch.bfloat16)
        logging.log_first_n(logging.INFO, "Using BF16 I/O kernels for Newton-Schulz iteration.", 1)
    for a, b, c in coeffs:
        X = one_iter(X, a, b, c)
    X = X.to(dtype)
    if flip:
        X = X.mT
    return X


def _scale(rows, cols, how="spectral"):
    if how == "shape_scaling":
        return max(1, rows / cols) ** 0.5
    elif how == "spectral":
        return max(rows, cols) ** 0.5
    elif how == "unit_rms_norm":
        return (rows / cols) ** 0.5
    raise ValueError(f"bad scale mode {how}")


@contextlib.contextmanager
def _precision(level="highest"):
    """As upstream: switch fp32 matmul precision for the block, put the old value back after."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(level)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


# ------------------------------------------------------------------------------- the step

def emerging_optimizers_absl(params, dtype, *, lookahead=False, precision="medium",
                             table="quintic", iters=5, scaling="spectral",
                             extra=1.0, use_syrk=False):
    """The library's generic orthogonalised-optimizer step driving its Muon orthogonaliser,
    as released: decay first, as ``p.add_(p, alpha=-wd*lr)``; momentum EMA via ``lerp_``;
    Nesterov off by default (the buffer itself is orthogonalised), and when on an
    out-of-place ``lerp``; fp32 matmul precision switched around the orthogonalisation;
    absl ``logging.debug`` once in the orthogonaliser before the NS call and twice in the
    triple iterator (all ahead of the loop; today's source logs nothing inside it); the
    quintic table, one helper call per iteration on Python floats; the fp32 result scaled by
    ``sqrt(max(m, n))`` and by ``extra``; finally ``p.add_(update, alpha=-lr)``.

    ``precision`` defaults to "medium", as upstream's ``fp32_matmul_prec``: set inside the step
    around the orthogonalisation, read by the NS routine, which then moves the iterate to bf16
    (the entry's dtype) and logs. ``dtype`` says only whether this is the exact evaluation:
    fp32 where upstream spells it (the input check and the final cast), fp64 in the exact one
    (whose bf16 cast the corpus makes fp64, ``numerics.exact_step``).

    Omitted: param groups, closures, lazily created state (``_momentum`` from the corpus is
    used), other decay variants, weight-update hooks and empty pre/post-update calls, tensor
    parallel NS, the Triton SYRK step (``use_syrk``, off by default; its choice and log are
    kept), the float64 norm (off by default),
    the "custom" table and the orthogonaliser's 2-D assertion.
    """
    bufs = _momentum(params)
    fp32 = torch.float64 if dtype is torch.float64 else torch.float32

    def orthogonalise(g):
        logging.debug(
            "orthogonalise: iters=%s table=%s scaling=%s extra=%s",
            iters, table, scaling, extra,
        )
        o = _ns(g.to(fp32), n=iters, table=table, use_syrk=use_syrk,
                dtype=fp32)
        s = _scale(g.size(-2), g.size(-1), how=scaling)
        return o * s * extra

    def step():
        for p, buf in zip(params, bufs):
            if p.grad is None:
                continue
            g = p.grad
            if WD != 0.0:
                p.add_(p, alpha=(-WD * LR))
            buf.lerp_(g, 1 - MOMENTUM)
            if lookahead:
                g = g.lerp(buf, MOMENTUM)
            else:
                g = buf
            with _precision(precision):
                u = orthogonalise(g)
            p.add_(u, alpha=-LR)

    return step


ENTRY = Entry(
    "emerging_optimizers_absl",
    "NVIDIA-NeMo/Emerging-Optimizers orthogonalized_optimizer.py + muon.py + muon_utils.py "
    "(the Muon Megatron-LM uses, with absl logging)",
    "distributed library",
    emerging_optimizers_absl,
    torch.bfloat16,  # fp32_matmul_prec="medium"
    logs_in_loop=True,  # absl's debug calls before the loop, log_first_n after the bf16 cast
)
