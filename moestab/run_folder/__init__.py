"""Run folders: the on-disk contract between ``moestab train`` and its readers (docs/run-format.md).

The only package that reads or writes a run folder:

- ``folder``    ``RunFolder``: where each file of a run lives; creating, overwriting, resuming and checkpointing a
  run folder, its status and its complete checkpoints (the only code that deletes or lays out run folders)
- ``schema``    file, column and key names; replay-mode labels; step-name parsing
- ``run_info``  ``RunInfo`` / ``ModelInfo``: run.json as typed objects (``read_run_info``)
- ``writer``    ``RunWriter``: run.json, metrics.jsonl, per-token tables, written atomically
- ``reader``    metrics.jsonl and the per-token tables, streamed; ``Skipped`` parts reported, not warned
- ``route_columns``  how the per-token tables' route columns hold expert ids (binary XORs with a reference column,
  version 4; binary, version 3; lists, version 2)
- ``lock``      one writer per run folder (``run_lock``)
- ``files``     how files inside a run folder are written: never through a symbolic link (``PlantedLinkError``)
- ``owned``     whose file a path is (a run's, a model folder's): output files never replace one
- ``errors``    ``NotARunError``, ``SchemaVersionError``, ``RunFolderError``, ``RunFileError``, ``Skipped``
"""

from moestab.run_folder.files import PlantedLinkError
from moestab.run_folder.folder import Remedies, RunFolder, RunFolderError

__all__ = ["PlantedLinkError", "Remedies", "RunFolder", "RunFolderError"]
