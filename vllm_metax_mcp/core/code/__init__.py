"""The plugin's and upstream's Python code, read statically: what each file imports, defines and registers.

Modules:

- `scanner`: one file's index record (imports under their guards, definitions with body hashes and
  signatures, names used, torch ops), as positional JSON rows, built for speed.
- `import_scan`: the statements of a file that import (under their guards, inside functions, under
  `TYPE_CHECKING`) and the module-loader calls whose names its literals decide.
- `literals`: the strings a file's own literals decide (module names, load paths).
- `outline`: a file's top-level classes and functions and its import lines without `ast`: the
  whole-tree pass, checked against `ast` on real releases.
- `module_index`: the module index of whole trees: outlines for every file, full records made when a
  call looks into a module; it resolves names and relative imports across them.
- `blob_store`: per-blob scan results in the state directory (shards and per-tree bundles), scanned
  in worker processes when many miss.
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
- `patch_forms`: what a file runs beyond its imports: patch helpers recognised by their bodies,
  modules bound from strings, calls naming dotted paths, per function its calls and class paths.
- `activity`: whether each patch runs: reached from the plugin's entry points (packaging metadata)
  through imports, calls, class paths and upstream hooks, and under which conditions.
- `conditions`: the conditions guards put on code (`if` tests as opaque pairs, literals decided),
  merged over the ways to it.
- `plugin_facts`: what the plugin's own source says about MACA (platform answers, ops it registers).
- `op_scanners`: `torch.ops` uses and op registrations (C++ through `native_scan`, Python custom ops
  with their defs, kernels per dispatch key and fakes).
- `native_scan`: the text scan of C/C++/CUDA sources: every `TORCH_LIBRARY*` family (stable ABI
  included), its `def` schemas and `impl` dispatch keys.
- `build_files`: the extension modules a build compiles (setup.py and CMake, one entry each), the
  environment switch that gates each, and the precompiled packages a switch takes kernels from.
- `build_switches`: the environment switches of a build file and the direction each decides.
- `build_cmake`: the Python extension targets of the CMake files a build reaches.

Serves trace_dependency (directly and through `trace`), diff_model (through `compare`) and
audit_commits (through `audit`). Depends on `foundation` and `sources`.
"""
