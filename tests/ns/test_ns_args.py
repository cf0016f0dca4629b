"""NSArgs, the one owner of the Newton–Schulz arguments: the flat op form and back,
one value per function, validation, and the ops' schemas built from it."""

import dataclasses

import pytest
import torch

from muon_compile.ns import coefficients as coeffs
from muon_compile.ns.args import NSArgs
from muon_compile.ns.op import NEWTON_SCHULZ
from muon_compile.distributed.sharded_op import SHARDED_NEWTON_SCHULZ

KELLER = (3.4445, -4.775, 2.0315)


@pytest.mark.parametrize("preset", sorted(coeffs.PRESETS))
@pytest.mark.parametrize("steps", [1, 5, 9])
def test_flat_form_round_trips(preset, steps):
    args = coeffs.ns_args(preset, steps, eps=1e-6, compute_dtype=torch.float32, clamp_eps=True)
    assert args.steps == steps and len(args.coefficients) == steps
    flat = args.to_op()
    assert len(flat) == NSArgs.REQUIRED  # restarts None, normalize True: left to the schema's defaults
    assert NSArgs.from_op(flat) == NSArgs.from_op((*flat, None)) == NSArgs.from_op((*flat, None, True)) == args
    given = dataclasses.replace(args, normalize=False)
    assert len(given.to_op()) == NSArgs.ARITY and NSArgs.from_op(given.to_op()) == given != args
    if steps > 1:
        gram = dataclasses.replace(args, algorithm="gram", restarts=(1,))
        assert len(gram.to_op()) == NSArgs.ARITY - 1 and gram.to_op()[-1] == [1]
        assert NSArgs.from_op(gram.to_op()) == gram != dataclasses.replace(gram, restarts=None)


def test_one_value_per_function():
    """Keller's triple given once or five times is the same function: equal NSArgs, the
    same compact flat form (the op repeats the last triple)."""
    once = NSArgs.from_op(([*KELLER], 5, 1e-7, 1.0, False, torch.bfloat16, "auto"))
    five = NSArgs.from_op(([*KELLER] * 5, 5, 1e-7, 1.0, False, torch.bfloat16, "auto"))
    assert once == five == coeffs.ns_args("keller", 5)
    assert once.to_op()[0] == list(KELLER)
    assert hash(once) == hash(five)
    # a schedule that only ends in repeats keeps its distinct prefix
    polar = coeffs.ns_args("polar_express", 10)
    assert len(polar.to_op()[0]) == 3 * 8 and polar.coefficients[8:] == (polar.coefficients[7],) * 2


def test_cycled_presets_expand_per_iteration():
    quintic = coeffs.PRESETS["quintic"]
    args = coeffs.ns_args("quintic", 7)
    assert args.coefficients == quintic.coefficients + quintic.coefficients[:2]


def test_describe_names_every_argument():
    text = coeffs.ns_args("keller", 5, eps=1e-6, clamp_eps=True).describe()
    assert text == "5 steps (3.4445, -4.775, 2.0315) x5; divide by max(norm * 1, 1e-06); torch.bfloat16"
    gram = dataclasses.replace(coeffs.ns_args("keller", 5), algorithm="gram")
    assert gram.describe().endswith("; torch.bfloat16; gram")
    assert dataclasses.replace(gram, restarts=(2,)).describe().endswith("; gram, restarts before [2]")
    assert dataclasses.replace(gram, restarts=()).describe().endswith("; gram, no restart")
    given = dataclasses.replace(coeffs.ns_args("keller", 5), normalize=False).describe()
    assert given == "5 steps (3.4445, -4.775, 2.0315) x5; the input taken as normalised; torch.bfloat16"


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(coefficients=()), "at least one"),
        (dict(coefficients=((1.0, 2.0),)), "expected a triple"),
        (dict(coefficients=((1.0, 2.0, float("inf")),)), "finite"),
        (dict(coefficients=(KELLER,), eps=-1.0), "eps must be >= 0"),
        (dict(coefficients=(KELLER,), norm_scale=0.0), "norm_scale"),
        (dict(coefficients=(KELLER,), clamp_eps=1), "clamp_eps must be a bool"),
        (dict(coefficients=(KELLER,), compute_dtype=torch.int32), "compute_dtype"),
        (dict(coefficients=(KELLER,), algorithm="fast"), r"algorithm must be one of \['auto', 'textbook', 'gram'\]"),
        (dict(coefficients=(KELLER,) * 5, restarts=(2,)), "restarts .* of algorithm 'gram'"),
        (dict(coefficients=(KELLER,) * 5, algorithm="gram", restarts=(3, 2)), "increasing"),
        (dict(coefficients=(KELLER,) * 5, algorithm="gram", restarts=(5,)), r"in \(0, steps\)"),
        (dict(coefficients=(KELLER,), normalize=1), "normalize must be a bool"),
    ],
)
def test_invalid_arguments_raise_value_error(fields, match):
    with pytest.raises(ValueError, match=match):
        NSArgs(**fields)


@pytest.mark.parametrize(
    "flat, match",
    [
        (([1.0, 2.0, 3.0, 4.0], 5, 1e-7, 1.0, False, torch.float32, "auto"), r"3\*k values"),
        (([*KELLER], 0, 1e-7, 1.0, False, torch.float32, "auto"), "steps must be >= 1"),
        (([*KELLER], 5, 1e-7, 1.0, False), "takes 7 to 9 arguments"),
    ],
)
def test_invalid_flat_form_raises_value_error(flat, match):
    with pytest.raises(ValueError, match=match):
        NSArgs.from_op(flat)


def test_op_schemas_are_built_from_the_type():
    for op in (NEWTON_SCHULZ, SHARDED_NEWTON_SCHULZ):
        schema = str(op._schema)
        assert NSArgs.SCHEMA in schema
        assert len(op._schema.arguments) - NSArgs.ARITY == (1 if op is NEWTON_SCHULZ else 8)
