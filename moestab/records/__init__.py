"""Run folders: the on-disk contract between ``moestab train`` and its readers (docs/run-format.md).

The only package that reads or writes a run folder:

- ``schema``    file, column and key names; replay-mode labels; step-name parsing
- ``run_info``  ``RunInfo`` / ``ModelInfo``: run.json as typed objects (``read_run_info``)
- ``writer``    ``RunWriter``: run.json, metrics.jsonl, per-token tables, written atomically
- ``reader``    metrics.jsonl and the per-token tables, streamed; ``Skipped`` parts reported, not warned
- ``errors``    ``NotARunError``, ``SchemaVersionError``, ``RunFileError``, ``Skipped``
"""
