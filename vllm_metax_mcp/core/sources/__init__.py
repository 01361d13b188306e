"""Where the code and models a tool reads come from: git repositories, subjects, the HF cache, the
target interpreter and its environment record.

Modules:

- `git_runner`: the hardened git command line (read-only subcommands, programs neutralised, no transport).
- `git_guard`: refuses a repository whose configuration or object store could run programs, fetch, or
  read outside the roots (checked again whenever it changes).
- `git`: `Repository` (opened inside the roots, guarded), commits and objects, the files a work tree tracks.
- `subjects`: the exact code a tool reads: worktree, staged index, a revision, a directory, installed.
- `hub`: a model's files in a local directory or the local Hugging Face cache (never downloaded).
- `interpreters`: which interpreters the server may run, and why each was accepted.
- `environment`: the typed environment record (probe, upstream mapping, confirmation) and the probe.

Serves every tool that opens a plugin or upstream tree (diff_model, trace_dependency, audit_commits,
inspect_config, plan_trim, export_snapshot), environment (the record itself), run_smoke_test and
trace_dependency (the recorded interpreter), inspect_config and plan_trim (models from the HF cache),
and the overwrite rule of every writing tool (`git.tracked_below`). Depends on `foundation` only.
"""
