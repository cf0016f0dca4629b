"""Where Dynamo split the step around the graph being compiled, with the user's file and line:
what the explanation names when a recognised loop sits alone in its graph, so it cannot be
bucketed with the step's other loops (:mod:`muon_compile.diagnostics.explain`).

Three kinds of split, each read from what Dynamo records (torch 2.11 to 2.15):

* the graph ends at a graph break: ``gm.compile_subgraph_reason`` (reason and user stack);
* the graph resumes after a graph break: its frame is one of Dynamo's resume functions,
  ``torch_dynamo_resume_in_<function>_at_<line>`` (the first frame of the nodes' stack traces);
* a caller of the compiled frame runs eagerly because Dynamo skipped it (a graph break in a
  loop, an unsupported context manager...): a frame on the Python stack whose code has a
  failed entry in Dynamo's compilation metrics, which name the reason and the line. A loop of
  matrix products in that function (read from its source: a product in the loop's body, or in
  a function the body calls by a name the function binds to a module's function) runs there
  uncompiled, neither recognised nor bucketed, and is named with its line.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from types import CodeType

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
            name, source, start = code.co_name, code, 0
            resumed = _RESUME.match(name)
            if resumed:  # a resume function: the rest of the function it was cut from, from that line
                fn = inspect.unwrap(frame.f_globals.get(resumed.group(1)))
                source, start = getattr(fn, "__code__", None), int(resumed.group(2))
                name = f"{resumed.group(1)} from line {start}"
            lines = [line for line in _product_loops(source, frame.f_globals) if line >= start] if source else []
            loops = "".join(f"; its loop of matrix products at {code.co_filename}:{line} runs uncompiled, not bucketed"
                            for line in lines)
            found.append(f"{_first_line(m.fail_reason) or m.fail_type}{where}, so Dynamo runs {name} eagerly{loops}")
        frame = frame.f_back
    return found


_PRODUCTS = frozenset({"mm", "bmm", "matmul", "addmm", "baddbmm"})


def _tree(obj) -> ast.AST | None:
    """The syntax tree of the function ``obj`` (its code object or itself), None where its
    source is not at hand or is not a function's."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        return None
    return tree if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _has_product(tree: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult))
        or (isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in _PRODUCTS)
        for n in ast.walk(tree)
    )


def _product_loops(code: CodeType, namespace: dict) -> list[int]:
    """The first lines of the loops in ``code``'s function whose body makes a matrix product,
    itself or through a function of ``namespace`` it calls, by name or by a local name the
    function binds to one (``step = helper_2d if X.ndim == 2 else helper_3d``)."""
    tree = _tree(code)
    if tree is None:
        return []
    bound: dict[str, set[str]] = {}  # a local name -> the global names its assignments read
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            read = {r.id for r in ast.walk(n.value) if isinstance(r, ast.Name)}
            for target in n.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, set()).update(read)

    def makes_products(name: str) -> bool:
        fn = namespace.get(name)
        sub = _tree(fn) if inspect.isfunction(fn) else None
        return sub is not None and _has_product(sub)

    first = code.co_firstlineno - 1
    lines = []
    for loop in (n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))):
        called = {c.func.id for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        names = called | {g for name in called for g in bound.get(name, ())}
        if any(_has_product(stmt) for stmt in loop.body) or any(makes_products(n) for n in names):
            lines.append(first + loop.lineno)
    return sorted(lines)
