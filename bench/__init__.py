"""The benchmark scripts, run from the repository root as `python -m bench.NAME` (bench/README.md
says what each measures and how it was run). The modules that are not scripts hold parts of them:
`served_questions` (what the benchmarks over a home's questions share), `bakeoff_runs`
(bench_readers'), `live_stream` (bench_live's streamed schedule) and `scale_load` (bench_scale's load)."""
