"""Runs inside the *target* interpreter as the vLLM server process itself (any Python >= 3.8).

    python serve_wrapper.py REPORT IMPORT_PLUGIN MODEL -- SERVE_ARGS...

It picks the server entry (`vllm serve` when the interpreter's vLLM has its distribution
metadata, else the module entry), optionally imports the plugin package first (a smoke test of
an exported subject: the snapshot is first on PYTHONPATH), then runs the entry in this very
process. A daemon thread keeps REPORT up to date with the versions and import origins of what
this process has actually loaded, so the evidence comes from the running server, not a
separate probe. Its own directory is removed from sys.path first, so nothing of the MCP
server's package shadows a module of the target environment.
"""

import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != HERE]  # before any other import

import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import runpy  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

MODULES = ("torch", "vllm", "vllm_metax", "transformers")
MODULE_ENTRIES = ("vllm.entrypoints.launchers.api_server.entry", "vllm.entrypoints.openai.api_server")
PLUGIN = "vllm_metax"


def describe(name):
    module = sys.modules.get(name)
    if module is not None:
        return {
            "loaded": True,
            "version": getattr(module, "__version__", None),
            "origin": getattr(module, "__file__", None),
            "package_dirs": list(getattr(module, "__path__", []) or []),
        }
    try:
        spec = importlib.util.find_spec(name)
    except BaseException as exc:  # a broken package may raise anything here
        return {"loaded": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    if spec is None:
        return {"loaded": False, "error": "not importable"}
    return {"loaded": False, "origin": spec.origin, "package_dirs": list(spec.submodule_search_locations or [])}


def has_vllm_metadata():
    try:
        from importlib import metadata

        metadata.distribution("vllm")
        return True
    except Exception:
        return False


NO_ENGINE_EXIT = 3
"""Exit status when the interpreter has no vLLM server to start: the run is blocked, not failed."""


def choose_entry():
    if has_vllm_metadata():
        return "vllm serve", "vllm.entrypoints.cli.main"
    for module in MODULE_ENTRIES:
        try:
            if importlib.util.find_spec(module) is not None:
                return "module", module
        except ImportError:
            continue
    sys.stderr.write(
        "no vLLM OpenAI-compatible server entry found (tried vllm serve and %s)\n" % ", ".join(MODULE_ENTRIES)
    )
    sys.exit(NO_ENGINE_EXIT)


STATE = {"pid": os.getpid(), "python": {"version": sys.version.split()[0], "executable": sys.executable}}


def write_report(path):
    STATE["modules"] = {name: describe(name) for name in MODULES}
    STATE["sys_path_head"] = sys.path[:3]
    STATE["written_at"] = time.time()
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        json.dump(STATE, handle)
    os.replace(tmp, path)


def keep_reporting(path):
    while True:
        time.sleep(1.0)
        try:
            write_report(path)
        except Exception:
            pass


def main():
    report, import_plugin, model = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    serve_args = sys.argv[5:] if sys.argv[4:5] == ["--"] else sys.argv[4:]
    if import_plugin:
        STATE["plugin_import"] = {"requested": True}
        importlib.import_module(PLUGIN)  # an import error ends the server: the snapshot does not import
    how, module = choose_entry()
    STATE["entry"] = {"how": how, "module": module}
    if how == "vllm serve":
        argv = ["vllm", "serve", model] + serve_args
        STATE["equivalent_command"] = argv
    else:
        argv = [module, "--model", model] + serve_args
        STATE["equivalent_command"] = ["python", "-m", module, "--model", model] + serve_args
    write_report(report)
    threading.Thread(target=keep_reporting, args=(report,), daemon=True).start()
    sys.argv = argv
    if how == "vllm serve":
        from vllm.entrypoints.cli.main import main as vllm_main

        sys.exit(vllm_main())
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # a spawned child (multiprocessing) imports this file as __mp_main__
    main()
