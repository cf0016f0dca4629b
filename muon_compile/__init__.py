"""muon_compile: a torch.compile backend (``backend="muon"``) that turns a plain
per-parameter Muon step into a bucketed, fully Inductor-compiled one.

    opt = muon_compile.MuonAdamW(muon_compile.muon_param_groups(model))
    muon_compile.compile_step(opt)   # opt.step() is now the compiled step, for every caller
"""

from . import config
from .compile import tracing
from .compile.compile_step import compile_step, uncompile_step
from .diagnostics.counters import counters
from .distributed.rank_agreement import RankDivergenceError
from .ns.coefficients import PRESETS
from .ns.op import newton_schulz
from .optim.optimizers import Muon, MuonAdamW
from .optim.param_groups import muon_param_groups
from .optim.qk_clip import QKClip, QKClipLayer

__all__ = [
    "PRESETS",
    "Muon",
    "MuonAdamW",
    "QKClip",
    "QKClipLayer",
    "RankDivergenceError",
    "compile_step",
    "config",
    "counters",
    "muon_param_groups",
    "newton_schulz",
    "uncompile_step",
]
__version__ = "0.1.0"

tracing.install(config.current().trace_helpers)
