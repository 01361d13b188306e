"""What the plugin's own source says about MACA: its platform class's answers and the ops it registers.

The difference matrix needs two facts the model files do not carry. Which platform class the plugin
installs comes from the strings its package `__init__` hands vLLM (`register()` returns
"vllm_metax.platform.MacaPlatform"), never from a class or file name; the package is the one the
call compares, passed in. What that class answers for a predicate is known only where a method
returns a constant. Which `torch.ops` the plugin registers
comes from its Python registrations, read by the same scanner trace_dependency uses
(`op_scanners.scan_python`); native `TORCH_LIBRARY` blocks are not read here.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from ..foundation.evidence import FileEvidence
from ..sources.subjects import Subject
from .module_index import module_name
from .op_scanners import PythonOpFacts, scan_python


@dataclass(frozen=True)
class Answer:
    value: object
    evidence: FileEvidence


@dataclass
class PluginFacts:
    package: str
    """The plugin's top-level package the facts were read from (`vllm_metax`)."""
    platform_class: str | None = None
    """`module:Class` of the platform the plugin installs, when its package `__init__` names one."""
    platform_evidence: FileEvidence | None = None
    answers: dict[str, Answer] = field(default_factory=dict)
    """Platform method name -> the constant it returns."""
    ops: dict[str, FileEvidence] = field(default_factory=dict)
    """`ns.op` the plugin registers -> where."""
    namespaces: dict[str, FileEvidence] = field(default_factory=dict)
    """Namespaces the plugin defines outright (`Library("ns", "DEF")`)."""

    def registered_op(self, op: str) -> FileEvidence | None:
        return self.ops.get(op) or self.namespaces.get(op.split(".")[0])


def _strings(tree: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _parse(data: bytes) -> ast.Module | None:
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError):
        return None


@dataclass(frozen=True)
class _ConstantReturn:
    value: object
    line: int


def _constant_returns(node: ast.ClassDef) -> dict[str, _ConstantReturn]:
    """Methods whose body (docstring aside) is `return <constant>`."""
    found: dict[str, _ConstantReturn] = {}
    for item in node.body:
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = [s for s in item.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Constant):
            found[item.name] = _ConstantReturn(body[0].value.value, body[0].lineno)
    return found


def _platform(subject: Subject, facts: PluginFacts, sources: dict[str, bytes]) -> None:
    init = f"{facts.package}/__init__.py"
    class_path = re.compile(rf"^{re.escape(facts.package)}(\.\w+)+$")
    tree = _parse(sources[init]) if init in sources else None
    if tree is None:
        return
    modules = {module_name(p): p for p in sources if module_name(p)}
    for constant in _strings(tree):
        value = str(constant.value)
        owner, _, name = value.rpartition(".")
        path = modules.get(owner)
        if not class_path.match(value) or path is None:
            continue
        module = _parse(sources[path])
        target = next(
            (n for n in (module.body if module else []) if isinstance(n, ast.ClassDef) and n.name == name), None
        )
        if target is None:
            continue
        facts.platform_class = f"{owner}:{name}"
        facts.platform_evidence = FileEvidence(path=init, line=constant.lineno, rev=subject.sha(init))
        for method, returned in _constant_returns(target).items():
            evidence = FileEvidence(path=path, line=returned.line, rev=subject.sha(path))
            facts.answers[method] = Answer(returned.value, evidence)
        return


def _registrations(path: str, sha: str, source: bytes, facts: PluginFacts) -> None:
    found = PythonOpFacts.from_json(scan_python(source))
    for defined in found.defined:
        facts.namespaces.setdefault(defined.namespace, FileEvidence(path=path, line=defined.line, rev=sha))
    for site in found.local_ops():
        facts.ops.setdefault(site.op, FileEvidence(path=path, line=site.line, rev=sha))


def plugin_facts(subject: Subject, package: str) -> PluginFacts:
    """Read the plugin package (`package/`) once for its platform class and its op registrations."""
    paths = [p for p in subject.list(f"{package}/") if p.endswith(".py")]
    sources = subject.read_many(paths)
    facts = PluginFacts(package)
    _platform(subject, facts, sources)
    for path in paths:
        _registrations(path, subject.sha(path), sources[path], facts)
    return facts
