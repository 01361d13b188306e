"""The ground every tool stands on: errors, the path policy, the state directory, results, jobs.

Modules:

- `errors`: `ToolFailure` and its stable error codes, raised by every layer.
- `policy`: the path chokepoint (read roots, output roots, protected paths, review/edit mode) and `Effect`.
- `state`: the server's state directory, shared by several servers (locked, atomic JSON).
- `atomic`: outputs that appear whole or not at all, and the marker that lets an earlier output be replaced.
- `results`: result ids (every output can be cited later), digests and paging.
- `evidence`: the typed evidence items a recorded decision rests on.
- `safe_load`: limits on tool arguments, JSON and YAML, enforced before any work.
- `isolated`: running a script in the target interpreter, and telling how it ended.
- `jobs`: long work as detached, cancellable jobs with a heartbeat.
- `worker`: the job worker process, which rebuilds a job's typed payload and runs its target.
- `progress`: phase-weighted progress reported from anywhere in core, and its strictly increasing forwarding.
- `process_call`: a CPU-heavy call in a forked worker of its own process group: progress back, clean kills.

Serves every tool (the dispatcher, the MCP server and the CLI included); `jobs` and `worker` serve
trim_model, run_smoke_test and the `jobs` tool; `isolated` serves environment, inspect_config,
trace_dependency and run_smoke_test; `evidence` serves audit_commits, diff_model and trace_dependency.
Depends on nothing else in `core`.
"""
