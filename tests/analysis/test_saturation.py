from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from moestab.analysis.saturation import router_saturation
from moestab.analysis.synthetic import synthetic_routes
from moestab.probes.collect import record_batches
from tests.support.naive import decision_overlaps


def test_saturation_against_itself_is_one():
    a, _ = synthetic_routes(50, 3, 4, 16, seed=0)
    table = router_saturation(a, a)
    assert table["saturation"].tolist() == [1.0, 1.0, 1.0]
    assert table["saturation_top1"].tolist() == [1.0, 1.0, 1.0]
    assert table["tokens"].tolist() == [50, 50, 50]


def test_hand_worked_saturation():
    # 3 tokens, 1 layer, top-2 (slot 0 = highest score).
    ref = np.array([[[0, 1]], [[2, 3]], [[4, 5]]], np.int16)
    # token 0 {1, 0}: 2 shared, top-1 differs; token 1 {2, 7}: 1 shared, top-1 same; token 2: -1, left out
    other = np.array([[[1, 0]], [[2, 7]], [[4, -1]]], np.int16)
    row = router_saturation(other, ref, layers=[11]).iloc[0]
    assert row["layer"] == 11 and row["tokens"] == 2
    assert row["saturation"] == pytest.approx((2 / 2 + 1 / 2) / 2)  # 0.75
    assert row["saturation_top1"] == pytest.approx(0.5)


def test_saturation_matches_python_sets():
    a, b = synthetic_routes(300, 4, 4, 16, flip=0.4, reorder=0.3, seed=2)
    table = router_saturation(b, a)
    overlaps = decision_overlaps(b, a)
    for layer in range(4):
        expected = np.mean([overlaps[t][layer] / 4 for t in range(300)])
        top1 = np.mean([b[t, layer, 0] == a[t, layer, 0] for t in range(300)])
        assert table.loc[layer, "saturation"] == pytest.approx(expected)
        assert table.loc[layer, "saturation_top1"] == pytest.approx(top1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from moestab.models import EmbeddedModelSpec, build_embedded_policy, save_policy

    root = tmp_path_factory.mktemp("ckpts")
    paths = []
    for seed in (0, 1):
        model, tokenizer = build_embedded_policy(EmbeddedModelSpec(seed=seed, num_layers=2, hidden_size=32))
        paths.append(save_policy(model, tokenizer, root / f"seed{seed}"))
    return paths


def test_checkpoint_saturation(checkpoints):
    from transformers import AutoModelForCausalLM

    from moestab.routing import RoutingRecorder

    ref, other = checkpoints
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 40, (5, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[3, :5] = 0
    # What the saturation probe does: record each checkpoint on the same tokens, compare with the reference's.
    records = {path: record_batches(AutoModelForCausalLM.from_pretrained(path).eval(), ids, mask, batch_size=2)
               for path in (ref, other)}
    table = pd.concat([router_saturation(records[path].routes, records[ref].routes, layers=records[path].layers)
                       .assign(checkpoint=str(path)) for path in (ref, other)], ignore_index=True)
    assert table["checkpoint"].tolist() == [str(ref)] * 2 + [str(other)] * 2
    mine = table[table["checkpoint"] == str(ref)]
    assert mine["saturation"].tolist() == [1.0, 1.0] and mine["tokens"].tolist() == [int(mask.sum())] * 2

    # Independently: one forward of each model under the recorder, sets per real token.
    recorded = []
    for path in (ref, other):
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        with torch.no_grad(), RoutingRecorder(model) as rec:
            model(input_ids=ids, attention_mask=mask)
        recorded.append(rec.routes.indices)
    theirs = table[table["checkpoint"] == str(other)].reset_index(drop=True)
    for layer in range(2):
        shares, top1 = [], []
        for row in range(5):
            for pos in range(9):
                if mask[row, pos]:
                    r = recorded[0][row, pos, layer].tolist()
                    o = recorded[1][row, pos, layer].tolist()
                    shares.append(len(set(r) & set(o)) / len(r))
                    top1.append(r[0] == o[0])
        assert theirs.loc[layer, "saturation"] == pytest.approx(np.mean(shares))
        assert theirs.loc[layer, "saturation_top1"] == pytest.approx(np.mean(top1))
    assert theirs["saturation"].lt(1).any()  # two different random models do not route alike


def test_probe_routes_skip_padding(checkpoints):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoints[0])
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    record = record_batches(model, ids, mask, batch_size=1)
    assert record.routes.shape == (5, 2, 2) and record.routes.dtype == np.int16 and (record.routes >= 0).all()
    assert len(record.layers) == 2
    # Left padding: the first row's real tokens are its positions 0 and 1; each text's last token has no next token.
    assert record.text.tolist() == [0, 0, 1, 1, 1] and record.position.tolist() == [0, 1, 0, 1, 2]
    assert np.isnan(record.logp[[1, 4]]).all() and np.isfinite(record.logp[[0, 2, 3]]).all()
