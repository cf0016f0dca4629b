"""``compile_step(opt)``: the optimizer's own ``step`` becomes the compiled one, for every caller.

Trainers call ``optimizer.step()`` on the object they were given (Hugging Face ``Trainer``
through accelerate, Lightning with a closure, ``torch.amp.GradScaler.step(optimizer)``, a loop
with a ``torch.optim.lr_scheduler``), so the compiled step has to be ``opt.step`` itself:

    muon_compile.compile_step(opt)            # then opt.step() runs the compiled step
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, ...)   # before or after: both work

What ``opt.step`` is afterwards, and what the rest of ``torch.optim`` sees:

* a bound method of ``opt`` (``opt.step.__func__``, ``opt.step.__self__``), so an
  ``lr_scheduler`` built later wraps it as it wraps any optimizer's; one built earlier had
  wrapped the old step, and the new one is wrapped the same way (the scheduler's "step
  called" tracking, its ``_wrapped_by_lr_sched`` mark), so neither warns;
* the step pre- and post-hooks (``register_step_pre_hook`` / ``register_step_post_hook``, the
  global ones) and the profiler's ``Optimizer.step#...`` range run around it eagerly, by
  ``torch.optim.Optimizer.profile_hook_step`` as for the uncompiled step: Dynamo never sees them;
* ``step(closure)``: the closure (forward and backward) runs eagerly, under grad mode, before the
  compiled update, and its loss is returned; the update is compiled without it, so a trainer's
  closure is never traced (other keyword arguments, e.g. ``qk_logits``, go to the update);
* the update is entered in the grad mode it runs in (``torch.optim``'s steps disable grad
  unless ``differentiable``), so a call under ``torch.no_grad()`` reuses the graph;
* the optimizer's state is untouched: ``state_dict`` / ``load_state_dict`` and
  ``torch.distributed.checkpoint`` (``get_optimizer_state_dict`` / ``set_optimizer_state_dict``,
  nested or flattened) see the optimizer as before; a fresh ``torch.optim.Muon`` gets its state
  from ``set_optimizer_state_dict``'s zero-lr step, through the compiled step, and recompiles once
  after the load replaces its state tensors (as ``torch.compile(opt.step)`` does; ``MuonAdamW``
  loads into its stacks in place and does not); ``copy.deepcopy`` and ``pickle``
  copy what the optimizer's ``__getstate__`` names (``torch.optim``'s: defaults, state and param
  groups; ``MuonAdamW``'s: all but the instance ``step``), so a copy is an uncompiled optimizer:
  call ``compile_step`` on it to compile it too.

``compile_step`` again on the same optimizer does nothing (one compile); :func:`uncompile_step`
gives the optimizer back the step it had. ``torch.compile`` arguments pass through
(``options=``, ``mode="reduce-overhead"`` for the CUDA graph, ``dynamic=False``; ``backend``
is ``"muon"`` unless given); ``dynamic=True`` is refused (the passes bucket static shapes).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

_COMPILED = "_muon_compile_step"  # the compiled update, in the optimizer's __dict__
_REPLACED = "_muon_compile_replaced"  # the instance's own ``step`` before, if it had one


def compile_step(opt: torch.optim.Optimizer, **compile_kwargs: Any) -> torch.optim.Optimizer:
    """Make ``opt.step`` the step of ``opt``'s class compiled with ``torch.compile(...,
    backend="muon", **compile_kwargs)`` (see the module docstring); return ``opt``."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"compile_step takes a torch.optim.Optimizer, got {type(opt).__name__}")
    if compile_kwargs.get("dynamic") is True:
        raise ValueError(
            "compile_step(dynamic=True) is refused: the muon backend buckets matrices of static shapes; "
            "leave dynamic unset or pass dynamic=False"
        )
    current = opt.__dict__.get("step")
    if current is not None:
        if _is_compiled(current):
            return opt
        if not getattr(current, "_wrapped_by_lr_sched", False):
            raise ValueError(
                f"{type(opt).__name__}.step was replaced on this optimizer by {current!r}; compile_step compiles "
                "the optimizer's own step: call it before replacing step, or on an optimizer whose step is its class's"
            )
    compile_kwargs.setdefault("backend", "muon")
    opt.__dict__[_COMPILED] = torch.compile(_update_of(opt), **compile_kwargs)
    opt.__dict__[_REPLACED] = current
    step = types.MethodType(_HOOKED_STEP, opt)
    opt.step = _tracked_like(current, opt, step)  # type: ignore[method-assign]
    return opt


def uncompile_step(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Give ``opt`` back the step it had before :func:`compile_step` (a no-op if it has none); return ``opt``."""
    if _COMPILED not in opt.__dict__:
        return opt
    del opt.__dict__[_COMPILED]
    previous = opt.__dict__.pop(_REPLACED)
    if previous is None:
        del opt.__dict__["step"]
    else:
        opt.__dict__["step"] = previous
    return opt


def without_compiled_step(attributes: dict) -> dict:
    """An optimizer's ``attributes`` (its ``__dict__``) without its instance ``step`` (this
    module's, or a scheduler's wrapper: each bound to this optimizer, not to a copy) and the
    compiled update: what a copy of it holds (``MuonAdamW.__getstate__``), as
    ``torch.optim.Optimizer.__getstate__`` leaves them out."""
    return {k: v for k, v in attributes.items() if k not in ("step", _COMPILED, _REPLACED)}


def _update_of(opt: torch.optim.Optimizer) -> Callable[..., Any]:
    """``opt``'s class ``step`` bound to ``opt``, without ``Optimizer``'s hook wrapper
    (``profile_hook_step``, which marks the class attribute ``hooked``): the hooks run outside."""
    step = type(opt).step
    if getattr(step, "hooked", False):
        step = step.__wrapped__
    return step.__get__(opt, type(opt))


def _step(self: torch.optim.Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
    """The compiled optimizer's step: the closure eagerly, then the compiled update."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    # entered in the grad mode the update runs in (torch.optim's steps set it themselves), so a
    # caller under torch.no_grad() (set_optimizer_state_dict's zero-lr step) reuses the graph
    # instead of recompiling on Dynamo's grad-mode guard
    with torch.set_grad_enabled(bool(self.defaults.get("differentiable", False))):
        self.__dict__[_COMPILED](**kwargs)
    return loss


# the hooks and the profiler range around the step, as torch.optim wraps every optimizer's step
_HOOKED_STEP = torch.optim.Optimizer.profile_hook_step(_step)


def _is_compiled(step: Any) -> bool:
    """Whether ``step`` (an optimizer's instance ``step``) is this module's, maybe inside a
    scheduler's wrapper."""
    while step is not None:
        if step is _HOOKED_STEP or getattr(step, "__func__", None) is _HOOKED_STEP:
            return True
        step = getattr(step, "__wrapped__", None)
    return False


def _tracked_like(previous: Any, opt: torch.optim.Optimizer, step: types.MethodType) -> Any:
    """``step`` as an ``lr_scheduler`` built before would have wrapped it (``previous`` is its
    wrapper of the old step): it marks the optimizer's step called, as the scheduler checks;
    ``step`` itself where no scheduler had wrapped the old one (a later one wraps it)."""
    if previous is None:
        return step

    def tracked(*args: Any, **kwargs: Any) -> Any:
        opt._opt_called = True  # type: ignore[attr-defined]  # what torch.optim.lr_scheduler's wrapper records
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    tracked.__wrapped__ = step  # type: ignore[attr-defined]
    return tracked
