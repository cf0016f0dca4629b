"""Corpus entry ``dion_megabatch``: the Muon of microsoft/dion as released now, after the
mega-batching rewrite (6eacfe1, 2026-04-02, "Migrate Muon to DistributedOrthoBase with
megabatching"). Its step still gives the async runtime Python generators, now one task per
(shape, sharding, dtype) group: the group's updates are stacked and orthogonalised by one
Polar Express call (the default NS since that rewrite), so one loop per shape.
tests/support/published/dion_generator.py keeps the step as it was before (one task per matrix).

Read: microsoft/dion@0a059a4542e5aa74b40dcd1dce363836c7afcd48 (HEAD, 2026-08-07)
  dion/muon.py:61-110 (constructor: checks, group defaults), 112-191 (``_create_ortho_tasks``:
      one task per same-shape group), 194-280 (``muon_update_megabatch_async``, the task's
      generator), 283-311 (``muon_update_pre_orthogonalize``), 314-347
      (``muon_update_post_orthogonalize``)
  dion/megabatch_base.py:31-137 (``DistributedOrthoBase.__init__``: mesh 45-68, NS choice
      70-112, state and hyperparameter tensors made at construction 127-137), 139-154 (state
      pre-population, ``add_param_group``), 156-196 (``step``), 198-216
      (``_get_or_initialize_state``), 218-242 and 244-286 (the ``num_heads`` /
      ``split_sizes`` resolvers), 366-415 (``_get_shard_info``), 417-511 (``_live_hyperparams``,
      ``_ensure_hyperparam_tensor``, ``_sync_hyperparam_tensors``), 579-632 (Lion / AdamW task
      builders), 635-881 (``megabatch_orthogonalize_async``: ``_finalize`` 698-702, padding
      704-711, the two distributed branches 713-857, the single-device branches 859-881),
      884-908 (``muon_update_newton_schulz``), 984-1002 (lr adjustments)
  dion/polar_express.py:10-16 (coefficients), 19-50 (``polar_express``, chosen by
      megabatch_base.py:102-103 for the defaults use_polar_express=True, use_triton=False,
      no newton_schulz_func, no Gram NS)
  dion/opt_utils.py:14-23 (``as_scalar_tensor``), 26-33 (``to_local``), 97-115 (``AsyncTask``),
      118-163 (``AsyncRuntime``)

Reproduced exactly: an ``Optimizer`` subclass whose constructor makes every parameter's
momentum and the group's lr as a persistent 0-D float32 tensor on the parameters' device
(``_sync_hyperparam_tensors``, also the first thing each step does: a no-op once the tensor is
in place); ``@torch.no_grad()`` on ``step``, its closure, the ``+= 1`` on the group's step
count; groups sorted by algorithm into three task generators, joined with ``itertools.chain``,
driven by the runtime with at most 3 concurrent tasks (a task advances its generator when
built; the runtime builds at most one task and advances every earlier live task once per
round); per group and step ``torch.tensor`` of mu and epsilon, ``as_scalar_tensor`` of the
(float) weight decay, the lr tensor itself; the same-shape grouping keyed by (shape,
sharding, dtype); ``to_local`` on the lists (a new list each call); the task as a generator
function that gets its orthogonalised list through ``U = yield from`` a second generator,
whose only ``yield`` statements are in its distributed branches, so on one device both
finish within the task's first ``next``; that generator's single-device branches (one
matrix: NS of ``U[0]`` then ``unsqueeze(0)``; several: ``torch.stack(U)``, NS of the stack)
and its ``_finalize`` closure (slice to N, ``list(unbind(0))``); the two
``@torch.compile(fullgraph=True)`` helpers (foreach momentum with ``U = M`` without Nesterov
and the bf16 cast ahead of communication; foreach decay and update, cautious path present);
the flatten reshaping around the NS call; ``@torch.compile(dynamic=False, fullgraph=True)``
Polar Express with its five per-iteration triples, ``G.bfloat16()``, no transpose (a tall
iterate multiplied from the right), ``X / (norm * 1.02 + epsilon)``; the spectral lr
``lr * sqrt(fan_out / fan_in)`` on the 0-D lr tensor.
Upstream defaults: no Nesterov, lr rule "spectral_norm", no flatten, epsilon 1e-8, no
cautious decay; lr LR, mu MOMENTUM and weight decay WD (a float: not a live tensor) of
tests/support/muon_corpus.py.

Omitted (distributed plumbing, options not taken): DeviceMesh / ProcessGroup set-up (a mesh
raises ``NotImplementedError``); DTensor shard detection past its plain-tensor early return;
the padding for collectives and both distributed branches of the orthogonalisation (shard
all-to-all, one-shard-per-rank all-gather), each replaced by a ``NotImplementedError`` (the
last two followed by an unreachable ``yield`` that keeps the function a generator); the DTensor
type check of the sharded path in the task; the ``num_heads`` and ``split_sizes`` options (a
set option raises); the Lion and AdamW task builders (no such groups: empty generators);
the NS choices other than the default (user function, Gram NS, Triton, quintic NS: raise);
the CUDA-graph capture check in ``_ensure_hyperparam_tensor`` (reached only when the lr is
not yet the tensor, never under capture here); ``state_dict`` / ``load_state_dict``. The NS
routine hard-codes bf16, as upstream's does: the entry's ``dtype`` is not used, and the
exact evaluation makes its casts fp64 (``numerics.exact_step``).
"""

import math
from collections import defaultdict
from itertools import chain

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from muon_corpus import LR, MOMENTUM, WD, Entry
from published.dion_generator import _Runner, _Task, _post, _pre


# ------------------------------------------------------------------------- opt_utils

def _scalar_tensor(value):
    """A group hyperparameter for the kernels: a tensor as it is, a number as a new 0-D tensor."""
    return value if isinstance(value, Tensor) else torch.tensor(value)


def _local(tensor):
    """DTensors to their local shards; plain tensors unchanged, a list into a new list."""
    if isinstance(tensor, Tensor):
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensor]


# opt_utils.py's AsyncTask and AsyncRuntime (_Task, _Runner), and muon.py's two compiled helpers
# (_pre, _post): unchanged since d53bd2d, as tests/support/published/dion_generator.py has them


# ---------------------------------------------------------------------- polar_express.py

_PE_COEFFS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]


@torch.compile(dynamic=False, fullgraph=True)
def _polar_express(G, epsilon=1e-6):
    assert G.ndim >= 2
    X = G.bfloat16()
    tall = G.size(-2) > G.size(-1)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + epsilon)
    if tall:
        for a, b, c in _PE_COEFFS:
            A = X.mT @ X
            B = b * A + c * (A @ A)
            X = a * X + X @ B
    else:
        for a, b, c in _PE_COEFFS:
            A = X @ X.mT
            B = b * A + c * (A @ A)
            X = a * X + B @ X
    return X


# --------------------------------------------------------------------- megabatch_base.py

def _orthogonalize_megabatch(U, comm_dim, device_rank, world_size, process_group, newton_schulz_func,
                             flatten, epsilon, global_comm_dim_size, split_sizes=None, split_scales=None,
                             return_stacked=False):
    """Generator function returning the orthogonalised list; ``yield`` only on distributed paths."""
    N = len(U)

    def _finalize(flat):
        flat = flat[:N]
        return flat if return_stacked else list(flat.unbind(0))

    if process_group is not None and (N > 1 or comm_dim is not None):
        raise NotImplementedError("padding the batch for the collectives")
    else:
        U_work = U  # noqa: F841 - upstream names it here; only the distributed branches read it

    if comm_dim is not None and process_group is not None:
        # sharded: all-to-all of shards, NS of full matrices, all-to-all back (not reproduced)
        raise NotImplementedError("sharded all-to-all path")
        yield
    elif N > 1 and process_group is not None:
        # unsharded: NS of this rank's share of the stack, all-gather (not reproduced)
        raise NotImplementedError("per-rank all-gather path")
        yield
    elif N == 1:
        out = _ns_call(U[0], newton_schulz_func=newton_schulz_func, flatten=flatten, epsilon=epsilon,
                       split_sizes=split_sizes, split_scales=split_scales)
        return _finalize(out.unsqueeze(0))
    else:
        # several matrices, no process group (one device, or batch-sharded 3-D)
        stacked = torch.stack(U)
        stacked = _ns_call(stacked, newton_schulz_func=newton_schulz_func, flatten=flatten, epsilon=epsilon,
                           split_sizes=split_sizes, split_scales=split_scales)
        return _finalize(stacked)


def _ns_call(X, newton_schulz_func, flatten, epsilon, split_sizes=None, split_scales=None):
    if split_sizes is not None:
        raise NotImplementedError("split_sizes (row blocks orthogonalised apart)")
    shape = X.shape
    if flatten and X.ndim >= 3:
        X = X.flatten(start_dim=1)
    elif X.ndim >= 4:
        X = X.flatten(end_dim=-3)
    return newton_schulz_func(X, epsilon=epsilon).reshape(shape)


def _lr_rms_norm(lr, shape, flatten):
    if flatten:
        rows = shape[0]
        cols = math.prod(shape[1:])
    else:
        rows, cols = shape[-2:]
    return lr * (0.2 * math.sqrt(max(rows, cols)))


def _lr_spectral_norm(lr, shape, flatten):
    if flatten:
        rows = shape[0]
        cols = math.prod(shape[1:])
    else:
        rows, cols = shape[-2:]
    return lr * math.sqrt(rows / cols)


class _OrthoBase(Optimizer):
    """dion's ``DistributedOrthoBase`` on one device (no mesh)."""

    def __init__(self, params, distributed_mesh, algo_name, defaults, use_gram_newton_schulz=False,
                 use_triton=False, use_polar_express=True, newton_schulz_func=None):
        super().__init__(params, defaults)
        self._algo_name = algo_name
        if distributed_mesh is None:
            self._device_rank = 0
            self._world_size = 1
            self._process_group = None
        else:
            raise NotImplementedError("DeviceMesh / ProcessGroup set-up")
        self._distributed_mesh = distributed_mesh

        if newton_schulz_func is not None:
            raise NotImplementedError("a user Newton-Schulz function")
        elif use_gram_newton_schulz:
            raise NotImplementedError("gram-newton-schulz")
        elif use_polar_express and use_triton:
            raise NotImplementedError("Triton Polar Express")
        elif use_polar_express:
            self._newton_schulz_func = _polar_express
        elif use_triton:
            raise NotImplementedError("Triton Newton-Schulz")
        else:
            raise NotImplementedError("zeropower_via_newtonschulz5 (not the default)")

        self._state_prepopulated = False
        self._hyperparam_tensors = {}
        self._live_by_group = {}
        for group in self.param_groups:
            self._prepopulate_group_state(group)
        self._sync_hyperparam_tensors()
        self._state_prepopulated = True

    def _prepopulate_group_state(self, group):
        algo = group["algorithm"]
        for p in group["params"]:
            self._get_or_initialize_state(p, algo)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if getattr(self, "_state_prepopulated", False):
            index = len(self.param_groups) - 1
            for name in self._live_hyperparams(index):
                self._ensure_hyperparam_tensor(index, name)
            self._prepopulate_group_state(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        self._sync_hyperparam_tensors()

        ortho_groups, lion_groups, adamw_groups = [], [], []
        for group in self.param_groups:
            group["step"] += 1
            algo = group["algorithm"]
            if algo == self._algo_name:
                ortho_groups.append(group)
            elif algo == "lion":
                lion_groups.append(group)
            elif algo == "adamw":
                adamw_groups.append(group)
            else:
                raise ValueError(f"unrecognised algorithm: {algo}")

        ortho_tasks = self._create_ortho_tasks(ortho_groups)
        lion_tasks = self._create_lion_tasks(lion_groups)
        adamw_tasks = self._create_adamw_tasks(adamw_groups)

        all_tasks = chain(ortho_tasks, lion_tasks, adamw_tasks)
        runtime = _Runner(all_tasks, 3)
        runtime.run()
        return loss

    def _get_or_initialize_state(self, param, algo):
        state = self.state[param]
        if not state:
            state["momentum"] = torch.zeros_like(param)
            if algo == "adamw":
                state["variance"] = torch.zeros_like(param)
        if algo == "adamw" and "step_dev" not in state:
            state["step_dev"] = torch.zeros((), dtype=torch.float32, device=_local(param).device)
        return state

    def _resolve_num_heads(self, group):
        if group.get("num_heads") is None:
            return None
        raise NotImplementedError("num_heads (per-head Newton-Schulz)")

    def _resolve_split_sizes(self, group):
        if group.get("split_sizes") is None:
            return None
        raise NotImplementedError("split_sizes (row blocks orthogonalised apart)")

    def _get_shard_info(self, param, group):
        is_batch_sharded = False
        is_matrix_sharded = False
        sharded_tensor_dim = None
        if not isinstance(param, DTensor):
            return is_batch_sharded, is_matrix_sharded, sharded_tensor_dim
        raise NotImplementedError("DTensor shard detection")

    def _live_hyperparams(self, index):
        """``lr`` always; ``weight_decay`` too once the group has held a tensor (latching)."""
        live = self._live_by_group.get(index)
        if live is None or "weight_decay" not in live:
            if isinstance(self.param_groups[index].get("weight_decay"), Tensor):
                live = ("lr", "weight_decay")
            elif live is None:
                live = ("lr",)
            self._live_by_group[index] = live
        return live

    def _ensure_hyperparam_tensor(self, index, name):
        """The group's persistent 0-D float32 tensor for ``name`` on its parameters' device, made
        once and afterwards only filled, put back into the group; None for an empty group."""
        group = self.param_groups[index]
        params = group["params"]
        if not params:
            return None
        value = group[name]
        tensor = self._hyperparam_tensors.get((index, name))
        if value is tensor:
            return tensor
        # upstream: a RuntimeError here while a CUDA stream is capturing (not reproduced)
        device = _local(params[0]).device
        if tensor is None or tensor.device != device:
            tensor = torch.empty((), dtype=torch.float32, device=device)
            self._hyperparam_tensors[(index, name)] = tensor
        if isinstance(value, Tensor):
            tensor.copy_(value)
        else:
            tensor.fill_(value)
        group[name] = tensor
        return tensor

    def _sync_hyperparam_tensors(self):
        for index in range(len(self.param_groups)):
            for name in self._live_hyperparams(index):
                self._ensure_hyperparam_tensor(index, name)

    def _create_ortho_tasks(self, param_groups):
        raise NotImplementedError

    def _create_lion_tasks(self, param_groups):
        """Placeholder for the Lion task builder (never given groups here)."""
        for group in param_groups:
            raise NotImplementedError(group["algorithm"])
        yield from ()

    def _create_adamw_tasks(self, param_groups):
        """Placeholder for the AdamW task builder (never given groups here)."""
        for group in param_groups:
            raise NotImplementedError(group["algorithm"])
        yield from ()


# ----------------------------------------------------------------------------- muon.py

class _Muon(_OrthoBase):
    def __init__(self, params, distributed_mesh=None, lr=0.01, mu=0.95, betas=(0.9, 0.95),
                 weight_decay=0.01, cautious_wd=False, epsilon=1e-8, nesterov=False,
                 adjust_lr="spectral_norm", flatten=False, use_gram_newton_schulz=False,
                 use_triton=False, use_polar_express=True, newton_schulz_func=None):
        if lr < 0.0:
            raise ValueError(f"bad learning rate: {lr}")
        if mu < 0.0:
            raise ValueError(f"bad momentum factor: {mu}")
        if len(betas) != 2 or betas[0] < 0.0 or betas[1] < 0.0:
            raise ValueError(f"bad betas: {betas}")
        if adjust_lr not in ("spectral_norm", "rms_norm", None):
            raise ValueError(f"bad adjust_lr: {adjust_lr}")
        defaults = dict(lr=lr, mu=mu, beta1=betas[0], beta2=betas[1], weight_decay=weight_decay,
                        cautious_wd=cautious_wd, algorithm="muon", step=0, epsilon=epsilon,
                        nesterov=nesterov, flatten=flatten, adjust_lr=adjust_lr)
        super().__init__(params, distributed_mesh, "muon", defaults,
                         use_gram_newton_schulz=use_gram_newton_schulz, use_triton=use_triton,
                         use_polar_express=use_polar_express, newton_schulz_func=newton_schulz_func)

    def _create_ortho_tasks(self, param_groups):
        """One task per (shape, sharding, dtype) group of each param group."""
        for group in param_groups:
            assert group["algorithm"] == "muon"
            assert all(p.ndim >= 2 for p in group["params"]), "only matrices are supported"

            group_params = [p for p in group["params"] if p.grad is not None]
            if not group_params:
                continue

            update_args = dict(
                lr=group["lr"],
                momentum=torch.tensor(group["mu"]),
                weight_decay=_scalar_tensor(group["weight_decay"]),
                epsilon=torch.tensor(group["epsilon"]),
                nesterov=group["nesterov"],
                flatten=group["flatten"],
                adjust_lr=group["adjust_lr"],
                device_rank=self._device_rank,
                world_size=self._world_size,
                process_group=self._process_group,
                newton_schulz_func=self._newton_schulz_func,
                cautious_wd=group["cautious_wd"],
            )

            shape_groups = defaultdict(list)
            for p in group_params:
                sharding = p.placements if isinstance(p, DTensor) else None
                shape_groups[(p.shape, sharding, p.dtype)].append(p)

            num_heads = self._resolve_num_heads(group)
            split_sizes = self._resolve_split_sizes(group)

            for (_shape, _sharding, _dtype), params in shape_groups.items():
                gradients = [p.grad for p in params]
                states = [self._get_or_initialize_state(p, "muon") for p in params]
                momentums = [s["momentum"] for s in states]

                split_args = {}
                if split_sizes is not None:
                    raise NotImplementedError("split_sizes")

                if num_heads is not None:
                    raise NotImplementedError("num_heads")
                else:
                    is_batch_sharded, is_matrix_sharded, sharded_tensor_dim = self._get_shard_info(params[0], group)
                    megabatch_args = update_args
                    if is_batch_sharded and not is_matrix_sharded:
                        megabatch_args = {**update_args, "process_group": None}
                    shard_dim = sharded_tensor_dim

                yield _Task(
                    _muon_megabatch(
                        X=params,
                        G=gradients,
                        M=momentums,
                        shard_dim=shard_dim,
                        **split_args,
                        **megabatch_args,
                    )
                )


def _muon_megabatch(X, G, M, lr, momentum, weight_decay, epsilon, nesterov, flatten, adjust_lr,
                    device_rank, world_size, shard_dim=None, process_group=None, newton_schulz_func=None,
                    cautious_wd=False, split_sizes=None, split_scales=None):
    """Generator function: one same-shape group's momentum, stacked NS and update."""
    N = len(X)
    assert N == len(G) == len(M)

    U = _pre(_local(G), _local(M), momentum, nesterov)  # muon_update_pre_orthogonalize

    comm_dim = (shard_dim - X[0].ndim) if shard_dim is not None else None
    if comm_dim is not None:
        raise NotImplementedError("sharded path (the DTensor's global size)")
    else:
        global_comm_dim_size = None

    U = yield from _orthogonalize_megabatch(
        U,
        comm_dim=comm_dim,
        device_rank=device_rank,
        world_size=world_size,
        process_group=process_group,
        newton_schulz_func=newton_schulz_func,
        flatten=flatten,
        epsilon=epsilon,
        global_comm_dim_size=global_comm_dim_size,
        split_sizes=split_sizes,
        split_scales=split_scales,
    )

    if adjust_lr is None:
        adjusted_lr = lr
    elif adjust_lr == "spectral_norm":
        adjusted_lr = _lr_spectral_norm(lr, X[0].shape, flatten=flatten)
    elif adjust_lr == "rms_norm":
        adjusted_lr = _lr_rms_norm(lr, X[0].shape, flatten=flatten)
    else:
        raise ValueError(f"unrecognised adjust_lr: {adjust_lr}")

    _post(_local(X), U, lr, adjusted_lr, weight_decay, cautious_wd)  # muon_update_post_orthogonalize


def dion_megabatch(params, dtype):
    """dion's current Muon step on a single device: one async task per same-shape group, its
    members stacked into one Polar Express call (``dtype`` unused: the NS is bf16, as upstream's)."""
    opt = _Muon(params, lr=LR, mu=MOMENTUM, weight_decay=WD)
    return opt.step


ENTRY = Entry("dion_megabatch",
              "microsoft/dion@0a059a4 dion/muon.py + dion/megabatch_base.py + dion/polar_express.py "
              "(one async task per same-shape group, stacked)",
              "distributed library", dion_megabatch, torch.bfloat16, stacks=True,
              graphs=2)  # the state made at the first step, the group's step a Python int
