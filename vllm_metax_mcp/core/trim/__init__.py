"""Depth trims of a checkpoint: which layers to keep so every distinct path stays covered, the rewritten
config, budgets, and the dummy or real-weight output written whole or not at all.

Modules:

- `plan`: the plan (`make_plan`): selection, rewrite, budgets, coverage, notes, assets and smoke cases.
- `selection`: the distinct paths of a decoder and the fewest layers that cover them.
- `coverage`: the coverage table: per path, the kept layers, why, and the request that reaches it.
- `config_rewrite`: the raw config.json of the trimmed model, every rewritten rule proven by re-analysis.
- `budget`: per-rank parameter, KV-cache and state bytes, and what to change when it does not fit.
- `parallel_notes`: TP/EP limits of the kept widths and what each pipeline stage holds.
- `assets`: the tokenizer/processor assets a dummy load needs, smoke case needs, related examples.
- `cases`: the smoke-case file format (smoke_cases.yaml and tools/batched_test files); run_smoke_test reads it.
- `report`: what a plan shows beside itself: model label, readers of changed fields, examples.
- `readers`: the search for the code that reads each changed field, kept by the searched trees' content.
- `output`: the manifest, the validating run_smoke_test call, and the dummy output.
- `weight_map`: which source tensors a real trim keeps, under which names, in which output shard.
- `real_checks`: every check of a real-weight trim that refuses before a byte is written.
- `real`: the real-weight copy job (`RealTrimJob`, `run_job`): copy, verify, prove extract.py.

Serves plan_trim and trim_model; `cases` also serves run_smoke_test (and core/smoke). Depends on
foundation, sources, checkpoint and target.
"""
