"""Whether a compiled step may be replayed as a CUDA graph when one is asked for
(``mode="reduce-overhead"`` or ``options={"triton.cudagraphs": True}``).

Inductor hands a 0-D CPU tensor that a GPU kernel reads to that kernel as a value, read on
the host when the kernel is launched (``GraphLowering.is_unspec_arg``). A captured graph
launches nothing on replay: it would keep the value it was captured with. The optimizers'
hyper-parameters (``lr``, ``momentum``, ...) and counters are such tensors (0-D, on the CPU,
changed in place by a learning-rate scheduler), so a captured step would go on with its first
learning rate, silently. Until they live on the parameters' device, a step on CUDA that reads
a 0-D CPU tensor is compiled without a CUDA graph, and says so once per process.

A step whose tensors are not on CUDA cannot be captured at all: it is compiled as asked
(Inductor leaves the CUDA graph out) and says so once per process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import explain

OPTION = "triton.cudagraphs"


def cpu_scalars(example_inputs: Sequence[Any]) -> list[int]:
    """Positions of the graph inputs that are 0-D CPU tensors."""
    return [
        i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type == "cpu"
    ]


def decide(patches: dict[str, Any], example_inputs: Sequence[Any]) -> None:
    """Turn ``patches``' CUDA graph off where a replay would be wrong (see the module
    docstring), warning once per process; leave every other request as it is."""
    if not patches.get(OPTION):
        return
    devices = sorted({t.device.type for t in example_inputs if isinstance(t, torch.Tensor)})
    if "cuda" not in devices:
        explain.warn_cuda_graph_off_cuda(devices)
        return
    scalars = cpu_scalars(example_inputs)
    if scalars:
        patches[OPTION] = False
        explain.warn_cuda_graph_cpu_scalars(len(scalars))
