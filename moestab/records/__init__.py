"""Run folders: the on-disk contract between ``moestab train`` and the analyzers (docs/run-format.md)."""
