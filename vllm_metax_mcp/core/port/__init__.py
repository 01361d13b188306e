"""Carrying a fork onto the target release: a structure-aware three-way merge, verified.

Modules:

- `units`: a module or class body as keyed units (symbols, members, import statements).
- `lines3`: the line-level three-way merge used inside a unit both sides changed.
- `contract`: the MetaX contract of one fork (import swaps, renames, substitutions), read from base
  and local, applied to target code; upstream relative imports made absolute.
- `imports`: import statements in the merge (names merged, removed-upstream imports split per name).
- `merge`: the merge of one file, unit by unit, with a decision for each and conflicts kept both ways.
- `usage`: what a merged module reads and binds (the tentative units it needs, the names it lacks).
- `verify`: the checks an output passes (parses, imports resolve, differences accounted, nothing lost).
- `port`: the port_model workflow over diff_model's pairing and closest releases.
- `report`: what a port writes (files, port_report.json, PORT_REPORT.md, port.patch), whole or nothing.

Serves port_model. Depends on `foundation`, `sources`, `code`, `compare` and `audit` (the declared release).
"""
