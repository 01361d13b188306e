"""The plugin's and upstream's Python code, read statically: what each file imports, defines and registers.

Modules:

- `scanner`: one file's index record (imports under their guards, definitions with body hashes and
  signatures, names used, torch ops), as positional JSON rows, built for speed.
- `module_index`: the records of whole trees, cached by blob sha (shards and per-tree bundles), and
  the module index that resolves names and relative imports across them.
- `fact_cache`: small per-file JSON facts of the mechanism scanners, cached by blob sha.
- `dispatch`: which branch of import-time platform dispatch an out-of-tree platform takes.
- `codebase`: the plugin and upstream indexed together: where a name really comes from, what a
  dotted expression refers to, a module's AST, file evidence.
- `registration`: where an architecture is registered (plugin `register_model` calls, upstream
  registry tables).
- `override_scan`: per-file facts of override mechanisms (decorations, patches, `sys.modules`
  replacement, class paths a platform returns), and their records.
- `overrides`: those facts resolved: custom ops, quant configs, attention backends, patches and
  same-path modules, each with the upstream symbol it replaces; class chains.
- `plugin_facts`: what the plugin's own source says about MACA (platform answers, ops it registers).
- `op_scanners`: `torch.ops` uses and op registrations (C++ `TORCH_LIBRARY` blocks, Python custom ops).

Serves trace_dependency (directly and through `trace`), diff_model (through `compare`) and
audit_commits (through `audit`). Depends on `foundation` and `sources`.
"""
