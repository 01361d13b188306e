"""The commit audit: every upstream commit in each plugin file's range, decided per (commit, file)
and recorded in a ledger with evidence the server checks. Serves audit_commits; trace_dependency
reads the ledger's annotations and the ledger resource serves the stored file.

- `commits`: a range's commits per tracked upstream file (renames followed), what else each touched and changed;
- `ranges`: each file's base (named, closest release, or recorded), its base..target range and what it tracks;
- `dependents`: the plugin symbols depending on an upstream symbol (copies, subclasses, importers, patches);
- `session`: what every action opens (subjects, pairing inputs, the ledger), how its lists are paged and fitted;
- `scope`: an action's pairing at the target, the files' bases and tracks;
- `counts`: commits with and without an entry, per file and over the range (the status action);
- `listing`: the list action, a page of commits with their files, changed symbols, dependents and entries;
- `decisions`: the record and annotate actions, each proposed item checked and answered on its own;
- `recheck`: the baseline and recheck actions over diff_model's difference matrix;
- `export`: the export action, the ledger as a JSON document and markdown in the state directory;
- `ledger`: the stored ledger (one per plugin repository and target) and the items written into it;
- `checks`: the evidence a decision is accepted with, verified against trees, repositories and state;
- `symbols`: plugin symbols and inventory rows a ledger item names, resolved in the trees;
- `differences`: matrix rows with the identity of their code, baseline rows, and what nothing explains;
- `report`: the export as markdown;
- `lagging`: for the status action, the files whose base is older than the plugin's declared release;
- `local_history`: the local action, the plugin's own commits over a range: moves still named, dropped bindings;
- `arguments`: which arguments each action reads (one it would ignore is refused);
- `steps`: the call to make after each action (next page, the commit to review, the next action).
"""
