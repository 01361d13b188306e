"""Runs inside the *target* interpreter (any Python >= 3.8): which `torch.ops` the installed
binaries provide, with their schemas, as JSON after a marker.

Reads {"ops": ["ns.name", ...], "packages": [...], "modules": [...]} on stdin. Kernels are loaded
the way the target vLLM loads them: its active platform (resolved as vLLM resolves it, platform
plugins included) runs its own `import_kernels`, or, in releases without that hook, vLLM's
`_custom_ops` module is imported; then vLLM's general plugins load. A package whose compiled
libraries that loader mapped has chosen among its builds (e.g. `_C_AVX2` over `_C` on a CPU
without AVX-512) and is not second-guessed. Only then are the remaining extensions whose file
name matches an op namespace imported directly, one announced step at a time; a report is
printed before that, so a crash there keeps what was learnt. It never touches a device.
"""

import functools
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from typing import Any, Dict

MARKER = "@@OPPROBE@@"
STEP = "@@STEP@@"


def step(text):
    sys.stdout.write("\n" + STEP + text + "\n")
    sys.stdout.flush()


def emit(report):
    sys.stdout.write("\n" + MARKER + json.dumps(report) + "\n")
    sys.stdout.flush()


def error(exc):
    text = str(exc).splitlines()[0] if str(exc) else ""
    return "%s: %s" % (type(exc).__name__, text[:300])


def mapped_files():
    """Files mapped into this process: the compiled libraries loaded so far, whatever their module name."""
    try:
        with open("/proc/self/maps") as maps:
            return set(line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6)
    except OSError:
        return set()


def extensions(package):
    """(module name, stem, file) of the compiled extensions directly inside an installed package."""
    try:
        spec = importlib.util.find_spec(package)
    except BaseException as exc:  # a broken parent import may raise anything
        return None, error(exc)
    if spec is None:
        return None, None
    found = []
    for directory in list(spec.submodule_search_locations or [])[:1]:
        for name in sorted(os.listdir(directory)):
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    stem = name[: -len(suffix)]
                    found.append(("%s.%s" % (package, stem), stem, os.path.realpath(os.path.join(directory, name))))
                    break
    return found, None


def wanted(stem, namespaces):
    return any(ns == stem or ns.startswith(stem + "_") for ns in namespaces)


def attempt(report, key, action):
    try:
        action()
        return True
    except BaseException as exc:  # plugin and platform code may raise anything, SystemExit included
        report["errors"][key] = error(exc)
        return False


def load_like_vllm(report):
    """Kernels and plugins the way vLLM loads them; records which loader ran."""
    if importlib.util.find_spec("vllm") is None:
        return
    holder = {}

    def resolve():
        from vllm.platforms import current_platform

        holder["platform"] = current_platform
        report["platform"] = "%s.%s" % (type(current_platform).__module__, type(current_platform).__name__)

    step("resolving vLLM's current platform")
    if attempt(report, "vllm.platforms", resolve):
        loader = getattr(holder["platform"], "import_kernels", None)
        if callable(loader):
            report["kernel_loader"] = report["platform"] + ".import_kernels"
            step("loading kernels with " + report["kernel_loader"])
            attempt(report, "vllm.platforms.import_kernels", loader)
        elif importlib.util.find_spec("vllm._custom_ops") is not None:
            report["kernel_loader"] = "vllm._custom_ops"
            step("importing vllm._custom_ops")
            attempt(report, "vllm._custom_ops", lambda: importlib.import_module("vllm._custom_ops"))
    try:
        from vllm.plugins import load_general_plugins
    except BaseException:
        return
    step("loading vLLM's general plugins")
    attempt(report, "vllm.plugins", load_general_plugins)


def read_ops(report, torch, ops):
    for op in ops:
        namespace, name = op.split(".", 1)
        try:
            schemas = torch._C._jit_get_schemas_for_operator("%s::%s" % (namespace, name))
            report["ops"][op] = [str(s) for s in schemas]
        except BaseException as exc:
            report["ops"][op] = []
            report["errors"][op] = error(exc)


def main():
    request = json.loads(sys.stdin.read())
    report: Dict[str, Any] = {
        "packages": {},
        "loaded": [],
        "loaded_by_platform": [],
        "errors": {},
        "ops": {},
        "stage": "torch",
    }
    step("importing torch")
    try:
        import torch
    except BaseException as exc:
        report["torch"] = {"error": error(exc)}
        emit(report)
        return
    report["torch"] = {"version": torch.__version__}
    namespaces = set(op.split(".", 1)[0] for op in request["ops"])
    load_like_vllm(report)
    for module in request["modules"]:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            continue
        step("importing " + module)
        if attempt(report, module, functools.partial(importlib.import_module, module)):
            report["loaded"].append(module)
    mapped = mapped_files()
    pending = []
    for package in request["packages"]:
        found, problem = extensions(package)
        report["packages"][package] = {"installed": found is not None, "extensions": [m for m, _, _ in found or []]}
        if problem:
            report["errors"][package] = problem
        loaded = [module for module, _, path in found or [] if path in mapped]
        report["loaded_by_platform"] += loaded
        if not loaded:  # no loader of its own chose among its builds
            pending += [(module, stem) for module, stem, _ in found or [] if wanted(stem, namespaces)]
    report["stage"] = "loaded like vLLM"
    read_ops(report, torch, request["ops"])
    emit(report)
    for module, _ in pending:
        step("importing " + module)
        if attempt(report, module, functools.partial(importlib.import_module, module)):
            report["loaded"].append(module)
    report["stage"] = "complete"
    read_ops(report, torch, request["ops"])
    emit(report)


main()
