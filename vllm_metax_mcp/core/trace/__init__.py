"""A model's dependency trace: the walk from its registrations, and what the checks find on the path.

Modules:

- `run`: one trace call: the indexes, the walk (or the reverse walk to consumers), the checks,
  the annotations and the counts of every list.
- `entry`: where a trace starts: the architecture's plugin and upstream registrations, and the model
  they define.
- `walk`: the breadth-first walk through imports and re-exports to the boundaries, the reverse walk
  to consumers, and the boundaries and inactive files it leaves.
- `stability`: where a trace stops: upstream modules whose used definitions did not change between
  base and target (stable interfaces), every importer of a node, and the `changes` view.
- `annotations`: inventory rows' upstream counterparts, MetaX differences, upstream deltas and the
  dispositions the audit ledger records.
- `checks`: the second pass over the path (overrides, ops, kernels, defects, config rewrites,
  weight loading) and the interpreter the op probe runs in.
- `defects`: the defect record; unresolved and breaking imports, changed override targets, ops not found.
- `moves`: where a name lost at the target went (moved, renamed, a submodule, a third-party import),
  and upstream module attributes used through imports.
- `base_init`: subclasses whose `__init__` skips the base's while inherited methods need it.
- `signatures`: calls, overrides and JIT launches that no longer fit the target's signatures.
- `inherited`: what plugin subclasses of upstream classes override, inherit and linearize (MRO)
  that changed between base and target.
- `kernels`: ops on the path against the installed binaries (the op probe), and JIT kernel launches
  (through names chosen among kernels), checked against the kernels at target and base.
- `build_ops`: the plugin build's extension behind each op's namespace, its switch, and the
  precompiled package a switch takes instead.
- `loading`: config rewrites to the model's architectures, and the model's weight loading.
- `revisions`: the upstream commits (or releases) between base and target, read lazily, bisected for the
  first break and its first release.

Serves trace_dependency. Depends on `foundation`, `sources`, `code` and `target` (the op probe script).
"""
