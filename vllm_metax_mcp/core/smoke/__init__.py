"""The smoke room: a real vLLM server started on a model, proven to answer, and stopped with nothing left.

Serves the tool `run_smoke_test` (its job runs `run.run_job`); reads the case format of `core/trim/cases.py`.

- `plan`: the job payload `SmokePlan` and its making from a call (cases, model, settings, run directory, subject).
- `launch_rules`: which environment variables and serve arguments a caller may pass (the allow-lists).
- `readings`: which values could name a file, and the check that none names one outside the roots.
- `devices`: accelerator occupancy (the target's pymxsml / pynvml, else mx-smi / nvidia-smi), whose
  processes are this server's, and the choice of free devices.
- `run`: the run itself (occupancy, launch, health, requests, teardown, evidence) and `run_job`.
- `processes`: the server's process group and marker, and a teardown that never touches another process.
- `ray_cluster`: on a Ray cluster, its free devices before the launch and the end of the server's Ray job.
- `client`: the HTTP client for the server (GET, POST, streamed POST).
- `drafts`: the spec-decode counters that prove a speculative draft (MTP) ran.
- `answers`: one case's requests and the checks of its answers (structure, determinism, keywords).
- `evidence`: the evidence record and the records beside it, the server log's summary, the tool's output.
"""
