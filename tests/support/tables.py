"""Per-token tables read the way docs/run-format.md tells a pandas user to ("Reading the tables with pandas").

For the tests that check moestab's numbers against the raw tables: they read them without moestab's reader, so a
reader bug cannot hide in both sides of a comparison.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from moestab.run_folder import schema


def token_frame(path: str | Path) -> pd.DataFrame:
    """One per-token table as a DataFrame whose route cells are flat int16 arrays of ``layers * top_k`` ids, -1
    where not recorded: what pandas gives for a schema version 2 table (``FixedSizeList<int16>``), and what the
    documented ``numpy.frombuffer`` decoding gives for a version 3 or 4 one (binary, its layout in the schema metadata;
    version 4: each column XORed with its reference chain's)."""
    tokens = pd.read_parquet(path)
    meta = pq.read_schema(path).metadata or {}
    if schema.ROUTES_METADATA_KEY.encode() not in meta:
        return tokens  # version 2: pandas already holds one int16 array a cell
    layout = json.loads(meta[schema.ROUTES_METADATA_KEY.encode()])
    references = layout.get("references", {})
    dtype = np.dtype(layout["dtype"]).newbyteorder("<")
    stored = {column: np.frombuffer(b"".join(tokens[column]), dtype).reshape(len(tokens), -1)  # [tokens, layers * k]
              for column in schema.ROUTE_COLUMNS}
    for column in schema.ROUTE_COLUMNS:
        ids, link = stored[column].copy(), column
        while references.get(link):  # XOR along the chain, to the column stored in full
            link = references[link]
            ids ^= stored[link]
        routes = ids.astype(np.int16)
        routes[ids == layout["absent"]] = -1
        tokens[column] = list(routes)
    return tokens


TOKEN_COLUMNS = [  # the columns of a moestab run's tables, in order
    schema.COL_STEP, schema.COL_SEQ, schema.COL_PROMPT, schema.COL_MINIBATCH, schema.COL_POSITION,
    schema.COL_RESPONSE_LEN, schema.COL_REWARD, schema.COL_ADVANTAGE, schema.COL_LOGP_ROLLOUT, schema.COL_LOGP_OLD,
    schema.COL_LOGP_OLD_FREE, schema.COL_LOGP_UPDATE, schema.COL_LOGP_NEW, schema.COL_LOG_W, schema.COL_CLIPPED,
    schema.COL_ROUTES_ROLLOUT, schema.COL_ROUTES_OLD, schema.COL_ROUTES_OLD_FREE, schema.COL_ROUTES_UPDATE,
    schema.COL_ROUTES_NEW, schema.COL_MARGIN_OLD, schema.COL_CONFIDENCE_OLD,
]

