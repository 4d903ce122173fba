"""Recording under generate() depends on how transformers hands the KV cache to the model: a release that changes it
is named (version, family, what was seen), never an IndexError deep in a metric (moestab.routing.compat)."""

from __future__ import annotations

import pytest
import torch
import transformers

from moestab.models.conformance import tiny_model
from moestab.models.embedded import build_embedded_policy
from moestab.models.families import TINY_CONFIGS
from moestab.routing import IncompatibleTransformersError, RecordingError, Routes
from moestab.routing import forward_call as forward_call_module
from moestab.routing.compat import check_generate_recording, expect_coverage


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_start_up_check_passes_on_every_family(family, dtype):
    check_generate_recording(tiny_model(family, dtype=dtype))


def test_start_up_check_leaves_the_model_as_it_was():
    model, _ = build_embedded_policy()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check_generate_recording(model)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_cache_under_an_unknown_keyword_is_refused_with_the_version(monkeypatch):
    # As if transformers renamed the cache keyword again: whatever name this release uses is now unknown.
    monkeypatch.setattr(forward_call_module, "CACHE_KEYWORDS", ("a_keyword_no_release_uses",))
    model, _ = build_embedded_policy()
    with pytest.raises(IncompatibleTransformersError) as caught:
        check_generate_recording(model)
    message = str(caught.value)
    assert f"transformers {transformers.__version__}" in message
    assert "qwen3_moe" in message and "DynamicCache" in message
    assert "pip install 'transformers==" in message


def test_decode_steps_not_recognised_are_refused_with_what_was_seen(monkeypatch):
    # As if the cache were invisible to moestab (transformers 5.24 before the fix): each decode step is recorded as
    # a new batch of sequences, the 5.24 symptom [batch * steps, prompt, layers, top_k].
    monkeypatch.setattr(forward_call_module, "find_cache", lambda kwargs: None)
    model, _ = build_embedded_policy()
    with pytest.raises(IncompatibleTransformersError) as caught:
        check_generate_recording(model, prompt_len=5, new_tokens=3)
    message = str(caught.value)
    assert f"transformers {transformers.__version__}" in message and "qwen3_moe" in message
    # 2 prompts: a prefill of 5 positions and 2 decode steps (the third token is never fed) -> 2 + 2 + 2 rows
    # of the prefill's 5 positions; the sequences are [2, 5 + 3 - 1] = [2, 7].
    assert "routes of shape [6, 5, 4, 2] for sequences [batch, seq] = [2, 7]" in message


def _routes(valid: torch.Tensor) -> Routes:
    """Routes ``[batch, seq, 1 layer, top_k=2]`` with expert 0 and 1 where ``valid`` and -1 elsewhere."""
    indices = torch.tensor([0, 1], dtype=torch.int16).expand(*valid.shape, 1, 2).clone()
    indices[~valid] = -1
    return Routes(indices=indices, layers=(0,), num_experts=4)


def test_expect_coverage_hand_cases():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # row 0 left-padded
    expect_coverage(_routes(mask.bool()), mask, family="f", where="w")  # exactly the real positions: fine
    missing = mask.bool().clone()
    missing[1, 2] = False  # one real position without a route
    with pytest.raises(IncompatibleTransformersError, match=r"1 real position\(s\) have no route and 0 padding"):
        expect_coverage(_routes(missing), mask, family="f", where="w")
    extra = torch.ones(2, 3, dtype=torch.bool)  # the padding position routed
    with pytest.raises(IncompatibleTransformersError, match=r"0 real position\(s\) have no route and 1 padding"):
        expect_coverage(_routes(extra), mask, family="f", where="w")
    with pytest.raises(IncompatibleTransformersError, match=r"shape \[2, 2, 1, 2\] .* = \[2, 3\]: the shape"):
        expect_coverage(_routes(torch.ones(2, 2, dtype=torch.bool)), mask, family="f", where="w")


def test_positions_fed_after_eos_may_hold_routes_until_the_engine_masks_them():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # row 0 finished: generate() fed it padding at position 2
    routes = _routes(torch.ones(2, 3, dtype=torch.bool))
    routes = Routes(indices=routes.indices, layers=(0,), num_experts=4, gates=torch.rand(2, 3, 1, 2),
                    entropy=torch.rand(2, 3, 1))
    expect_coverage(routes, mask, family="f", where="w", exact=False)
    masked = routes.masked(mask.bool())
    expect_coverage(masked, mask, family="f", where="w")  # now exactly the real positions
    assert masked.indices[0, 2].tolist() == [[-1, -1]] and masked.gates[0, 2].isnan().all()
    assert masked.entropy[0, 2].isnan().all() and torch.equal(masked.gates[1], routes.gates[1])


def test_incompatible_is_a_recording_error():
    assert issubclass(IncompatibleTransformersError, RecordingError)


def test_train_refuses_an_incompatible_transformers_before_writing_the_run(monkeypatch, tmp_path):
    from moestab.run_folder import schema
    from moestab.train import TrainingError, train
    from tests.support.train import tiny_config

    monkeypatch.setattr(forward_call_module, "find_cache", lambda kwargs: None)
    config = tiny_config(tmp_path / "run", tmp_path / "cache")
    with pytest.raises(TrainingError, match=rf"transformers {transformers.__version__} \(family qwen3_moe\)"):
        train(config, log=lambda _: None)
    assert not (tmp_path / "run" / schema.RUN_JSON).exists()
    assert not any((tmp_path / "cache").rglob("*.safetensors"))  # refused before the warm start built a base


def test_train_refuses_an_incompatible_transformers_for_a_given_model_folder(monkeypatch, tmp_path):
    from moestab.models.embedded import save_policy
    from moestab.run_folder import schema
    from moestab.train import TrainingError, train
    from tests.support.train import tiny_config

    folder = save_policy(*build_embedded_policy(), tmp_path / "model")  # a model given by path: no warm start
    monkeypatch.setattr(forward_call_module, "find_cache", lambda kwargs: None)
    config = tiny_config(tmp_path / "run", tmp_path / "cache", model=str(folder))
    with pytest.raises(TrainingError, match=rf"transformers {transformers.__version__} \(family qwen3_moe\)"):
        train(config, log=lambda _: None)
    assert not (tmp_path / "run" / schema.RUN_JSON).exists()
