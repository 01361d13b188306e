"""Comparing plugin files with upstream vLLM: true counterparts, symbol and line differences, releases.

Modules:

- `inputs`: what a comparison starts from (the Python files under the paths, the plugin package
  they lie in, checked mapping overrides, the files that register architectures) and how results
  name the upstream target.
- `pairs`: both sides of a comparison (`Trees`, the plugin's `PluginPackage`) and the records
  pairing produces (`Pair`, `Rule`, `Status`, `TargetOnly`, `Pairing`).
- `pairing`: the pairing rules in their order and `pair_files`, which runs them.
- `pairing_context`: what the rules share (family layouts, the upstream symbol table, class bases).
- `affixes`: the vendor affixes a plugin adds to the upstream names it forks, read from its names.
- `registry_pairs`: the registry rule's evidence (registered architecture -> upstream module and file).
- `import_sites`: the import-site rule (what paired files import pairs the modules they import from).
- `packages`: package inference, `__init__` re-exports and name-only twins.
- `family`: the sub-directories of an upstream model family as an out-of-tree platform sees them.
- `history`: where a path counterpart was deleted upstream (the history rule).
- `content`: content similarity after the rules: candidates and flags, never a decision.
- `target_only`: the upstream files of the mapped directories nothing pairs with.
- `symdiff`: symbol-level differences (by body hash), renames and import swaps.
- `textdiff`: line statistics (cached by blob pair), the unified diff, line similarity.
- `releases`: each file's counterpart and distance at each release; its closest release; families.
- `versions`: the local, target and base versions of a changed file, parsed and indexed by line.
- `classify`: the classes a MACA edit is proposed under, from the lines it changed.
- `matrix`: the difference matrix, one row per differing symbol with a proposed class.
- `describe`: one pair as diff_model reports it (statistics, parse errors, symbols, unified diff).
- `model_diff`: the diff_model workflow, from the request to one paged detail level.

Serves diff_model (all of it) and audit_commits (inputs, pairing, releases, the matrix rows it
imports as its baseline, textdiff). Depends on `foundation`, `sources` and `code`.
"""
