"""The arguments of a Newton–Schulz evaluation, owned by one frozen type: :class:`NSArgs`.

The optimizers build one, ``canonicalize`` reads one off user code, the passes key their
buckets by it, and :mod:`muon_compile.ns.evaluate` runs it. It alone converts to and from the flat argument
list of the custom ops' schema (:data:`NSArgs.SCHEMA`, after the tensor arguments)::

    float[] coefficients, int steps, float eps, float norm_scale, bool clamp_eps,
    ScalarType compute_dtype, str algorithm, int[]? restarts=None, bool normalize=True

In the type, ``coefficients`` holds one ``(a, b, c)`` triple per iteration, so two
evaluations of the same function compare equal whatever schedule spelling produced
them. In the flat form the trailing repeats of the last triple are dropped (the op
repeats the last triple), so Keller's five identical steps read ``[a, b, c], 5``, and
the trailing arguments that hold the schema's defaults (``restarts`` None, ``normalize``
True) are left out.

Adding a field means adding it here, to :data:`NSArgs.SCHEMA`, :meth:`NSArgs.to_op` and
:meth:`NSArgs.from_op`, and to this module's tests; the ops, their evaluation and the passes
receive it inside the type (``algorithm`` was added so).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import ClassVar

import torch

from ..modes import Mode

Triple = tuple[float, float, float]

COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)

class Algorithm(Mode):
    """How the iteration is evaluated (:mod:`muon_compile.ns.evaluate`); ``auto`` leaves the
    choice to :func:`muon_compile.ns.cost.choose`, per matrix shape, dtype and device."""

    AUTO = "auto"
    TEXTBOOK = "textbook"
    GRAM = "gram"


AUTO, TEXTBOOK, GRAM = (a.value for a in Algorithm)  # as the ops and plans hold them: plain strings


def check_algorithm(value: object, where: str = "newton_schulz algorithm") -> str:
    """``value`` as the plain name of an :class:`Algorithm`, else ``ValueError`` naming ``where``."""
    return Algorithm.check(value, where)


def as_triple(value: object, where: str | int) -> Triple:
    """``value`` as a triple of finite floats, or ``ValueError`` naming ``where`` (an int
    ``i`` reads ``newton_schulz coefficients[i]``)."""
    if isinstance(value, tuple) and len(value) == 3 and all(type(v) is float and math.isfinite(v) for v in value):
        return value  # type: ignore[return-value]  # the common case, already exact
    if isinstance(where, int):
        where = f"newton_schulz coefficients[{where}]"
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 3:
        raise ValueError(f"{where}: expected a triple (a, b, c), got {value!r}")
    out = []
    for v in value:
        if isinstance(v, (torch.SymFloat, torch.SymInt, torch.fx.Node)):
            raise ValueError(
                f"{where}: coefficients {value!r} are symbolic: Dynamo traced the optimizer's numbers as "
                f"variables, as torch.compile(dynamic=True) does; Newton–Schulz is compiled for fixed "
                f"coefficients, so compile the step with dynamic=False (or leave dynamic unset)"
            )
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{where}: coefficients must be finite numbers, got {value!r}")
        out.append(float(v))
    return (out[0], out[1], out[2])


def check_steps(steps: object) -> int:
    """``steps`` if it is an int >= 1, else ``ValueError``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"newton_schulz steps must be >= 1, got {steps!r}")
    return steps


def repeat_last(triples: Sequence[Triple], steps: int) -> tuple[Triple, ...]:
    """The triple of each of ``steps`` iterations when the last one repeats."""
    return tuple(triples[min(i, len(triples) - 1)] for i in range(steps))


@dataclasses.dataclass(frozen=True)
class NSArgs:
    """What one Newton–Schulz evaluation computes, besides its input.

    Attributes:
        coefficients: one ``(a, b, c)`` per iteration: ``X <- a X + b (X X^T) X + c (X X^T)^2 X``.
        eps: added to the scaled Frobenius norm before dividing (or its floor, ``clamp_eps``).
        norm_scale: the Frobenius norm is multiplied by this before ``eps`` is applied.
        clamp_eps: divide by ``max(norm * norm_scale, eps)`` instead of ``norm * norm_scale + eps``.
        compute_dtype: dtype of the iteration's matmuls.
        algorithm: how the polynomial iteration is evaluated: ``"textbook"`` (on ``X``),
            ``"gram"`` (on the small Gram matrix ``X X^T``, ``X`` multiplied once at the
            end) or ``"auto"`` (chosen per shape by :func:`muon_compile.ns.cost.choose`).
            Equal in exact arithmetic; they round differently.
        restarts: for ``"gram"`` only, the iterations before which the Gram evaluation
            restarts (``X <- Q X; R = X X^T``), in increasing order within ``(0, steps)``;
            None: every :data:`muon_compile.ns.cost.RESTART_EVERY` iterations. ``canonicalize``
            keeps those of a hand-written Gram loop.
        normalize: divide by the norm first (True), or take the input as given, already
            normalised (False: a loop whose input went through a custom rounding after its
            normalisation, which the code keeps); ``eps``, ``norm_scale`` and ``clamp_eps``
            are then unused.

    Raises ``ValueError`` naming the offending value for anything the op does not define.
    """

    coefficients: tuple[Triple, ...]
    eps: float = 1e-7
    norm_scale: float = 1.0
    clamp_eps: bool = False
    compute_dtype: torch.dtype = torch.bfloat16
    algorithm: str = AUTO
    restarts: tuple[int, ...] | None = None
    normalize: bool = True

    # The schema fragment of these arguments in the custom ops, after their tensor arguments.
    SCHEMA: ClassVar[str] = (
        "float[] coefficients, int steps, float eps, float norm_scale, bool clamp_eps, ScalarType compute_dtype, "
        "str algorithm, int[]? restarts=None, bool normalize=True"
    )
    ARITY: ClassVar[int] = 9  # entries of the flat form (the last two may be left out: defaults)
    REQUIRED: ClassVar[int] = 7  # entries without a default

    def __post_init__(self) -> None:
        if isinstance(self.coefficients, (str, bytes)) or not isinstance(self.coefficients, Sequence) or not self.coefficients:
            raise ValueError(f"newton_schulz needs at least one (a, b, c) triple, got {self.coefficients!r}")
        triples: list[Triple] = []
        for i, t in enumerate(self.coefficients):  # a triple equal to the one before is checked once
            triples.append(triples[-1] if i and t == self.coefficients[i - 1] else as_triple(t, i))
        object.__setattr__(self, "coefficients", tuple(triples))
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"newton_schulz eps must be >= 0, got {self.eps!r}")
        if isinstance(self.norm_scale, bool) or not isinstance(self.norm_scale, (int, float)) or not (
            math.isfinite(self.norm_scale) and self.norm_scale > 0
        ):
            raise ValueError(f"newton_schulz norm_scale must be a finite number > 0, got {self.norm_scale!r}")
        if not isinstance(self.clamp_eps, bool):
            raise ValueError(f"newton_schulz clamp_eps must be a bool, got {self.clamp_eps!r}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"newton_schulz compute_dtype must be one of {COMPUTE_DTYPES}, got {self.compute_dtype!r}")
        check_algorithm(self.algorithm)
        if self.restarts is not None:
            restarts = tuple(self.restarts) if isinstance(self.restarts, Sequence) else None
            if self.algorithm != GRAM or restarts is None or not all(
                type(r) is int and 0 < r < len(self.coefficients) for r in restarts
            ) or list(restarts) != sorted(set(restarts)):
                raise ValueError(
                    f"newton_schulz restarts must be increasing iteration indices in (0, steps) of algorithm "
                    f"'gram', got {self.restarts!r} with algorithm {self.algorithm!r} and {len(self.coefficients)} steps"
                )
            object.__setattr__(self, "restarts", restarts)
        if not isinstance(self.normalize, bool):
            raise ValueError(f"newton_schulz normalize must be a bool, got {self.normalize!r}")
        object.__setattr__(self, "eps", float(self.eps))
        object.__setattr__(self, "norm_scale", float(self.norm_scale))

    @property
    def steps(self) -> int:
        """Number of iterations."""
        return len(self.coefficients)

    @classmethod
    def repeating(cls, triples: Sequence[Sequence[float]], steps: int, **fields: object) -> NSArgs:
        """``steps`` iterations of ``triples``, the last triple repeating (the op's rule)."""
        check_steps(steps)
        if not triples:
            raise ValueError("newton_schulz needs at least one (a, b, c) triple")
        checked = [as_triple(t, i) for i, t in enumerate(triples)]
        return cls(repeat_last(checked, steps), **fields)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ flat op form

    def to_op(self) -> tuple:
        """The flat arguments of the custom ops (see the module docstring)."""
        triples = list(self.coefficients)
        while len(triples) > 1 and triples[-2] == triples[-1]:
            triples.pop()
        flat = [v for t in triples for v in t]
        flat_args = (flat, self.steps, self.eps, self.norm_scale, self.clamp_eps, self.compute_dtype, self.algorithm)
        restarts = None if self.restarts is None else list(self.restarts)
        if not self.normalize:
            return (*flat_args, restarts, False)
        return flat_args if restarts is None else (*flat_args, restarts)

    @classmethod
    def from_op(cls, flat: Sequence[object]) -> NSArgs:
        """Inverse of :meth:`to_op`: the ops' flat arguments (:data:`ARITY` of them, or fewer
        down to :data:`REQUIRED`, the rest at their defaults)."""
        if not cls.REQUIRED <= len(flat) <= cls.ARITY:
            raise ValueError(
                f"newton_schulz takes {cls.REQUIRED} to {cls.ARITY} arguments after its tensors ({cls.SCHEMA}), got {len(flat)}"
            )
        coefficients, steps, eps, norm_scale, clamp_eps, compute_dtype, algorithm = flat[: cls.REQUIRED]
        extra = flat[cls.REQUIRED :]
        restarts = extra[0] if len(extra) > 0 else None
        normalize = extra[1] if len(extra) > 1 else True
        values = list(coefficients)  # type: ignore[call-overload]
        if not values or len(values) % 3:
            raise ValueError(f"newton_schulz coefficients must hold 3*k values (k >= 1), got {len(values)}: {values!r}")
        triples = [tuple(values[i : i + 3]) for i in range(0, len(values), 3)]
        return cls.repeating(
            triples, steps, eps=eps, norm_scale=norm_scale, clamp_eps=clamp_eps, compute_dtype=compute_dtype,
            algorithm=algorithm, restarts=None if restarts is None else tuple(restarts), normalize=normalize,
        )  # type: ignore[arg-type]

    def describe(self) -> str:
        """One line for logs and plans, e.g. ``5 steps (3.4445, -4.775, 2.0315) x5, eps 1e-07, bf16``."""
        runs: list[str] = []
        i = 0
        while i < self.steps:
            j = i
            while j + 1 < self.steps and self.coefficients[j + 1] == self.coefficients[i]:
                j += 1
            runs.append(f"{self.coefficients[i]}" + (f" x{j - i + 1}" if j > i else ""))
            i = j + 1
        norm = f"max(norm * {self.norm_scale:g}, {self.eps:g})" if self.clamp_eps else f"norm * {self.norm_scale:g} + {self.eps:g}"
        algorithm = "" if self.algorithm == AUTO else f"; {self.algorithm}"
        if self.restarts is not None:
            algorithm += f", restarts before {list(self.restarts)}" if self.restarts else ", no restart"
        norm = f"divide by {norm}" if self.normalize else "the input taken as normalised"
        return f"{self.steps} steps {', '.join(runs)}; {norm}; {self.compute_dtype}{algorithm}"

