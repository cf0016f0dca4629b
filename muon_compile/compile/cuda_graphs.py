"""A compiled step replayed as a CUDA graph when one is asked for (``mode="reduce-overhead"``
or ``options={"triton.cudagraphs": True}``), with hyper-parameters that can change every step.

Inductor hands a 0-D CPU tensor that a GPU kernel reads to that kernel as a value, read on
the host when the kernel is launched (``GraphLowering.is_unspec_arg``). A captured graph
launches nothing on replay: it would keep the value it was captured with. The optimizers'
hyper-parameters (``lr``, ``momentum``, ...) are such tensors (0-D, on the CPU, changed in
place by a learning-rate scheduler), in this package's optimizers and in any Muon that
keeps them as tensors, so a captured step would go on with its first learning rate.

So, when a CUDA graph is asked for by a step on CUDA, the 0-D CPU tensors the graph only
reads are *lifted*: the step is compiled with them on the GPU, and each call copies their
current values there first (one host-to-device copy per dtype, then the graph's own copy of
its non-static inputs into the captured addresses). The replay reads this step's values.

A 0-D CPU tensor the graph writes (a step counter kept on the CPU, ``count += 1``) cannot
be lifted: its new value must land on the CPU. Nor can any when the graph returns a CPU
tensor. Then the step is compiled without a CUDA graph and the warning names the tensors
(this package's optimizers keep their counters on the parameters' device, so they do not
hit this). A step whose tensors are not on CUDA cannot be captured at all: it is compiled
as asked (Inductor leaves the CUDA graph out) and says so once per process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from ..diagnostics import explain
from ..passes.fx_writes import flat_nodes, storage_of, written_args

OPTION = "triton.cudagraphs"

@dataclasses.dataclass(frozen=True)
class Lift:
    """Graph inputs (by position, grouped by dtype: one copy per group) compiled on ``device``
    and copied there at every call."""

    groups: tuple[tuple[int, ...], ...]
    device: torch.device

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(sorted(i for group in self.groups for i in group))

    @classmethod
    def of(cls, positions: Sequence[int], example_inputs: Sequence[Any], device: torch.device) -> Lift:
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i in positions:
            by_dtype.setdefault(example_inputs[i].dtype, []).append(i)
        return cls(tuple(map(tuple, by_dtype.values())), device)

    def inputs(self, example_inputs: Sequence[Any]) -> list[Any]:
        """``example_inputs`` with the lifted ones on the device: what the step is compiled for."""
        lifted = list(example_inputs)
        for i in self.positions:
            lifted[i] = example_inputs[i].to(self.device)
        return lifted

    def wrap(self, compiled: Callable) -> Callable:
        """``compiled`` (compiled for :meth:`inputs`), called with the original inputs."""

        def run(*args: Any) -> Any:
            inputs = list(args)
            for positions in self.groups:  # Dynamo's guards keep each input's dtype
                values = torch.stack([inputs[i] for i in positions]).to(self.device).unbind()
                for i, value in zip(positions, values):
                    inputs[i] = value
            return compiled(*inputs)

        run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
        return run


def cpu_scalars(example_inputs: Sequence[Any]) -> list[int]:
    """Positions of the graph inputs that are 0-D CPU tensors."""
    return [
        i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type == "cpu"
    ]


def decide(gm: fx.GraphModule, patches: dict[str, Any], example_inputs: Sequence[Any]) -> Lift | None:
    """Whether ``patches``' CUDA graph (if asked for) can be kept (see the module docstring):
    the lift to apply, or None; a request that cannot be kept is turned off with a warning."""
    if not patches.get(OPTION):
        return None
    devices = sorted({t.device.type for t in example_inputs if isinstance(t, torch.Tensor)})
    if "cuda" not in devices:
        explain.warn_cuda_graph_off_cuda(devices)
        return None
    scalars = cpu_scalars(example_inputs)
    if not scalars:
        return None
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    blocking = written_inputs(gm, scalars) or _cpu_outputs(gm)
    if blocking:
        patches[OPTION] = False
        explain.warn_cuda_graph_cpu_scalars(blocking)
        return None
    for i in scalars:  # a lifted input is a fresh tensor every call: never a static address
        placeholders[i].meta.get("tensor_dict", {}).pop("_dynamo_static_input_type", None)
    device = next(t.device for t in example_inputs if isinstance(t, torch.Tensor) and t.device.type == "cuda")
    return Lift.of(scalars, example_inputs, device)


def written_inputs(gm: fx.GraphModule, positions: Sequence[int]) -> list[str]:
    """The names of the graph inputs at ``positions`` that ``gm`` (a Dynamo graph) writes in
    place, directly or through a view (an in-place method or function, ``out=``, an in-place
    operator or item assignment)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    storages = {storage_of(placeholders[i]): placeholders[i] for i in positions}
    storages.pop(None, None)
    written: list[str] = []
    for node in gm.graph.nodes:
        for target in written_args(node):
            hit = storages.pop(storage_of(target), None)
            if hit is not None:
                written.append(_name(hit))
    return written


def _cpu_outputs(gm: fx.GraphModule) -> list[str]:
    """The graph's outputs that are CPU tensors (named), which a lift would move to the GPU."""
    (output,) = gm.graph.find_nodes(op="output")
    found = []
    for node in flat_nodes(output.args):
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            found.append(f"the output {node.name}")
    return found


def _name(placeholder: fx.Node) -> str:
    """A graph input as the user wrote it (Dynamo's source), else its node's name."""
    name = getattr(getattr(placeholder, "_dynamo_source", None), "name", None)
    name = name() if callable(name) else name  # a method before torch 2.12
    return name if isinstance(name, str) else placeholder.name
