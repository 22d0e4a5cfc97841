"""The house rules, read off the source: nine layers, imports that run one way, small rooms.

The layers, lowest first, and what each may import (the order is written here and nowhere else):

    _trace      pure reading of a profiler cycle: events, readers, tree, aggregate, timeline
    _neuron     Neuron specifics: TorchNeuron's profiling API, the Neuron output layout, Neuron tools'
                output, the run-tag plugin
    _device     what differs between Neuron, CUDA and CPU for a live profiler (one module: `devices`)
    _record     the MLflow shape of a cycle: the job, names, metric keys, tables, the record prepared
                from a job, its trace text, run and rank summaries
    _delivery   how a cycle is sent: the outbox (the queue), its one consumer, the helper, MLflow writes
    _capture    the training side: the callback, profiler hooks, frameworks' steps, ingest
    _analysis   pure judgement of runs read back: samples, statistics, cycles, verdicts, the gate's rule,
                change points, rank matching and the straggler rule. No mlflow, no matplotlib
    _readback   reads MLflow, and nothing else: finding runs, loading profiles and cycles, series in
                bulk, rank summaries
    _report     what the user asks for, put together and said: the comparison, the history, the ranks as
                words, tables, JSON, charts and HTML, and written back to MLflow through _delivery

The public modules (`__init__`, the `cli` package, `lightning`, `transformers`) sit on top and
may import any layer; `exceptions` (the public warning, strict mode) sits under every layer and imports
nothing of the package. Every import counts, also the ones deferred into functions: a deferred import still ties
two modules together. Run this file to print the graph: `python tests/test_layers.py [PACKAGE]`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mlflow_neuron"
NAME = "mlflow_neuron"

LAYERS = {  # layer: the layers it may import, besides itself
    "_trace": (),
    "_neuron": ("_trace",),
    "_device": ("_trace", "_neuron"),
    "_record": ("_trace", "_neuron"),
    "_delivery": ("_trace", "_neuron", "_record"),
    "_capture": ("_trace", "_neuron", "_device", "_record", "_delivery"),
    "_analysis": ("_trace", "_record"),
    "_readback": ("_trace", "_record", "_analysis"),
    "_report": ("_trace", "_record", "_delivery", "_analysis", "_readback"),
}
READ_SIDE = ("_analysis", "_readback", "_report")
ORDER = list(LAYERS)
PUBLIC_PACKAGES = {"cli"}  # folders of public modules, on top of the layers
# Public modules under every layer: each imports nothing of the package, and every layer may import it.
PUBLIC_LEAVES = {"exceptions"}
# The only modules that import torch. The helper process imports none of them, so it never maps libtorch.
TORCH_MODULES = {
    "_trace.kineto",  # every touch of torch's private profiler API
    "_trace.function_events",  # the prof.events() fallback, on torch's own event objects
    "_device.devices",  # activities, synchronize, which device, each device's profiling setup
    "_neuron.torch_neuronx",  # TorchNeuron's profiling API, feature-detected
    "_capture.interleave",  # profiles variants in rotation (torch.profiler's public API)
    "_capture.callback",
    "_capture.adaptive",  # the callback's own schedule returns torch.profiler's ProfilerAction
    "_capture.hooks",
    "_capture.reader",
    "_capture.scheduled",
    "_capture.distributed",
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
LONGER_FUNCTIONS = {"arguments.parser"}  # argparse declarations: one line per option, nothing to split
MAX_CLASS_LINES = {"_capture.callback.MLflowProfilerCallback": 250}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module names (without the package prefix; "__init__" for the package) -> files."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module -> the package's modules it imports (anywhere in its body)."""
    known = modules(package)
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        base = module.split(".") if is_package and module != "__init__" else module.split(".")[:-1]
        if module == "__init__":
            base = []
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets |= _resolve(alias.name.split(".")[1:], known) if alias.name.split(".")[0] == NAME else set()
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    parts = anchor + (node.module.split(".") if node.module else [])
                elif node.module and node.module.split(".")[0] == NAME:
                    parts = node.module.split(".")[1:]
                else:
                    continue
                named = set()
                for alias in node.names:  # `from . import x` names a module
                    named |= _resolve([*parts, alias.name], known, exact=True)
                if len(named) < len(node.names):  # some names are not modules: they come from `parts`
                    named |= _resolve(parts, known)
                targets |= named
        graph[module] = targets - {module}
    return graph


def _resolve(parts: list[str], known: dict, exact: bool = False) -> set[str]:
    name = ".".join(parts) or "__init__"
    if name in known:
        return {name}
    return set() if exact else ({".".join(parts[:-1])} & set(known))


def layer_of(module: str) -> str | None:
    """The layer a module belongs to; None for the public modules on top."""
    first = module.split(".")[0]
    return first if first in LAYERS else None


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def wrong_way(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports that leave a layer for one it may not import."""
    bad = []
    for module, targets in graph.items():
        layer = layer_of(module)
        if layer is None:
            continue
        for target in targets:
            other = layer_of(target)
            if target in PUBLIC_LEAVES:
                continue
            if other is None or (other != layer and other not in LAYERS[layer]):
                bad.append((module, target))
    return sorted(bad)


def floors(graph: dict[str, set[str]]) -> int:
    """The longest chain of imports (modules in it), circles counted once."""
    depth: dict[str, int] = {}

    def down(v: str, seen: frozenset) -> int:
        if v in depth:
            return depth[v]
        below = [down(w, seen | {v}) for w in graph.get(v, ()) if w not in seen]
        depth[v] = 1 + max(below, default=0)
        return depth[v]

    return max((down(v, frozenset()) for v in graph), default=0)


def torch_importers(package: Path = PACKAGE) -> set[str]:
    """Modules with an `import torch` (or `from torch...`) anywhere in them."""
    found = set()
    for module, path in modules(package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                found.add(module)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        for w in graph.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_layers_are_consistent():
    for layer, allowed in LAYERS.items():
        for other in allowed:
            assert ORDER.index(other) < ORDER.index(layer), f"{layer} may import {other}, which is not below it"
    assert {m.split(".")[0] for m in modules() if "." in m} == set(LAYERS) | PUBLIC_PACKAGES


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_imports_run_one_way():
    assert wrong_way(import_graph()) == []


def test_the_public_leaves_import_nothing_of_the_package():
    graph = import_graph()
    assert {leaf: graph[leaf] for leaf in PUBLIC_LEAVES} == {leaf: set() for leaf in PUBLIC_LEAVES}


def test_only_the_named_modules_import_torch():
    assert torch_importers() <= TORCH_MODULES


def test_the_helper_process_and_the_delivery_layer_import_no_torch_module():
    graph = import_graph()
    for module in [m for m in graph if layer_of(m) in ("_record", "_delivery")]:
        assert not (reachable(graph, module) | {module}) & TORCH_MODULES, module


def test_the_training_path_imports_no_comparison_code():
    graph = import_graph()
    for module in [m for m in graph if layer_of(m) in ("_record", "_delivery", "_capture")]:
        assert not any(layer_of(t) in READ_SIDE for t in reachable(graph, module)), module


def test_the_analysis_layer_imports_without_mlflow_and_matplotlib():
    """`_analysis` is pure: every module of it imports in a process where mlflow and matplotlib
    cannot be imported, and loads neither."""
    names = sorted(f"{NAME}.{m}" for m in modules() if layer_of(m) == "_analysis")
    assert len(names) > 10, names
    code = ("import sys\nfor blocked in ('mlflow', 'matplotlib'):\n    sys.modules[blocked] = None\n"
            f"import importlib\nfor name in {names!r}:\n    importlib.import_module(name)\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'matplotlib') and sys.modules[m])\n"
            "assert not loaded, loaded\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_modules_and_functions_stay_small():
    long = []
    for module, path in modules().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            long.append(f"{module}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            qualified = f"{module}.{getattr(node, 'name', '')}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if size > MAX_FUNCTION_LINES and f"{module.split('.')[-1]}.{node.name}" not in LONGER_FUNCTIONS:
                    long.append(f"{qualified}: {size} lines")
            elif isinstance(node, ast.ClassDef) and qualified in MAX_CLASS_LINES and size > MAX_CLASS_LINES[qualified]:
                long.append(f"{qualified}: {size} lines")
    assert long == []


def describe(package: Path = PACKAGE) -> str:
    graph = import_graph(package)
    arrows = sum(len(t) for t in graph.values())
    lines = [f"{package}: {len(graph)} modules, {arrows} arrows, {floors(graph)} floors",
             f"circles: {circles(graph) or 'none'}"]
    if any("." in m for m in graph):  # a package with layer folders
        lines.append(f"imports against the layers: {wrong_way(graph) or 'none'}")
    lines.append(f"modules importing torch: {sorted(torch_importers(package))}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE))
