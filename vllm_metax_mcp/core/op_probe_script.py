"""Runs inside the *target* interpreter (any Python >= 3.8): which `torch.ops` the installed
binaries provide, with their schemas, as JSON after a marker.

Reads {"ops": ["ns.name", ...], "packages": [...], "modules": [...]} on stdin. Loads only the
packages' compiled extensions whose file name matches an op namespace (`_C` for `_C` and
`_C_cache_ops`), then imports the Python modules that register ops; it never touches a device.
"""

import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys

MARKER = "@@OPPROBE@@"


def error(exc):
    text = str(exc).splitlines()[0] if str(exc) else ""
    return "%s: %s" % (type(exc).__name__, text[:300])


def extensions(package):
    """(module name, stem) of the compiled extensions directly inside an installed package."""
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
                    found.append(("%s.%s" % (package, stem), stem))
                    break
    return found, None


def wanted(stem, namespaces):
    return any(ns == stem or ns.startswith(stem + "_") for ns in namespaces)


def main():
    request = json.loads(sys.stdin.read())
    report = {"packages": {}, "loaded": [], "errors": {}, "ops": {}}
    try:
        import torch
    except BaseException as exc:
        report["torch"] = {"error": error(exc)}
        sys.stdout.write("\n" + MARKER + json.dumps(report) + "\n")
        return
    report["torch"] = {"version": torch.__version__}
    namespaces = set(op.split(".", 1)[0] for op in request["ops"])
    for package in request["packages"]:
        found, problem = extensions(package)
        report["packages"][package] = {"installed": found is not None, "extensions": [m for m, _ in found or []]}
        if problem:
            report["errors"][package] = problem
        for module, stem in found or []:
            if not wanted(stem, namespaces):
                continue
            try:
                importlib.import_module(module)
                report["loaded"].append(module)
            except BaseException as exc:
                report["errors"][module] = error(exc)
    for module in request["modules"]:
        if not report["packages"].get(module.split(".")[0], {}).get("installed", True):
            continue
        try:
            importlib.import_module(module)
            report["loaded"].append(module)
        except BaseException as exc:
            report["errors"][module] = error(exc)
    for op in request["ops"]:
        namespace, name = op.split(".", 1)
        try:
            schemas = torch._C._jit_get_schemas_for_operator("%s::%s" % (namespace, name))
            report["ops"][op] = [str(s) for s in schemas]
        except BaseException as exc:
            report["ops"][op] = []
            report["errors"][op] = error(exc)
    sys.stdout.write("\n" + MARKER + json.dumps(report) + "\n")


main()
