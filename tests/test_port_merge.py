"""The structural three-way merge of port_model (core/port), one rule per test, on small modules.

Each case names base (the release the fork was taken from), local (the fork) and target (the
release it moves to); the expected output follows from the rule in core/port/merge.py's docstring.
The MetaX contract is read from base and local as port_model reads it (`derive_contract`).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable

import libcst as cst

from vllm_metax_mcp.core.compare.affixes import Affix, VendorAffixes
from vllm_metax_mcp.core.port.contract import Rule, absolute_imports, derive_contract
from vllm_metax_mcp.core.port.lines3 import Conflict, merge3
from vllm_metax_mcp.core.port.merge import MARK, Extension, FileMerge, merge_file
from vllm_metax_mcp.core.port.units import split_units
from vllm_metax_mcp.core.port.verify import Verification, check_order

Defines = Callable[[str, str], bool | None]


def unknown(module: str, name: str) -> bool | None:
    return None


def port(
    base: str, local: str, target: str, defines: Defines = unknown, counterparts: set[str] | None = None
) -> FileMerge:
    modules = [cst.parse_module(textwrap.dedent(code)) for code in (base, local, target)]
    names = frozenset(u.name for u in split_units(modules[0].body))
    affixes = VendorAffixes((Affix("Maca", "prefix"),), names)
    contract = derive_contract(modules[0], modules[1], affixes.upstream_name)
    merged = merge_file(modules, contract, defines, Extension.of(modules[1], counterparts or set()))
    ast.parse(merged.code)  # every output parses
    return merged


def actions(merged: FileMerge) -> dict[str, str]:
    return {d.key: d.action for d in merged.decisions}


BASE = """\
import torch


def helper(x):
    return x + 1


def forward(x):
    y = helper(x)
    return y * 2
"""


def test_a_side_that_changed_alone_wins_and_an_unchanged_fork_becomes_the_target_byte_for_byte() -> None:
    target = BASE.replace("return y * 2", "return y * 3")
    assert port(BASE, BASE, target).code == textwrap.dedent(target)
    local = BASE.replace("return x + 1", "return x + 2  # MACA")
    merged = port(BASE, local, target)
    assert "return x + 2  # MACA" in merged.code and "return y * 3" in merged.code
    assert actions(merged) == {"import:torch": "taken", "def:helper": "kept", "def:forward": "taken"}


def test_both_sides_changing_different_lines_of_a_function_merge_without_conflict() -> None:
    local = BASE.replace("y = helper(x)", "y = helper(x).to(torch.bfloat16)")
    target = BASE.replace("return y * 2", "return y * 3")
    merged = port(BASE, local, target)
    assert "y = helper(x).to(torch.bfloat16)" in merged.code and "return y * 3" in merged.code
    assert actions(merged)["def:forward"] == "merged" and not merged.conflicts


def test_both_sides_changing_one_line_keep_both_local_active_and_the_target_commented() -> None:
    local = BASE.replace("return y * 2", "return y * 4")
    target = BASE.replace("return y * 2", "return y * 3")
    merged = port(BASE, local, target)
    (conflict,) = merged.conflicts
    assert conflict.key == "def:forward" and conflict.local.strip() == "return y * 4"
    assert conflict.target.strip() == "return y * 3" and not conflict.whole
    lines = [line.strip() for line in merged.code.splitlines()]
    start = lines.index(next(line for line in lines if MARK in line and "<<<" in line))
    assert lines[start + 1 : start + 4] == [
        "# |     return y * 3",
        "# >>>>>>> port_model conflict 1: 1 local lines follow",
        "return y * 4",
    ]


def test_lines_added_around_lines_the_other_side_rewrote_are_kept_with_the_rewrite() -> None:
    base, local, target = ["a\n", "b\n"], ["a\n", "b\n", "local\n"], ["A\n", "B\n"]
    assert merge3(base, local, target).chunks == [["A\n", "B\n", "local\n"]]
    assert isinstance(merge3(["a\n"], ["x\n"], ["y\n"]).chunks[0], Conflict)


def test_upstream_additions_follow_the_target_order_and_local_additions_their_local_neighbour() -> None:
    target = BASE.replace("def forward(x):", "def added_upstream():\n    return 0\n\n\ndef forward(x):")
    local = BASE.replace("def forward(x):", "def maca_only():\n    return 1\n\n\ndef forward(x):")
    merged = port(BASE, local, target)
    order = [n.name for n in ast.parse(merged.code).body if isinstance(n, ast.FunctionDef)]
    assert order == ["helper", "maca_only", "added_upstream", "forward"]
    assert actions(merged)["def:added_upstream"] == "added_upstream"
    assert actions(merged)["def:maca_only"] == "added_local"


def test_upstream_removals_apply_unless_the_fork_changed_or_still_uses_the_symbol() -> None:
    target = BASE.replace("    y = helper(x)\n", "    y = x + 1\n").replace(
        "def helper(x):\n    return x + 1\n\n\n", ""
    )
    assert "def helper" not in port(BASE, BASE, target).code
    local_uses = BASE + "\n\ndef maca_path(x):\n    return helper(x)\n"
    kept = port(BASE, textwrap.dedent(local_uses), target)
    assert "def helper" in kept.code and actions(kept)["def:helper"] == "kept_removed"
    changed = BASE.replace("return x + 1", "return x + 5")
    assert "return x + 5" in port(BASE, changed, target).code


def test_a_local_removal_stays_and_is_a_conflict_only_where_the_output_still_uses_what_upstream_changed() -> None:
    local = BASE.replace("def helper(x):\n    return x + 1\n\n\n", "").replace("helper(x)", "x + 1")
    assert "def helper" not in port(BASE, local, BASE).code
    target = BASE.replace("return x + 1", "return x + 7")
    merged = port(BASE, local, target)
    assert not merged.conflicts and "def helper" not in merged.code
    (decision,) = [d for d in merged.decisions if d.key == "def:helper"]
    assert (decision.action, decision.why) == (
        "removed_local",
        "the local file removed it; upstream changed it; the output does not use it",
    )
    target += "\n\ndef added_upstream():\n    return helper(1)\n"
    merged = port(BASE, local, target)
    (conflict,) = merged.conflicts
    assert conflict.whole and conflict.key == "def:helper" and "return x + 7" in conflict.target
    assert "# |     return x + 7" in merged.code and "\ndef helper" not in merged.code


SWAP_BASE = """\
from vllm.model_executor.layers.fused_moe import FusedMoE


def build():
    return FusedMoE()
"""


def test_an_import_swap_is_reapplied_to_new_upstream_imports_of_the_same_module() -> None:
    local = SWAP_BASE.replace("from vllm.model_executor", "from vllm_metax.model_executor")
    target = SWAP_BASE.replace(
        "import FusedMoE", "import FusedMoE\nfrom vllm.model_executor.layers.fused_moe.x import Y"
    )
    target = target.replace("import FusedMoE\n", "import FusedMoE, SharedFusedMoE\n")
    merged = port(SWAP_BASE, local, target)
    assert "from vllm_metax.model_executor.layers.fused_moe import FusedMoE, SharedFusedMoE" in merged.code
    assert "from vllm.model_executor.layers.fused_moe.x import Y" in merged.code  # another module: not swapped
    (rule,) = [r for r in derive(SWAP_BASE, local)]
    assert (rule.kind, rule.upstream, rule.line) == ("import_swap", "vllm.model_executor.layers.fused_moe", 1)


def test_a_swap_is_not_applied_where_the_plugin_module_lacks_the_name() -> None:
    local = SWAP_BASE.replace("from vllm.model_executor", "from vllm_metax.model_executor")
    target = SWAP_BASE + "\n\nfrom vllm.model_executor.layers.fused_moe import Router\n"

    def defines(module: str, name: str) -> bool | None:
        return name != "Router" if module.startswith("vllm_metax") else None

    merged = port(SWAP_BASE, local, target, defines)
    assert "from vllm.model_executor.layers.fused_moe import Router" in merged.code
    (skipped,) = merged.skipped
    assert "does not define Router" in skipped.why


def derive(base: str, local: str) -> list[Rule]:
    modules = [cst.parse_module(textwrap.dedent(code)) for code in (base, local)]
    names = frozenset(u.name for u in split_units(modules[0].body))
    return derive_contract(modules[0], modules[1], VendorAffixes((Affix("Maca", "prefix"),), names).upstream_name).rules


CLASS_BASE = """\
import torch


class FooAttention(torch.nn.Module):
    def forward(self, h):
        return ops.rms_norm(h)


class FooModel(torch.nn.Module):
    def __init__(self):
        self.attn = FooAttention()
"""


def test_a_vendor_renamed_class_takes_upstream_changes_and_new_upstream_code_uses_the_local_names() -> None:
    local = CLASS_BASE.replace("class Foo", "class MacaFoo").replace("= FooAttention()", "= MacaFooAttention()")
    local = local.replace("ops.rms_norm(h)", "mx_ops.rms_norm(h)").replace(
        "import torch\n", "import mx_ops\nimport torch\n"
    )
    target = CLASS_BASE.replace("= FooAttention()", "= FooAttention()\n        self.extra = FooAttention()")
    target = target.replace("return ops.rms_norm(h)", "h = ops.rms_norm(h)\n        return ops.rms_norm(h)")
    merged = port(CLASS_BASE, local, target)
    assert "self.extra = MacaFooAttention()" in merged.code and "class MacaFooModel" in merged.code
    assert "class FooAttention" not in merged.code and "ops.rms_norm" not in merged.code.replace("mx_ops.rms_norm", "")
    kinds = {(r.kind, r.upstream, r.local) for r in derive(CLASS_BASE, local)}
    assert ("rename", "FooAttention", "MacaFooAttention") in kinds
    assert ("substitution", "ops.rms_norm", "mx_ops.rms_norm") in kinds


def test_upstream_relative_imports_become_absolute_in_the_module_they_came_from() -> None:
    module = cst.parse_module("from .utils import maybe_prefix\nfrom ..layers import x\n")
    absolute = absolute_imports(module, "vllm.model_executor.models.foo", False).code
    assert (
        absolute
        == "from vllm.model_executor.models.utils import maybe_prefix\nfrom vllm.model_executor.layers import x\n"
    )


EXT_BASE = """\
class SharedHead:
    pass


class DeepSeekMTP:
    def forward(self, h):
        return h

    def load_weights(self, w):
        return w
"""


def test_an_extension_keeps_its_overrides_merged_and_leaves_the_rest_upstream() -> None:
    local = (
        "from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP\n\n\n"
        "class AscendDeepSeekMTP(DeepSeekMTP):\n    def forward(self, h):\n        return h  # npu\n"
    )
    target = EXT_BASE.replace("        return h\n", "        h = h + 1\n        return h\n", 1)
    target += "\n\nclass NewUpstream:\n    pass\n"
    counterparts = {"vllm.model_executor.models.deepseek_mtp"}
    merged = port(EXT_BASE, local, target, counterparts=counterparts)
    assert "class SharedHead" not in merged.code and "class NewUpstream" not in merged.code
    assert "class AscendDeepSeekMTP(DeepSeekMTP)" in merged.code and "load_weights" not in merged.code
    assert "h = h + 1" in merged.code and "return h  # npu" in merged.code
    assert actions(merged)["class:SharedHead"] == "upstream_only"
    assert actions(merged)["class:AscendDeepSeekMTP/def:load_weights"] == "upstream_only"


def test_an_override_that_calls_super_keeps_its_body_and_says_why() -> None:
    local = (
        "from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP\n\n\n"
        "class AscendDeepSeekMTP(DeepSeekMTP):\n    def load_weights(self, w):\n"
        "        return super().load_weights(rename(w))\n"
    )
    target = EXT_BASE.replace("        return w\n", "        w = w + 1\n        return w\n")
    merged = port(EXT_BASE, local, target, counterparts={"vllm.model_executor.models.deepseek_mtp"})
    assert not merged.conflicts and "return super().load_weights(rename(w))" in merged.code
    (decision,) = [d for d in merged.decisions if d.key == "class:AscendDeepSeekMTP/def:load_weights"]
    assert decision.action == "kept" and "super().load_weights" in decision.why


def test_a_local_addition_follows_everything_the_local_file_had_before_it() -> None:
    # local: a, b, then its own class using b; target reorders to b, a: the class still follows both
    base = "from m import a\nfrom n import b\n"
    local = base + "\n\nclass Local(b):\n    pass\n"
    target = "from n import b\nfrom m import a\n"
    merged = port(base, local, target)
    assert merged.code.index("class Local") > merged.code.index("from m import a")
    assert merged.code.index("class Local") > merged.code.index("from n import b")


def test_verification_finds_a_name_read_on_load_above_its_binding() -> None:
    result = Verification(parses=True)
    check_order(ast.parse("class A(B):\n    pass\n\n\nfrom m import B\n"), result)
    assert result.used_before_bound == ["line 1: B (bound at line 5)"] and not result.passed
    fine = Verification(parses=True)
    check_order(ast.parse("from m import B\n\n\nclass A(B):\n    def f(self):\n        return C\n\n\nC = 1\n"), fine)
    assert fine.used_before_bound == []


def test_an_extension_adds_the_upstream_helpers_and_imports_its_merged_code_reads() -> None:
    base = "import torch\n\n\nclass LlamaMLP:\n    pass\n\n\nclass LlamaAttention:\n    def forward(self, x):\n"
    base += "        x = self.qkv(x)\n        return self.o(x)\n"
    local = "from vllm.model_executor.models.llama import LlamaMLP\n\n\n" + base.split("\n\n\n", 2)[2].replace(
        "x = self.qkv(x)", "x = self.qkv(x).contiguous()  # maca"
    )
    target = base.replace("import torch\n", "import torch\nfrom vllm.utils import rotate\n")
    target = target.replace("class LlamaMLP:", "def _scale(x):\n    return x\n\n\nclass LlamaMLP:")
    target = target.replace("        return self.o(x)", "        x = rotate(_scale(x))\n        return self.o(x)")
    merged = port(base, local, target, counterparts={"vllm.model_executor.models.llama"})
    assert "x = rotate(_scale(x))" in merged.code and "x = self.qkv(x).contiguous()  # maca" in merged.code
    assert "def _scale(x)" in merged.code and "from vllm.utils import rotate" in merged.code
    assert "class LlamaMLP" not in merged.code  # still read from upstream
    assert actions(merged)["def:_scale"] == "added_upstream"


def test_repeated_blocks_meet_the_base_block_they_are_most_like_not_the_one_at_their_position() -> None:
    block = "if envs.USE_A:\n    {}\n"
    base = block.format("kernel_a()\n    tune_a()") + "\n" + block.format("kernel_b()\n    tune_b()")
    local = base.replace("    tune_b()\n", "    tune_b()\n    MACA_FALLBACK = True\n")
    target = block.format("kernel_c()\n    tune_c()") + "\n" + base
    code = port(base, local, target).code
    assert code.index("MACA_FALLBACK = True") > code.index("kernel_b()")
    assert code.count("MACA_FALLBACK") == 1 and "kernel_c()" in code


def test_one_edited_line_of_upstream_vocabulary_is_no_substitution() -> None:
    base = "import torch\n\n\ndef act(x):\n    return torch.sigmoid(x)\n\n\ndef other(x):\n    return x\n"
    local = base.replace("torch.sigmoid(x)", "torch.tanh(x)")
    target = base.replace("def other(x):\n    return x", "def other(x):\n    return torch.sigmoid(x) * 2")
    assert derive(base, local) == []
    assert "return torch.sigmoid(x) * 2" in port(base, local, target).code


def test_a_rename_never_reaches_parameters_or_keywords() -> None:
    base = "class Foo:\n    pass\n\n\ndef build(Foo=None):\n    return make(Foo=Foo)\n"
    local = base.replace("class Foo:", "class MacaFoo:")
    target = base + "\n\ndef more():\n    return Foo()\n"
    code = port(base, local, target).code
    assert "def build(Foo=None):" in code and "make(Foo=Foo)" in code and "return MacaFoo()" in code


def test_one_line_class_bodies_changed_on_both_sides_keep_both_changes() -> None:
    base = "class Cfg(Base): x = 1\n"
    merged = port(base, "class Cfg(Base, Maca): x = 1\n", "class Cfg(Base): x = 2\n")
    assert "pass" not in merged.code and ("x = 1" in merged.code or merged.conflicts)
    assert "Maca" in merged.code
