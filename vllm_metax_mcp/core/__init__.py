"""Everything the tools do, by domain; nothing here imports MCP. pydantic appears only at edges: stored
job payloads, evidence items and smoke-case files a caller writes.

Packages:

- `foundation`: errors, the path policy, the state directory, atomic outputs, results and paging,
  evidence items, input limits, isolated target runs, jobs and their worker.
- `sources`: git (runner, guard, repository), subjects, the HF cache, interpreters, the environment record.
- `code`: the Python scanner, module index, fact cache, dispatch evaluation, codebase, registrations,
  overrides, plugin facts, op scanners.
- `compare` and `trace` (both on `code`): pairing plugin and upstream code, symbol and text diffs,
  releases and the difference matrix; dependency walks, their checks, kernels, defects, revisions,
  config and weight-loading paths.
- `audit` (on `compare` and `code`): commits, ranges, dependents, the audit session and its ledger.
- `port` (on `compare`, `audit` and `code`): the structural three-way merge of forks onto the target, verified.
- `checkpoint`: config layout, cross-checks, safetensors headers, consumers, construction, id lists;
  `trim` builds on it (plan, selection, budget, config rewrite, assets, real trims, weight maps, cases).
- `smoke`: processes, client, answer checks, the run, launch rules, devices; it reads `trim.cases`.
- `target`: the scripts run inside the target interpreter (stdlib only, Python >= 3.8); depends on nothing.

Order: foundation <- sources <- code <- {compare, trace}; compare <- audit <- port; sources <- checkpoint <- trim;
smoke reads trim.cases; every package may run a `target` script, and target depends on nothing. No
circles: tests/test_layout.py checks every import against this order.
"""
