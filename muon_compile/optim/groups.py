"""Param groups of :class:`~muon_compile.MuonAdamW`: their kinds' defaults, validation, and
hyper-parameters as 0-D tensors.

A group is a ``torch.optim`` param-group dict with a ``"kind"`` (``"muon"`` or ``"adamw"``).
:func:`prepare` fills the kind's defaults, checks every setting and parameter (errors name
the parameter), stores the scalars as 0-D float64 tensors and routes each Muon parameter
(:mod:`muon_compile.distributed.routing`); :func:`restore` does the same for groups read from
a checkpoint. The state a group's parameters step with is :mod:`muon_compile.optim.state`'s.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from .. import config
from ..diagnostics.counters import counters
from ..distributed.routing import Kind, layout_of
from ..distributed.routing import prepare as prepare_routing
from ..ns import coefficients as coeffs
from ..ns.args import check_algorithm
from .updates import AdjustLR

log = logging.getLogger(__name__)

KINDS = ("muon", "adamw")
SCALARS = {"muon": ("lr", "momentum", "weight_decay"), "adamw": ("lr", "eps", "weight_decay")}
NS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def scalar(value: Any, key: str) -> Tensor:
    """A hyper-parameter as a 0-D float64 tensor, as exact as a Python float (a given 0-D
    tensor is kept, not copied). As a 0-D tensor it never changes a parameter's dtype."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.dtype.is_floating_point:
            raise ValueError(f"hyper-parameter {key!r} must be a float or a 1-element float tensor, got {value!r}")
        return value if value.dim() == 0 else value.reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"hyper-parameter {key!r} must be a number, got {value!r}")
    return torch.tensor(float(value), dtype=torch.float64)


def _ns_dtype(value: Any) -> torch.dtype:
    """``ns_dtype`` as a dtype: a floating ``torch.dtype`` or one of the names of ``NS_DTYPES``."""
    dtype = NS_DTYPES.get(value, value) if isinstance(value, str) else value
    if dtype not in NS_DTYPES.values():
        raise ValueError(f"ns_dtype must be one of {list(NS_DTYPES)} or the matching torch dtype, got {value!r}")
    return dtype


def _value(x: Any) -> float:
    return float(x.item()) if isinstance(x, Tensor) else float(x)


def param_name(group: dict, index: int) -> str:
    """How errors and logs name a group's ``index``-th parameter: its name, else its index and shape."""
    names = group.get("param_names")
    if names is not None:
        return repr(names[index])
    return f"#{index} (shape {tuple(group['params'][index].shape)})"


def device_of(group: dict) -> torch.device:
    """Where a group's counters live: its parameters' device (the CPU for an empty group),
    so that a step on a GPU writes no CPU tensor and can be captured as a CUDA graph."""
    return group["params"][0].device if group["params"] else torch.device("cpu")


def check_kind(group: dict) -> str:
    kind = group.get("kind")
    if kind not in KINDS:
        raise ValueError(f"param group 'kind' must be one of {KINDS}, got {kind!r}")
    return kind


def prepare(group: dict, skip_nonfinite: bool) -> None:
    """Check a group added to the optimizer (its kind's defaults filled) and normalise its
    settings in place; route each Muon parameter. Raises ``ValueError`` naming the setting
    or the parameter."""
    if skip_nonfinite:
        group.setdefault("skipped_steps", torch.zeros((), dtype=torch.int64, device=device_of(group)))
    if group["kind"] == "muon":
        _prepare_muon(group)
    else:
        _prepare_adamw(group)


def restore(group: dict, defaults: dict, skip_nonfinite: bool) -> None:
    """A group read from a checkpoint as :func:`prepare` leaves one: a setting newer than the
    checkpoint at its default, hyper-parameters as 0-D tensors, counters on the group's device."""
    for key, value in defaults.items():
        group.setdefault(key, value)
    for key in SCALARS[group["kind"]]:
        group[key] = scalar(group[key], key)
    if group["kind"] == "adamw":
        group["betas"] = tuple(scalar(b, "betas") for b in group["betas"])
    if skip_nonfinite:
        group.setdefault("skipped_steps", torch.zeros((), dtype=torch.int64))
        group["skipped_steps"] = group["skipped_steps"].to(device_of(group))


def _prepare_muon(group: dict) -> None:
    coeffs.resolve(group["ns_coefficients"])
    if not isinstance(group["ns_steps"], int) or group["ns_steps"] < 1:
        raise ValueError(f"ns_steps must be a positive int, got {group['ns_steps']!r}")
    group["ns_dtype"] = _ns_dtype(group["ns_dtype"])
    check_algorithm(group["ns_algorithm"], "ns_algorithm")
    if group["tp_mode"] is not None:
        group["tp_mode"] = config.TPMode.parse(group["tp_mode"], "tp_mode").value
    group["adjust_lr"] = AdjustLR.check(group["adjust_lr"], "adjust_lr")
    if group["ns_eps"] is not None and not group["ns_eps"] >= 0:
        raise ValueError(f"ns_eps must be >= 0, got {group['ns_eps']!r}")
    for key in SCALARS["muon"]:
        group[key] = scalar(group[key], key)
    if group["normuon_beta2"] is not None:
        group["normuon_beta2"] = scalar(group["normuon_beta2"], "normuon_beta2")
        if not 0 <= _value(group["normuon_beta2"]) < 1:
            raise ValueError(f"normuon_beta2 must be in [0, 1), got {_value(group['normuon_beta2'])}")
    _check_ranges(group)
    for i, p in enumerate(group["params"]):
        if group["split_rows"] is not None and p.dim() in (2, 3):
            _check_split(group, i)
        if p.dim() not in (2, 3):
            raise ValueError(
                f"Muon parameter {param_name(group, i)} has {p.dim()} dimension(s); Muon takes "
                "2-D matrices or 3-D stacks of matrices: put it in an 'adamw' group"
            )
        _check_real(group, i)
        _route(group, i)


def _route(group: dict, index: int) -> None:
    """Make the process group of a parameter sharded on several mesh dimensions (here, on
    every rank) and log how it will be orthogonalised when that is not the usual way."""
    p = group["params"][index]
    prepare_routing(p, group["tp_mode"])
    layout = layout_of(p, group["tp_mode"])
    if layout.kind is Kind.DTENSOR:
        log.info("Muon parameter %s: %s; %s (one collective per matrix)", param_name(group, index), layout.reason, layout.kind.value)
        counters["route.dtensor_fallback"] += 1
    elif layout.reason is not None:
        log.info("Muon parameter %s: %s", param_name(group, index), layout.reason)


def _prepare_adamw(group: dict) -> None:
    for key in SCALARS["adamw"]:
        group[key] = scalar(group[key], key)
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair, got {betas!r}")
    group["betas"] = (scalar(betas[0], "betas[0]"), scalar(betas[1], "betas[1]"))
    _check_ranges(group)
    for i in range(len(group["params"])):
        _check_real(group, i)


def _check_ranges(group: dict) -> None:
    if _value(group["lr"]) < 0:
        raise ValueError(f"lr must be >= 0, got {_value(group['lr'])}")
    if _value(group["weight_decay"]) < 0:
        raise ValueError(f"weight_decay must be >= 0, got {_value(group['weight_decay'])}")
    if group["kind"] == "muon" and not 0 <= _value(group["momentum"]) < 1:
        raise ValueError(f"momentum must be in [0, 1), got {_value(group['momentum'])}")
    if "betas" in group and not all(0 <= _value(b) < 1 for b in group["betas"]):
        raise ValueError(f"betas must be in [0, 1), got {[_value(b) for b in group['betas']]}")


def _check_split(group: dict, index: int) -> None:
    split, rows = group["split_rows"], group["params"][index].shape[-2]
    sizes = split if isinstance(split, (tuple, list)) else None
    if sizes is None and not (isinstance(split, int) and split > 0 and rows % split == 0):
        raise ValueError(f"split_rows={split!r} does not divide the {rows} rows of Muon parameter {param_name(group, index)}")
    if sizes is not None and (not all(isinstance(r, int) and r > 0 for r in sizes) or sum(sizes) != rows):
        raise ValueError(f"split_rows={split!r} does not sum to the {rows} rows of Muon parameter {param_name(group, index)}")


def _check_real(group: dict, index: int) -> None:
    p = group["params"][index]
    if torch.is_complex(p) or not p.dtype.is_floating_point:
        raise ValueError(f"parameter {param_name(group, index)} has dtype {p.dtype}; only real floating point is supported")


def check_grad(group: dict, index: int, grad: Tensor) -> None:
    """Refuse a sparse or complex gradient, naming its parameter."""
    if grad.is_sparse:
        raise ValueError(f"parameter {param_name(group, index)} has a sparse gradient; it is not supported")
    if torch.is_complex(grad):
        raise ValueError(f"parameter {param_name(group, index)} has a complex gradient; it is not supported")
