"""Profile files: a device profile and, where measured, a network profile, as JSON.

:mod:`muon_compile.advisor.calibrate` writes one (:func:`save`);
``python -m muon_compile.advisor --profile FILE`` reads it (:func:`load`) in place of
``--device`` and, where the file has a network, of ``--network``. The file, version 1
(``(optional: X)`` marks a field that may be left out, and what it then is)::

    {
      "version": 1,
      "device": {
        "name": str, "source": str, "kind": "cpu" or "cuda",
        "matmul": {
          "source": str,
          "rates": {"bfloat16": TABLE, "float16": TABLE, ...},   GFLOP/s of batched s x s products
          "latency": {"bfloat16": TABLE, ...},                    seconds per product call (optional: none)
          "families": {"long inner": {"bfloat16": TABLE}, ...}    GFLOP/s by cube size (optional: none)
        },
        "memory_bandwidth": bytes/s,
        "memory": bytes (optional: 0, unknown),
        "overlaps_communication": bool, "queues_kernels": bool (optional: true on cuda, false on cpu),
        "step_overhead", "param_overhead", "call_overhead", "bucket_overhead",
        "collective_overhead": seconds (optional: see below),
        "shared_cores": int (optional: 0), "rank_threads": int (optional: 1),
        "ns_pass_bandwidth": bytes/s (optional: 0, a copy's)
      },
      "network": null or {
        "name": str, "source": str, "ranks_per_node": int,
        "intra": LINK, "inter": LINK,
        "kinds": {"all_gather_into_tensor": LINK, ...} (optional: none),
        "exchanges_in_flight": int (optional: 1)
      },
      "measurements": anything (optional: calibrate's raw timings, not read)
    }

A ``TABLE`` is a list of ``[size, value]`` pairs in increasing size, as
:class:`~muon_compile.ns.matmul_rates.MatmulRates` holds them (a family's sizes are the side
of the cube of its products' volume); a ``LINK`` is ``{"latency": seconds, "bandwidth":
bytes/s or null (unbounded)}``, with ``"large_from": bytes`` and ``"large": LINK`` for a
link that prices larger messages by another (:class:`~.network_profiles.Link`). The
fields are those of :class:`~.step_cost.DeviceProfile` and
:class:`~.network_profiles.NetworkProfile`.

The fixed costs of a compiled step (:data:`~.step_cost.FIXED_COSTS`) are not measured by
the calibration: left out, they are the built-in ``h100`` profile's estimates on ``cuda``
(:func:`default_fixed_costs`) and 0 on ``cpu``; a file may give its own.

:func:`load`:

1. Read the file as JSON.
2. Read every field, checking its type and range and that no unknown field is present;
   a bad one is a ``ValueError`` naming the file and the field (``device.matmul.rates``).
3. Build the profiles; :func:`save` writes every field back, so that :func:`load` of it
   gives profiles equal to those saved.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..ns.matmul_rates import FAMILIES, MatmulRates, Table
from .network_profiles import COLLECTIVES, Link, NetworkProfile
from .step_cost import DEVICES, FIXED_COSTS, DeviceProfile

VERSION = 1
KINDS = ("cpu", "cuda")
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.bfloat16, torch.float16, torch.float32, torch.float64)}
# the dtypes the advisor prices: a bf16 step and its fp16 Gram iteration
REQUIRED_DTYPES = ("bfloat16", "float16")
_MISSING = object()


def default_fixed_costs(kind: str) -> dict[str, float]:
    """The fixed costs a profile of device ``kind`` has unless its file gives them: the
    built-in ``h100`` profile's estimates on ``cuda``, 0 on ``cpu``."""
    h100 = DEVICES["h100"]
    return {name: getattr(h100, name) if kind == "cuda" else 0.0 for name in FIXED_COSTS}


def _number(value: object, positive: bool = False) -> float | None:
    """``value`` if it is a finite JSON number >= 0 (> 0 with ``positive``), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value if (value > 0 if positive else value >= 0) else None


class _Object:
    """One JSON object of a profile file, read field by field: an error names the file and
    the field's path."""

    def __init__(self, file: str, field: str, data: object) -> None:
        self.file, self.field, self.data, self.read = file, field, data, set()
        if not isinstance(data, dict):
            raise self.error("", f"must be an object, got {json.dumps(data)[:60]}")

    def error(self, key: str, why: str) -> ValueError:
        where = ".".join(p for p in (self.field, key) if p) or "the top level"
        return ValueError(f"profile {self.file}: {where}: {why}")

    def get(self, key: str, default: object = _MISSING) -> object:
        self.read.add(key)
        if key not in self.data:
            if default is _MISSING:
                raise self.error(key, "missing")
            return default
        return self.data[key]

    def number(self, key: str, default: object = _MISSING, positive: bool = False) -> float:
        value = self.get(key, default)
        if _number(value, positive=positive) is None:
            raise self.error(key, f"must be a number {'>' if positive else '>='} 0, got {value!r}")
        return value

    def integer(self, key: str, default: object = _MISSING, minimum: int = 0) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def flag(self, key: str, default: object = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def text(self, key: str, choices: tuple[str, ...] = ()) -> str:
        value = self.get(key)
        if not isinstance(value, str) or (choices and value not in choices):
            raise self.error(key, f"must be {'one of ' + str(list(choices)) if choices else 'a string'}, got {value!r}")
        return value

    def child(self, key: str, default: object = _MISSING) -> _Object | None:
        """The object under ``key``; None where it is null or missing with a ``default`` of None."""
        value = self.get(key, default)
        if value is None and default is _MISSING:
            raise self.error(key, "must be an object, got null")
        return None if value is None else _Object(self.file, ".".join(p for p in (self.field, key) if p), value)

    def table(self, key: str, positive: bool) -> Table:
        pairs = self.get(key)
        ok = isinstance(pairs, list) and pairs and all(isinstance(p, list) and len(p) == 2 for p in pairs)
        ok = ok and all(_number(s, positive=True) is not None and _number(v, positive=positive) is not None for s, v in pairs)
        if not ok or any(a[0] >= b[0] for a, b in zip(pairs, pairs[1:])):
            raise self.error(key, f"must be [size, value] pairs of increasing sizes > 0 and values {'>' if positive else '>='} 0, "
                                  f"got {json.dumps(pairs)[:80]}")
        return tuple((s, v) for s, v in pairs)

    def tables(self, key: str, positive: bool, default: object = _MISSING) -> dict[torch.dtype, Table]:
        by_name = self.child(key, default)
        if by_name is None:
            return {}
        if unknown := sorted(set(by_name.data) - set(DTYPES)):
            raise by_name.error("", f"unknown dtypes {unknown}; known: {sorted(DTYPES)}")
        return {DTYPES[name]: by_name.table(name, positive) for name in by_name.data}

    def done(self) -> None:
        """Refuses the fields not read: a misspelt optional field would be silently unused."""
        if unknown := sorted(set(self.data) - self.read):
            raise self.error("", f"unknown fields {unknown}")


def _link(fields: _Object) -> Link:
    bandwidth = fields.get("bandwidth")
    if bandwidth is not None and _number(bandwidth, positive=True) is None:
        raise fields.error("bandwidth", f"must be a number > 0 or null (unbounded), got {bandwidth!r}")
    large = fields.child("large", None)
    if large is None and "large_from" in fields.data:
        raise fields.error("large", "missing: large_from needs the link of the larger messages")
    large_from = math.inf if large is None else fields.number("large_from", positive=True)
    link = Link(fields.number("latency"), math.inf if bandwidth is None else bandwidth, large_from, None if large is None else _link(large))
    fields.done()
    return link


def _device(fields: _Object) -> DeviceProfile:
    kind = fields.text("kind", KINDS)
    matmul = fields.child("matmul")
    rates = matmul.tables("rates", positive=True)
    if missing := [d for d in REQUIRED_DTYPES if DTYPES[d] not in rates]:
        raise matmul.error("rates", f"needs {list(REQUIRED_DTYPES)} (the advisor's dtypes), missing {missing}")
    families = matmul.child("families", None)
    if families is not None and (unknown := sorted(set(families.data) - set(FAMILIES))):
        raise families.error("", f"unknown families {unknown}; known: {list(FAMILIES)}")
    by_family = {} if families is None else {f: families.tables(f, positive=True) for f in families.data}
    latency = matmul.tables("latency", positive=False, default=None)
    rates = MatmulRates(kind, matmul.text("source"), rates, latency, by_family)
    matmul.done()
    fixed = default_fixed_costs(kind)
    profile = DeviceProfile(
        fields.text("name"),
        fields.text("source"),
        rates,
        memory_bandwidth=fields.number("memory_bandwidth", positive=True),
        overlaps_communication=fields.flag("overlaps_communication", kind == "cuda"),
        queues_kernels=fields.flag("queues_kernels", kind == "cuda"),
        **{name: fields.number(name, fixed[name]) for name in FIXED_COSTS},
        memory=fields.number("memory", 0),
        shared_cores=fields.integer("shared_cores", 0),
        rank_threads=fields.integer("rank_threads", 1, minimum=1),
        ns_pass_bandwidth=fields.number("ns_pass_bandwidth", 0),
    )
    fields.done()
    return profile


def _network(fields: _Object) -> NetworkProfile:
    kinds = fields.child("kinds", None)
    if kinds is not None and (unknown := sorted(set(kinds.data) - set(COLLECTIVES))):
        raise kinds.error("", f"unknown collective kinds {unknown}; known: {list(COLLECTIVES)}")
    profile = NetworkProfile(
        fields.text("name"),
        fields.text("source"),
        intra=_link(fields.child("intra")),
        inter=_link(fields.child("inter")),
        ranks_per_node=fields.integer("ranks_per_node", minimum=1),
        kinds={} if kinds is None else {kind: _link(kinds.child(kind)) for kind in kinds.data},
        exchanges_in_flight=fields.integer("exchanges_in_flight", 1, minimum=1),
    )
    fields.done()
    return profile


def from_json(data: object, file: str = "<json>") -> tuple[DeviceProfile, NetworkProfile | None]:
    """The profiles of a profile file's parsed JSON ``data`` (see the module docstring);
    ``file`` names it in errors."""
    top = _Object(file, "", data)
    if isinstance(version := top.get("version"), bool) or version != VERSION:
        raise top.error("version", f"must be {VERSION}, got {version!r}")
    device = _device(top.child("device"))
    network = top.child("network", None)
    top.get("measurements", None)
    top.done()
    return device, None if network is None else _network(network)


def load(path: str | Path) -> tuple[DeviceProfile, NetworkProfile | None]:
    """The device profile of the profile file at ``path``, and its network profile (None
    where it has none); ``ValueError`` naming the file and the field that is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"profile {path}: not JSON: {e}") from e
    return from_json(data, str(path))


def _pairs(tables: dict[torch.dtype, Table], field: str) -> dict[str, list]:
    names = {d: n for n, d in DTYPES.items()}
    if unknown := [str(d) for d in tables if d not in names]:
        raise ValueError(f"{field}: a profile file holds the dtypes {sorted(DTYPES)}, not {unknown}")
    return {names[d]: [list(p) for p in table] for d, table in tables.items()}


def _link_json(link: Link) -> dict:
    out = {"latency": link.latency, "bandwidth": None if math.isinf(link.bandwidth) else link.bandwidth}
    if link.large is not None:
        out.update(large_from=link.large_from, large=_link_json(link.large))
    return out


def to_json(device: DeviceProfile, network: NetworkProfile | None = None, measurements: object = None) -> dict:
    """The profile file's JSON of ``device`` and ``network`` (see the module docstring),
    every field written; ``measurements``, anything JSON holds, as they are."""
    matmul = device.matmul
    if matmul.device not in KINDS:
        raise ValueError(f"device.kind: a profile file holds a device of kind {list(KINDS)}, not {matmul.device!r}")
    out = {"version": VERSION, "device": {
        "name": device.name,
        "source": device.source,
        "kind": matmul.device,
        "matmul": {
            "source": matmul.source,
            "rates": _pairs(matmul.tables, "device.matmul.rates"),
            "latency": _pairs(matmul.latency, "device.matmul.latency"),
            "families": {f: _pairs(t, f"device.matmul.families.{f}") for f, t in matmul.families.items()},
        },
        "memory_bandwidth": device.memory_bandwidth,
        "memory": device.memory,
        "overlaps_communication": device.overlaps_communication,
        "queues_kernels": device.queues_kernels,
        **{name: getattr(device, name) for name in FIXED_COSTS},
        "shared_cores": device.shared_cores,
        "rank_threads": device.rank_threads,
        "ns_pass_bandwidth": device.ns_pass_bandwidth,
    }, "network": None}
    if network is not None:
        for field in ("compute_share", "after_compute", "after_compute_alone"):
            if getattr(network, field):
                raise ValueError(f"network.{field}: a profile file does not hold it (network profile {network.name!r} has one)")
        out["network"] = {
            "name": network.name,
            "source": network.source,
            "ranks_per_node": network.ranks_per_node,
            "intra": _link_json(network.intra),
            "inter": _link_json(network.inter),
            "kinds": {kind: _link_json(link) for kind, link in network.kinds.items()},
            "exchanges_in_flight": network.exchanges_in_flight,
        }
    if measurements is not None:
        out["measurements"] = measurements
    return out


def _text(value: object, indent: str = "") -> str:
    """``value`` as JSON: an object's fields and a list's items one a line, but a list of
    numbers and strings (a table's pair) on one."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {_text(v, inner)}" for k, v in value.items()) + f"\n{indent}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + _text(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value, allow_nan=False)


def save(path: str | Path, device: DeviceProfile, network: NetworkProfile | None = None, measurements: object = None) -> None:
    """Writes the profile file of ``device``, ``network`` and ``measurements`` (:func:`to_json`) to ``path``."""
    Path(path).write_text(_text(to_json(device, network, measurements)) + "\n")
