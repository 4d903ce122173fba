"""--model embedded:layers=...,experts=...,top_k=...,hidden=...: variants of the embedded policy."""

from __future__ import annotations

import json

import pytest

from moestab.models import EmbeddedModelSpec, parse_model_spec
from moestab.run_folder import schema
from moestab.run_folder.reader import read_routes
from moestab.train import train
from tests.support.train import tiny_config


def test_spec_parses_with_defaults_for_unset_keys():
    assert parse_model_spec("embedded") == EmbeddedModelSpec()
    spec = parse_model_spec("embedded:layers=8,experts=32,top_k=4,hidden=256", seed=3)
    assert (spec.num_layers, spec.num_experts, spec.top_k, spec.hidden_size, spec.seed) == (8, 32, 4, 256, 3)
    assert parse_model_spec("embedded:family=olmoe").family == "olmoe"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("embedded:depth=8", "unknown key 'depth'; valid: layers, experts, top_k, hidden, family"),
        ("embedded:experts=4,top_k=8", "top_k=8 exceeds experts=4"),
        ("embedded:hidden=130", "hidden=130 must be a multiple of 4"),
        ("embedded:layers=0", "layers='0' must be an integer >= 1"),
        ("embedded:layers=two", "layers='two' must be an integer >= 1"),
        ("embedded:family=llama", "unknown family 'llama'; valid: "),
        ("embeded:layers=8", "only the embedded policy takes a spec"),
        ("embedded:", "has ':' but no parameters"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_model_spec(spec)


def test_a_bad_spec_is_refused_before_anything_is_written(tmp_path, capsys):
    from moestab.cli import main

    assert main(["train", "--model", "embedded:layers=x", "--out", str(tmp_path / "run")]) == 2
    assert "model: model spec 'embedded:layers=x': layers='x' must be an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_2_4_8_and_16_layer_variants_train_record_and_cache_on_their_own_keys(tmp_path):
    cache = tmp_path / "cache"
    for layers in (2, 4, 8, 16):
        run = tmp_path / f"l{layers}"
        train(tiny_config(run, cache, steps=1, model=f"embedded:layers={layers}"), log=lambda s: None)
        info = json.loads((run / schema.RUN_JSON).read_text())
        assert info["model"]["num_layers"] == layers and info["status"] == "finished"
        assert info["warm_start"]["record"]["spec"]["model"]["num_layers"] == layers
        routes = read_routes(run / schema.tokens_file(1), schema.COL_ROUTES_OLD_FREE, top_k=2)  # [tokens, layers, 2]
        assert routes.shape[1] == layers
    bases = sorted(p.name for p in (cache / "bases").iterdir() if p.is_dir())  # each entry has its .lock beside it
    assert len(bases) == 4 and len({name.split("-")[-1] for name in bases}) == 4  # one cache key per variant
