"""Tuning variables of the ``muon`` backend, read once from the environment.

Every knob is a ``MUON_COMPILE_*`` environment variable, parsed here and nowhere else.
Pass bodies never read the environment: the pipeline hands them plain keyword
arguments taken from :func:`current`. Tests and tools change settings with
:func:`override`, a context manager, instead of mutating ``os.environ``.

=========================  ===========  ==============================================
variable                   default      meaning
=========================  ===========  ==============================================
MUON_COMPILE_BUCKET_MB     64           size cap of one bucket's stacked input, MiB
MUON_COMPILE_STRATEGY      all_to_all   distributed strategy (:class:`Strategy`):
                                        all_to_all | all_gather
MUON_COMPILE_TP_MODE       distributed  how matrices sharded on a tensor-parallel mesh
                                        dimension are orthogonalised (:class:`TPMode`):
                                        distributed | duplicated | blockwise
MUON_COMPILE_TP_DIMS       tp           comma list of the mesh dimension names that are
                                        tensor-parallel (for ``duplicated`` and
                                        ``blockwise``)
MUON_COMPILE_PREFETCH      1            distributed buckets whose collective is issued
                                        ahead of the current bucket's compute
MUON_COMPILE_NS_ALGORITHM  auto         how Newton–Schulz calls left to ``auto`` are
                                        evaluated: auto (cheaper per shape, see
                                        :mod:`muon_compile.ns.cost`) | textbook | gram
MUON_COMPILE_SYM_PRODUCTS  auto         symmetric products (X Xᵀ, squares) by the Triton
                                        kernel of :mod:`muon_compile.kernels.sym`: auto
                                        (where measured faster) | on | off
MUON_COMPILE_NS_EPILOGUE   auto         the textbook iteration's scalars in the products'
                                        epilogues (``baddbmm``) or in one pointwise
                                        kernel (:func:`muon_compile.ns.cost.choose_epilogue`):
                                        auto (the form measured faster) | on | off
MUON_COMPILE_NS_ORIENTATION auto        a tall matrix's textbook iterates in its own
                                        layout (on) or transposed (off), or auto: the
                                        layout measured faster
                                        (:func:`muon_compile.ns.cost.choose_orientation`)
MUON_COMPILE_CPU_RATES     auto         the CPU's matmul rates the choices above read
                                        (:func:`muon_compile.ns.matmul_rates.cpu_profile`):
                                        auto (this CPU's: ``cpu`` with AVX-512, else
                                        ``cpu-avx2``) | cpu | cpu-avx2
MUON_COMPILE_PAD_WASTE     0            largest fraction of a padded bucket's NS FLOPs
                                        that may be zero padding (0 disables merging)
MUON_COMPILE_PASSES        (all)        comma list: ``a,b`` runs only those passes,
                                        ``-a`` disables pass ``a``
MUON_COMPILE_DUMP_DIR      (unset)      directory for each pass's before/after graph
                                        (created when the setting is read)
MUON_COMPILE_TRACE_HELPERS 1            0 leaves Dynamo's handling of setting reads and
                                        logging calls as it is (:mod:`tracing`)
MUON_COMPILE_EXPLAIN       0            1 prints what the backend did with each graph
                                        (:mod:`muon_compile.diagnostics.explain`)
MUON_COMPILE_CPU_HEAP_MB   256          freed memory, MiB, this process's glibc heap keeps
                                        for the next step once a CPU graph is compiled or
                                        the op runs eagerly on the CPU
                                        (:mod:`muon_compile.compile.cpu_heap`); 0 leaves glibc's
                                        settings as they are
MUON_COMPILE_AGREE_TIMEOUT 600          seconds a rank waits for the other ranks of a
                                        process group to reach the same compilation
                                        (:mod:`muon_compile.distributed.rank_agreement`); 0 turns
                                        the rank-agreement check off
=========================  ===========  ==============================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from collections.abc import Iterator, Mapping

from .modes import Mode
from .ns.args import AUTO, check_algorithm
from .ns.cost import Policy
from .ns.matmul_rates import cpu_profile


def pass_names() -> tuple[str, ...]:
    """The passes a user may switch on or off, in pipeline order: the names of
    :data:`muon_compile.passes.table.PASSES`, imported on first use (reading the configuration
    imports no pass)."""
    from .passes.table import names

    return names()

# The fields that change what the passes produce, with the variable that sets each: the
# cache key (:meth:`Config.cache_key`) and what the ranks must agree on
# (:meth:`Config.plan_settings`).
PLAN_FIELDS = (
    ("bucket_mb", "MUON_COMPILE_BUCKET_MB"),
    ("strategy", "MUON_COMPILE_STRATEGY"),
    ("tp_mode", "MUON_COMPILE_TP_MODE"),
    ("tp_dims", "MUON_COMPILE_TP_DIMS"),
    ("prefetch", "MUON_COMPILE_PREFETCH"),
    ("pad_waste", "MUON_COMPILE_PAD_WASTE"),
    ("ns_algorithm", "MUON_COMPILE_NS_ALGORITHM"),
    ("sym_products", "MUON_COMPILE_SYM_PRODUCTS"),
    ("ns_epilogue", "MUON_COMPILE_NS_EPILOGUE"),
    ("ns_orientation", "MUON_COMPILE_NS_ORIENTATION"),
    ("cpu_rates", "MUON_COMPILE_CPU_RATES"),
    ("passes", "MUON_COMPILE_PASSES"),
)


class Strategy(Mode):
    """How the buckets of row-sharded matrices are orthogonalised across ranks."""

    ALL_TO_ALL = "all_to_all"  # owner-compute: each rank orthogonalises ~1/W of the matrices
    ALL_GATHER = "all_gather"  # every rank orthogonalises every matrix, keeps its rows

    @classmethod
    def parse(cls, value: Strategy | str, where: str = "MUON_COMPILE_STRATEGY") -> Strategy:
        """``value`` as a :class:`Strategy` (a member or its name); ``ValueError`` naming ``where`` otherwise."""
        return super().parse(value, where)


class TPMode(Mode):
    """How a matrix sharded on a tensor-parallel mesh dimension is orthogonalised (Megatron's
    ``TensorParallelMuon`` modes; :mod:`muon_compile.distributed.routing`). Matrices sharded on no such
    dimension are distributed by owner whatever the mode."""

    DISTRIBUTED = "distributed"  # the whole matrix, by owner over every sharded mesh dimension
    DUPLICATED = "duplicated"  # the whole matrix on every rank of its group (one all-gather)
    BLOCKWISE = "blockwise"  # each tensor-parallel block alone: not Muon's exact update

    @classmethod
    def parse(cls, value: TPMode | str, where: str = "MUON_COMPILE_TP_MODE") -> TPMode:
        """``value`` as a :class:`TPMode` (a member or its name); ``ValueError`` naming ``where`` otherwise."""
        return super().parse(value, where)


@dataclasses.dataclass(frozen=True)
class Config:
    """One immutable set of tuning values; see the module docstring for each field."""

    bucket_mb: float = 64.0
    strategy: Strategy = Strategy.ALL_TO_ALL
    tp_mode: TPMode = TPMode.DISTRIBUTED
    tp_dims: tuple[str, ...] = ("tp",)
    prefetch: int = 1
    pad_waste: float = 0.0
    ns_algorithm: str = AUTO
    sym_products: str = AUTO
    ns_epilogue: str = AUTO
    ns_orientation: str = AUTO
    cpu_rates: str = AUTO
    passes: tuple[str, ...] | None = None  # None: every pass
    dump_dir: str | None = None
    trace_helpers: bool = True
    explain: bool = False
    cpu_heap_mb: int = 256
    agree_timeout: float = 600.0

    def __post_init__(self) -> None:
        if not self.bucket_mb > 0:
            raise ValueError(f"MUON_COMPILE_BUCKET_MB must be > 0, got {self.bucket_mb!r}")
        if not isinstance(self.strategy, Strategy):
            raise ValueError(f"strategy must be a muon_compile.config.Strategy, got {self.strategy!r}")
        if not isinstance(self.tp_mode, TPMode):
            raise ValueError(f"tp_mode must be a muon_compile.config.TPMode, got {self.tp_mode!r}")
        if self.prefetch < 0:
            raise ValueError(f"MUON_COMPILE_PREFETCH must be >= 0, got {self.prefetch!r}")
        if not 0.0 <= self.pad_waste < 1.0:
            raise ValueError(f"MUON_COMPILE_PAD_WASTE must be in [0, 1), got {self.pad_waste!r}")
        check_algorithm(self.ns_algorithm, "MUON_COMPILE_NS_ALGORITHM")
        Policy.check(self.sym_products, "MUON_COMPILE_SYM_PRODUCTS")
        Policy.check(self.ns_epilogue, "MUON_COMPILE_NS_EPILOGUE")
        Policy.check(self.ns_orientation, "MUON_COMPILE_NS_ORIENTATION")
        cpu_profile(self.cpu_rates)
        if self.cpu_heap_mb < 0:
            raise ValueError(f"MUON_COMPILE_CPU_HEAP_MB must be >= 0, got {self.cpu_heap_mb!r}")
        if not self.agree_timeout >= 0:
            raise ValueError(f"MUON_COMPILE_AGREE_TIMEOUT must be >= 0 seconds, got {self.agree_timeout!r}")
        if self.passes is not None and (unknown := [p for p in self.passes if p not in pass_names()]):
            raise ValueError(f"unknown pass name(s) {unknown}; known passes: {pass_names()}")
        if self.dump_dir is not None:
            _make_dump_dir(self.dump_dir)

    def enabled(self, pass_name: str) -> bool:
        """Whether the pass called ``pass_name`` runs."""
        if pass_name not in pass_names():
            raise ValueError(f"unknown pass name {pass_name!r}; known passes: {pass_names()}")
        return self.passes is None or pass_name in self.passes

    def cache_key(self) -> tuple:
        """The fields that change what the passes produce (:data:`PLAN_FIELDS`; the dump
        directory, the tracing helpers, the explanation and the agreement timeout do not)."""
        return tuple(self._plan_value(field) for field, _ in PLAN_FIELDS)

    def plan_settings(self) -> list[tuple[str, str]]:
        """``(variable, value)`` of each field of :data:`PLAN_FIELDS`, the value spelled as
        in the environment (``("MUON_COMPILE_BUCKET_MB", "64")``)."""
        return [(name, _spelling(self._plan_value(field))) for field, name in PLAN_FIELDS]

    def _plan_value(self, field: str) -> object:
        if field == "passes" and self.passes is None:
            return pass_names()
        if field == "cpu_rates":  # the profile itself: "auto" names a different one on another CPU
            return cpu_profile(self.cpu_rates)
        return getattr(self, field)


def _make_dump_dir(path: str) -> None:
    """Create the dump directory ``path`` (and its parents) unless it exists; ``ValueError``
    naming MUON_COMPILE_DUMP_DIR where it cannot be made or written into, so a bad path fails
    where it is read, not in the first compile."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"MUON_COMPILE_DUMP_DIR={path!r} is a file, not a directory for the graph dumps")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:  # a file in its path, a folder where none can be created
        raise ValueError(f"MUON_COMPILE_DUMP_DIR={path!r}: the directory for the graph dumps cannot be created ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"MUON_COMPILE_DUMP_DIR={path!r} is a directory this process cannot write into")


def _spelling(value: object) -> str:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def parse_passes(spec: str) -> tuple[str, ...]:
    """``"a,b"`` keeps only a and b; ``"-a"`` keeps all but a; empty keeps all."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    removed = {n[1:] for n in names if n.startswith("-")}
    kept = [n for n in names if not n.startswith("-")]
    if kept and removed:
        raise ValueError(
            f"MUON_COMPILE_PASSES={spec!r} mixes kept and removed ('-') names; use one form"
        )
    known = pass_names()
    unknown = sorted((removed | set(kept)) - set(known))
    if unknown:
        raise ValueError(
            f"MUON_COMPILE_PASSES={spec!r} names unknown pass(es) {unknown}; known: {known}"
        )
    if kept:
        return tuple(p for p in known if p in kept)
    return tuple(p for p in known if p not in removed)


def _names(spec: str) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")``."""
    return tuple(n.strip() for n in spec.split(",") if n.strip())


def _number(env: Mapping[str, str], name: str, kind: type, default: float | int) -> float | int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r} is not a flag; use 1 or 0")


def from_env(env: Mapping[str, str] | None = None) -> Config:
    """Parse a :class:`Config` from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    return Config(
        bucket_mb=_number(env, "MUON_COMPILE_BUCKET_MB", float, Config.bucket_mb),
        strategy=Strategy.parse(env.get("MUON_COMPILE_STRATEGY", "").strip() or Config.strategy),
        tp_mode=TPMode.parse(env.get("MUON_COMPILE_TP_MODE", "").strip() or Config.tp_mode),
        tp_dims=_names(env.get("MUON_COMPILE_TP_DIMS", "")) or Config.tp_dims,
        prefetch=_number(env, "MUON_COMPILE_PREFETCH", int, Config.prefetch),
        pad_waste=_number(env, "MUON_COMPILE_PAD_WASTE", float, Config.pad_waste),
        ns_algorithm=env.get("MUON_COMPILE_NS_ALGORITHM", "").strip() or Config.ns_algorithm,
        sym_products=env.get("MUON_COMPILE_SYM_PRODUCTS", "").strip() or Config.sym_products,
        ns_epilogue=env.get("MUON_COMPILE_NS_EPILOGUE", "").strip() or Config.ns_epilogue,
        ns_orientation=env.get("MUON_COMPILE_NS_ORIENTATION", "").strip() or Config.ns_orientation,
        cpu_rates=env.get("MUON_COMPILE_CPU_RATES", "").strip() or Config.cpu_rates,
        passes=parse_passes(spec) if (spec := env.get("MUON_COMPILE_PASSES", "")) else None,
        dump_dir=env.get("MUON_COMPILE_DUMP_DIR") or None,
        trace_helpers=_flag(env, "MUON_COMPILE_TRACE_HELPERS", Config.trace_helpers),
        explain=_flag(env, "MUON_COMPILE_EXPLAIN", Config.explain),
        cpu_heap_mb=_number(env, "MUON_COMPILE_CPU_HEAP_MB", int, Config.cpu_heap_mb),
        agree_timeout=_number(env, "MUON_COMPILE_AGREE_TIMEOUT", float, Config.agree_timeout),
    )


_current: Config | None = None


def current() -> Config:
    """The active configuration: the environment, read on first use, or an override."""
    global _current
    if _current is None:
        _current = from_env()
    return _current


@contextlib.contextmanager
def override(**changes: object) -> Iterator[Config]:
    """Temporarily replace fields of the active configuration, e.g. ``override(pad_waste=0.2)``
    (``passes``, ``strategy``, ``tp_mode`` and ``tp_dims`` may be given as their
    environment-variable spelling)."""
    global _current
    previous = current()
    if isinstance(changes.get("passes"), str):
        changes["passes"] = parse_passes(changes["passes"])  # type: ignore[arg-type]
    if "strategy" in changes:
        changes["strategy"] = Strategy.parse(changes["strategy"])  # type: ignore[arg-type]
    if "tp_mode" in changes:
        changes["tp_mode"] = TPMode.parse(changes["tp_mode"])  # type: ignore[arg-type]
    if isinstance(changes.get("tp_dims"), str):
        changes["tp_dims"] = _names(changes["tp_dims"])  # type: ignore[arg-type]
    _current = dataclasses.replace(previous, **changes)  # type: ignore[arg-type]
    try:
        yield _current
    finally:
        _current = previous
