"""The symbols a ledger item names, resolved in the trees so a decision cannot cite what is not there:
plugin symbols of a decision (`module:Name[.member]`), and trace_dependency inventory rows."""

from __future__ import annotations

from ..code.module_index import ModuleRecord, RecordCache, module_name
from ..foundation.errors import not_found
from ..sources.subjects import Subject

UPSTREAM_ROOT = "vllm"


def module_record(subject: Subject, module: str, cache: RecordCache) -> ModuleRecord | None:
    stem = module.replace(".", "/")
    for path in (f"{stem}.py", f"{stem}/__init__.py"):
        if path in subject.entries():
            return cache.get_many(subject, [path])[path]
    return None


def _defines(record: ModuleRecord, qualified: str, re_exports: bool) -> bool:
    owner, _, member = qualified.partition(".")
    definition = record.definition(owner)
    if definition is None:
        bound = re_exports and any(alias == owner for item in record.imports for _, alias in item.names)
        return not member and (owner in record.guarded_names or bound)
    return not member or (definition.kind == "class" and member in definition.members)


def plugin_symbol(symbol: str, local: str, plugin: Subject, cache: RecordCache) -> str:
    """`module:Name[.member]` (or a name in the entry's own file) that exists in the plugin subject."""
    module, _, qualified = symbol.rpartition(":")
    module = module or module_name(local) or ""
    record = module_record(plugin, module, cache)
    if record is None:
        raise not_found(f"plugin symbol {symbol!r}: {module} is not a module of the plugin subject.")
    if not qualified or not _defines(record, qualified, re_exports=False):
        raise not_found(f"plugin symbol {symbol!r}: {module} defines no {qualified or '(empty name)'}.")
    return f"{module}:{qualified}"


def inventory_node(node: str, package: str, plugin: Subject, upstream: Subject, cache: RecordCache) -> str:
    """A trace_dependency inventory row name that exists: a module of the plugin's `package` or of
    upstream (and the symbol it names, defined or re-exported there); third-party and stdlib
    boundaries as named."""
    module, _, symbol = node.partition(":")
    top = module.split(".")[0]
    subject = plugin if top == package else upstream if top == UPSTREAM_ROOT else None
    if subject is None:
        return node
    record = module_record(subject, module, cache)
    if record is None:
        raise not_found(
            f"{module} is not a module of the {'plugin subject' if subject is plugin else 'upstream target'}."
        )
    if symbol and not _defines(record, symbol, re_exports=True):
        raise not_found(f"{module} neither defines nor re-exports {symbol}.")
    return node
