"""Runs inside the *target* interpreter: build a model's HF config the way `vllm serve` does.

Reads a JSON request on stdin ({model, trust_remote_code, hf_overrides, speculative}) and prints
one JSON report after a marker. Order matters: transformers' own AutoConfig is asked first, before
vLLM registers its config classes; then vLLM's general plugins load and the platform resolves as
in `EngineArgs`; then `EngineArgs.create_model_config()` and, for a speculative method,
`create_speculative_config()` build the target and draft configs. The model is never loaded,
the tokenizer never initialised, and no device is touched (devices are hidden by the caller).
"""

import json
import logging
import sys
from typing import Any, Dict

MARKER = "@@CONSTRUCT@@"
STEP = "@@STEP@@"
GENERAL_GROUP = "vllm.general_plugins"
PLATFORM_GROUP = "vllm.platform_plugins"


def short_error(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0][:400] if text else "")


def jsonable(value):
    return json.loads(json.dumps(value, default=str))


class Capture(logging.Handler):
    """Log records of vLLM's plugin and platform loaders: which plugin loaded, failed, activated."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.msg, record.args))

    def names(self, message):
        return [args[0] for msg, args in self.records if msg == message and args]


def describe(config):
    kind = type(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {
        "class": "%s:%s" % (kind.__module__, kind.__qualname__),
        "model_type": getattr(config, "model_type", None),
        "architectures": getattr(config, "architectures", None),
        "text_class": None if text is config else "%s:%s" % (type(text).__module__, type(text).__qualname__),
        "dict": jsonable(config.to_dict()),
    }


def model_class(architecture):
    """Where vLLM's registry (with the plugins' registrations) resolves an architecture."""
    try:
        from vllm.model_executor.models import ModelRegistry

        entry = ModelRegistry.models.get(architecture)
    except BaseException:
        return None
    if entry is None:
        return None
    if hasattr(entry, "module_name"):
        return "%s:%s" % (entry.module_name, entry.class_name)
    cls = getattr(entry, "model_cls", None)
    return "%s:%s" % (cls.__module__, cls.__qualname__) if cls is not None else None


def transformers_config(request, report):
    try:
        from transformers import AutoConfig, PretrainedConfig

        report["transformers_version"] = __import__("transformers").__version__
        report["base_defaults"] = jsonable(PretrainedConfig().to_dict())
        config = AutoConfig.from_pretrained(request["model"], trust_remote_code=request["trust_remote_code"])
        report["transformers"] = describe(config)
    except BaseException as exc:
        report["errors"]["transformers"] = short_error(exc)


def entry_points_of(group):
    from importlib.metadata import entry_points

    found = entry_points()
    if sys.version_info >= (3, 10):
        selected = found.select(group=group)
    else:  # a dict of groups before 3.10
        selected = found.get(group, [])
    return [(ep.name, ep.value) for ep in selected]


def plugins_and_platform(report, capture):
    import vllm.envs as envs
    from vllm.plugins import load_general_plugins

    allowed = envs.VLLM_PLUGINS
    try:
        load_general_plugins()
    except BaseException as exc:
        report["errors"]["general_plugins"] = short_error(exc)
    try:
        from vllm.platforms import current_platform

        kind = type(current_platform)
        report["platform"] = {
            "class": "%s:%s" % (kind.__module__, kind.__qualname__),
            "device_name": getattr(current_platform, "device_name", None),
        }
    except BaseException as exc:
        report["errors"]["platform"] = short_error(exc)
    failed = set(capture.names("Failed to load plugin %s"))
    activated = set(capture.names("Platform plugin %s is activated"))
    detect_failed = set(capture.names("Platform plugin %s failed during detection."))
    plugins = []
    for group in (GENERAL_GROUP, PLATFORM_GROUP):
        for name, value in entry_points_of(group):
            wanted = allowed is None or name in allowed
            if group == GENERAL_GROUP:
                state = "failed" if name in failed else "loaded" if wanted else "filtered"
            else:
                state = (
                    "activated"
                    if name in activated
                    else "failed"
                    if name in failed | detect_failed
                    else "inactive"
                    if wanted
                    else "filtered"
                )
            plugins.append({"name": name, "group": group, "value": value, "state": state})
    report["plugins"] = plugins
    report["plugins_filter"] = allowed


def engine_configs(request, report):
    from vllm.engine.arg_utils import EngineArgs

    kwargs = {
        "model": request["model"],
        "trust_remote_code": request["trust_remote_code"],
        "skip_tokenizer_init": True,
        "load_format": "dummy",
    }
    if request.get("hf_overrides"):
        kwargs["hf_overrides"] = request["hf_overrides"]
    if request.get("speculative"):
        kwargs["speculative_config"] = dict(request["speculative"])
    args = EngineArgs(**kwargs)
    try:
        model_config = args.create_model_config()
    except BaseException as exc:
        report["errors"]["model_config"] = short_error(exc)
        fallback_get_config(request, report)
        return
    report["target"] = describe(model_config.hf_config)
    report["target"]["total_layers"] = model_config.get_total_num_hidden_layers()
    report["target"]["architecture"] = getattr(model_config, "architecture", None)
    report["target"]["model_class"] = model_class(report["target"]["architecture"])
    if request.get("speculative"):
        try:
            from vllm.config import ParallelConfig

            speculative = args.create_speculative_config(model_config, ParallelConfig())
            draft = getattr(speculative, "draft_model_config", None)
            if draft is not None and draft is not model_config:
                report["draft"] = describe(draft.hf_config)
                report["draft"]["architecture"] = getattr(draft, "architecture", None)
                report["draft"]["model_class"] = model_class(report["draft"]["architecture"])
            report["speculative_method"] = getattr(speculative, "method", None)
        except BaseException as exc:
            report["errors"]["speculative_config"] = short_error(exc)


def fallback_get_config(request, report):
    """When the full model config fails (e.g. a platform check), still report what get_config builds."""
    try:
        from vllm.transformers_utils.config import get_config

        flat = {k: v for k, v in (request.get("hf_overrides") or {}).items() if not isinstance(v, dict)}
        config = get_config(request["model"], request["trust_remote_code"], hf_overrides_kw=flat or None)
        report["target"] = describe(config)
        report["target"]["partial"] = "get_config only"
    except BaseException as exc:
        report["errors"]["get_config"] = short_error(exc)


def step(text):
    """Announce what comes next, so a crash (a signal from native code) can be placed."""
    sys.stdout.write("\n" + STEP + text + "\n")
    sys.stdout.flush()


def main():
    request = json.loads(sys.stdin.read())
    report: Dict[str, Any] = {"errors": {}}
    capture = Capture()
    for name in ("vllm.plugins", "vllm.platforms"):
        logger = logging.getLogger(name)
        logger.addHandler(capture)
        logger.setLevel(logging.DEBUG)
    step("building the transformers config")
    transformers_config(request, report)
    step("importing vllm")
    try:
        import vllm

        report["vllm_version"] = getattr(vllm, "__version__", None)
    except BaseException as exc:
        report["errors"]["vllm"] = short_error(exc)
    else:
        step("loading vLLM's plugins and platform")
        plugins_and_platform(report, capture)
        step("building vLLM's engine configs")
        try:
            engine_configs(request, report)
        except BaseException as exc:
            report["errors"]["engine_args"] = short_error(exc)
    sys.stdout.write("\n" + MARKER + json.dumps(report, default=str) + "\n")
    sys.stdout.flush()


main()
