"""The ags benchmark: ags against a JSONL file per session, on the same agent work.

Run it with ``uv run python -m bench`` (``--quick`` for a small run, ``--json``
for machine-readable output). Modules: ``conversations`` generates the
workload, ``jsonl_store`` is the baseline, ``scenarios`` does and measures the
work, ``measure`` holds the clocks and the disk meter, ``report`` prints.
"""
