"""Where Dynamo split the step around the graph being compiled, with the user's file and line:
what the explanation names when a recognised loop sits alone in its graph, so it cannot be
bucketed with the step's other loops (:mod:`muon_compile.explain`).

Three kinds of split, each read from what Dynamo records (torch 2.11 to 2.15):

* the graph ends at a graph break: ``gm.compile_subgraph_reason`` (reason and user stack);
* the graph resumes after a graph break: its frame is one of Dynamo's resume functions,
  ``torch_dynamo_resume_in_<function>_at_<line>`` (the first frame of the nodes' stack traces);
* a caller of the compiled frame runs eagerly because Dynamo skipped it (a graph break in a
  loop, an unsupported context manager...): a frame on the Python stack whose code has a
  failed entry in Dynamo's compilation metrics, which name the reason and the line.
"""

from __future__ import annotations

import re
import sys

import torch.fx as fx
from torch._dynamo.utils import get_compilation_metrics

_RESUME = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_(\d+)$")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def splits(gm: fx.GraphModule) -> list[str]:
    """Each split of the step at this graph, as ``"<reason> at <file>:<line>"``, innermost first."""
    found = []
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is not None and reason.graph_break:
        where = f" at {reason.user_stack[-1].filename}:{reason.user_stack[-1].lineno}" if reason.user_stack else ""
        found.append(f"a graph break ({_first_line(reason.reason)}){where}, where this graph ends")
    frame = _compiled_frame(gm)
    resumed = _RESUME.match(frame[2]) if frame else None
    if resumed:
        found.append(f"a graph break at {frame[0]}:{resumed.group(2)} in {resumed.group(1)}, after which this graph resumes")
    return found + _skipped_callers()


def _first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _compiled_frame(gm: fx.GraphModule) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the frame Dynamo traced: the outermost frame of a node's stack trace."""
    for node in gm.graph.nodes:
        frames = _FRAME.findall(node.meta.get("stack_trace") or "")
        if frames:
            path, line, fn = frames[0]
            return path, int(line), fn
    return None


def _skipped_callers() -> list[str]:
    """The frames on the Python stack that Dynamo failed to compile (so they run eagerly, and
    the graph being compiled is one of the calls they make), with the reason and its line."""
    failed = {}
    for m in get_compilation_metrics():
        if m.fail_type and m.co_name:
            failed[(m.co_filename, m.co_name, m.co_firstlineno)] = m
    found = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        m = failed.get((code.co_filename, code.co_name, code.co_firstlineno))
        if m is not None:
            where = f" at {m.fail_user_frame_filename}:{m.fail_user_frame_lineno}" if m.fail_user_frame_lineno else ""
            found.append(f"{_first_line(m.fail_reason) or m.fail_type}{where}, so Dynamo runs {code.co_name} eagerly")
        frame = frame.f_back
    return found
