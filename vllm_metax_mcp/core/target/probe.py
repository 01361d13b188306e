"""Runs inside the *target* interpreter (any Python >= 3.8): report versions and import origins as JSON.

It only imports; it never touches a device, installs nothing and writes no bytecode.
"""

import importlib
import json
import os
import platform
import sys
import sysconfig

MODULES = ("torch", "vllm", "vllm_metax", "transformers")
PLUGIN_GROUPS = ("vllm.platform_plugins", "vllm.general_plugins")


def step(text):
    """Announce what comes next, so a crash (a signal from native code) can be placed."""
    sys.stdout.write("\n@@STEP@@" + text + "\n")
    sys.stdout.flush()


def describe(name):
    step("importing " + name)
    try:
        module = importlib.import_module(name)
    except BaseException as exc:  # an import may raise anything, SystemExit included
        return {"error": "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")}
    origin = getattr(module, "__file__", None)
    paths = list(getattr(module, "__path__", []) or [])
    return {"version": getattr(module, "__version__", None), "origin": origin, "package_dirs": paths}


def distributions():
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name] = dist.version
    return [{"name": k, "version": found[k]} for k in sorted(found, key=str.lower)]


def plugins():
    from importlib import metadata

    eps = metadata.entry_points()
    result = {}
    for group in PLUGIN_GROUPS:
        if sys.version_info >= (3, 10):
            selected = eps.select(group=group)
        else:  # a dict of groups before 3.10
            selected = eps.get(group, [])
        result[group] = [{"name": ep.name, "value": ep.value} for ep in selected]
    return result


def main():
    report = {
        "python": {
            "version": platform.python_version(),
            "executable": sys.executable,
            "prefix": sys.prefix,
            "site_dirs": sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}),
            "sys_path": [p for p in sys.path if p],
        },
        "vllm_plugins_filter": os.environ.get("VLLM_PLUGINS"),
        "modules": {name: describe(name) for name in MODULES},
    }
    step("reading installed distributions and vLLM plugins")
    try:
        report["distributions"] = distributions()
        report["plugins"] = plugins()
    except BaseException as exc:
        report["metadata_error"] = "%s: %s" % (type(exc).__name__, exc)
    sys.stdout.write("\n@@PROBE@@" + json.dumps(report) + "\n")


main()
