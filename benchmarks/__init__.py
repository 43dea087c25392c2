"""OraPO's benchmarks: one module per tool, each run from the checkout's root as `python -m benchmarks.NAME`.

    .venv/bin/python -m benchmarks.bench_decode [ARGS]
    orapo bench decode [ARGS]          # the same, from anywhere in a source checkout; `orapo bench` lists them

A benchmark imports the engine, the app and the database layer (and `tests.support`, the test helpers some of
them drive) by their public names only, and edits no import path: the package is importable from the root (as
`python -m` and pytest's `pythonpath = ["."]` make it). Modules without a command line are shared code
(`ablation`: the learning benchmark's harness; `round_story_common`: what the clinic-story tools share).
`results/` holds recorded outputs, never scripts (tests/test_bench_package.py checks all three rules).
"""
