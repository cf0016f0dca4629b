"""Newton–Schulz coefficient presets: one named table, resolved to plain tuples.

A quintic Newton–Schulz iteration applies ``X <- a X + b (X X^T) X + c (X X^T)^2 X``.
A coefficient *schedule* is a tuple of ``(a, b, c)`` triples; iteration ``i`` uses
triple ``min(i, len - 1)``, so the last triple repeats when there are more steps than
triples. The input is first divided by ``||X||_F * norm_scale + eps``.

Presets:

* ``"keller"`` — Keller Jordan's quintic ``(3.4445, -4.7750, 2.0315)`` repeated,
  ``norm_scale = 1``.
* ``"polar_express"`` — the per-iteration minimax polynomials of Polar Express
  (Amsel, Persson, Musco, Gower, arXiv:2505.16932, Algorithm 1): each triple but the
  last divided by the safety factor ``(1.01, 1.01**3, 1.01**5)`` and the Frobenius norm
  multiplied by ``1.01``.

and the other published sets that Megatron's ``coefficient_type`` offers (its
``emerging_optimizers`` Newton–Schulz), under the same names:

* ``"simple"`` — Keller Jordan's triple, as ``"keller"``;
* ``"quintic"`` — five per-iteration triples tuned for a quintic iteration (You Jiacheng /
  Franz Cesista, as used in modded-nanogpt's medium track), cycled: step ``i`` uses
  triple ``i mod 5``;
* ``"aol"`` — four triples from Thibaut Boissin's flash-newton-schulz (Turbo-Muon), cycled.

A schedule is *cycled* (``Preset.cycle``) or repeats its last triple;
:func:`ns_args` expands it to one triple per iteration, the form :class:`NSArgs` holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from .args import AUTO, NSArgs, Triple, as_triple, check_steps, repeat_last


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named coefficient schedule with its normalisation."""

    name: str
    coefficients: tuple[Triple, ...]
    norm_scale: float = 1.0
    eps: float = 1e-7
    cycle: bool = False

    def schedule(self, steps: int) -> tuple[Triple, ...]:
        """The triple of each of ``steps`` iterations (cycled, or the last one repeating)."""
        if not self.cycle:
            return repeat_last(self.coefficients, steps)
        return tuple(self.coefficients[i % len(self.coefficients)] for i in range(steps))


def _with_safety(raw: Sequence[Triple], safety: float) -> tuple[Triple, ...]:
    """Divide every triple but the last by ``(s, s**3, s**5)`` (Polar Express §4.4)."""
    damped = tuple((a / safety, b / safety**3, c / safety**5) for a, b, c in raw[:-1])
    return damped + (tuple(raw[-1]),)


_POLAR_EXPRESS_RAW: tuple[Triple, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
_POLAR_EXPRESS_SAFETY = 1.01
_KELLER: tuple[Triple, ...] = ((3.4445, -4.7750, 2.0315),)
_QUINTIC: tuple[Triple, ...] = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)
_AOL: tuple[Triple, ...] = (
    (4.0098, -7.0585, 2.4635),
    (3.4585, -5.5479, 2.5959),
    (2.7573, -3.2939, 1.4254),
    (2.7215, -3.0494, 1.3169),
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("keller", _KELLER),
        Preset("simple", _KELLER),
        Preset("quintic", _QUINTIC, cycle=True),
        Preset("aol", _AOL, cycle=True),
        Preset(
            "polar_express",
            _with_safety(_POLAR_EXPRESS_RAW, _POLAR_EXPRESS_SAFETY),
            norm_scale=_POLAR_EXPRESS_SAFETY,
        ),
    )
}

CoefficientSpec = str | Sequence[float] | Sequence[Sequence[float]]


def resolve(spec: CoefficientSpec) -> Preset:
    """Turn a preset name, one ``(a, b, c)`` triple, or a list of triples into a :class:`Preset`.

    Raises ``ValueError`` naming the offending value for an unknown name or a malformed
    triple. A user triple or list gets ``norm_scale=1`` and ``eps=1e-7``.
    """
    if isinstance(spec, str):
        try:
            return PRESETS[spec]
        except KeyError:
            raise ValueError(
                f"unknown Newton-Schulz coefficient preset {spec!r}; known: {sorted(PRESETS)}"
            ) from None
    if not isinstance(spec, Sequence) or len(spec) == 0:
        raise ValueError(f"ns_coefficients must be a preset name, a triple or a list of triples, got {spec!r}")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in spec):
        return Preset("custom", (as_triple(spec, "ns_coefficients"),))
    triples = tuple(as_triple(t, f"ns_coefficients[{i}]") for i, t in enumerate(spec))
    return Preset("custom", triples)


def ns_args(
    spec: CoefficientSpec,
    steps: int,
    *,
    eps: float | None = None,
    compute_dtype: torch.dtype = torch.bfloat16,
    clamp_eps: bool = False,
    algorithm: str = AUTO,
) -> NSArgs:
    """The :class:`NSArgs` of ``steps`` iterations of ``spec`` (a preset name, a triple or a
    list of triples), with the preset's norm scale and, unless given, its eps."""
    preset = resolve(spec)
    return NSArgs(
        preset.schedule(check_steps(steps)),
        eps=preset.eps if eps is None else eps,
        norm_scale=preset.norm_scale,
        clamp_eps=clamp_eps,
        compute_dtype=compute_dtype,
        algorithm=algorithm,
    )
