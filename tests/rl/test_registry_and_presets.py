"""Loss registry, presets and input validation: names, published numbers, error messages."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from moestab.rl import (
    LOSSES,
    PRESETS,
    AlgorithmPreset,
    UnknownNameError,
    compute_advantages,
    compute_clipped_mask,
    compute_policy_loss,
    get_loss,
    get_preset,
    policy_loss,
)
from tests.support.rl import random_batch


def test_unknown_loss_lists_valid_names():
    with pytest.raises(UnknownNameError) as info:
        get_loss("ppo")
    message = str(info.value)
    assert message.startswith("unknown policy loss 'ppo'")
    for name in LOSSES:
        assert name in message
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    with pytest.raises(KeyError, match="cispo, gmpo, ppo-clip, rspo"):
        compute_policy_loss("nope", logp=torch.zeros(1, 1))


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="unknown algorithm preset 'ppo'") as info:
        get_preset("ppo")
    assert set(info.value.valid) == {"grpo", "gspo", "gspo-token", "dapo", "dr-grpo", "cispo", "gmpo", "rspo"}


def test_published_preset_numbers():
    expected = {
        # name: (loss, level, clip_low, clip_high, aggregation, advantage)
        "grpo": ("ppo-clip", "token", 0.2, 0.27, "seq-mean-token-mean", "group-normalized"),
        "gspo": ("ppo-clip", "sequence", 3e-4, 4e-4, "seq-mean-token-mean", "group-normalized"),
        "gspo-token": ("ppo-clip", "sequence-token", 3e-4, 4e-4, "seq-mean-token-mean", "group-normalized"),
        "dapo": ("ppo-clip", "token", 0.2, 0.28, "token-mean", "group-normalized"),
        "dr-grpo": ("ppo-clip", "token", 0.2, 0.2, "seq-mean-token-sum-norm", "group-centered"),
        "cispo": ("cispo", "token", 1.0, 4.0, "token-mean", "group-normalized"),
        "gmpo": ("gmpo", "token", 0.4, 0.4, "seq-mean-token-mean", "group-normalized"),
        "rspo": ("rspo", "token", 0.2, 0.27, "seq-mean-token-mean", "group-normalized"),
    }
    assert set(PRESETS) == set(expected)
    for name, values in expected.items():
        p = get_preset(name)
        assert (p.loss, p.level, p.clip_low, p.clip_high, p.aggregation, p.advantage) == values, name
        assert p.kl_coef == 0.0 and p.name == name and p.citation
    assert get_preset("rspo").gamma_min == 0.1


def test_presets_are_frozen_and_validated():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_preset("grpo").clip_low = 0.3  # type: ignore[misc]
    base = dict(
        name="x",
        loss="ppo-clip",
        level="token",
        clip_low=0.2,
        clip_high=0.2,
        aggregation="token-mean",
        advantage="group-normalized",
        citation="c",
    )
    with pytest.raises(UnknownNameError, match="valid names: cispo, gmpo, ppo-clip, rspo"):
        AlgorithmPreset(**{**base, "loss": "ppo"})
    with pytest.raises(UnknownNameError, match="valid names: sequence, sequence-token, token"):
        AlgorithmPreset(**{**base, "level": "seq"})
    with pytest.raises(UnknownNameError, match="seq-mean-token-mean"):
        AlgorithmPreset(**{**base, "aggregation": "mean"})
    with pytest.raises(ValueError, match="gamma_min"):
        AlgorithmPreset(**{**base, "loss": "rspo"})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_through_the_documented_calling_surface(name):
    """The loop in moestab/rl/__init__.py's docstring, for every preset: advantages from rewards, runtime
    inputs named by the preset, the loss and the clipped mask by name."""
    preset = get_preset(name)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (8,), generator=gen).to(torch.float32)
    advantages = compute_advantages(preset.advantage, rewards, 4)  # [8]
    batch = random_batch(0, 8, 6, dtype=torch.float32, scale=0.01)
    runtime = {}
    for key in preset.runtime_inputs:
        runtime[key] = {
            "norm_constant": 6,
            "router_logp_new": torch.zeros(8, 6, 2, 2),
            "router_logp_old": torch.zeros(8, 6, 2, 2),
        }[key]
    kwargs = dict(
        logp=batch["logp"],
        old_logp=batch["old_logp"],
        advantages=advantages,
        mask=batch["mask"],
        **preset.loss_kwargs(),
        **runtime,
    )
    loss, metrics = compute_policy_loss(preset.loss, **kwargs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(batch["logp"].grad).all()
    assert all(v.dim() == 0 for v in metrics.values())
    clipped = compute_clipped_mask(preset.loss, **kwargs)
    assert clipped.shape == (8, 6) and clipped.dtype == torch.bool and not clipped[~batch["mask"]].any()


def test_registered_losses_share_the_common_signature():
    common = [
        "logp",
        "old_logp",
        "advantages",
        "mask",
        "level",
        "clip_low",
        "clip_high",
        "aggregation",
        "norm_constant",
        "kl_coef",
        "ref_logp",
    ]
    for name, fn in LOSSES.items():
        params = inspect.signature(fn).parameters
        assert set(common) <= set(params), name
        assert set(params) - set(common) == set(fn.inputs), name
        # No hidden defaults for the settings that define an algorithm:
        for required in ("level", "clip_low", "clip_high", "aggregation"):
            assert params[required].default is inspect.Parameter.empty, (name, required)


def _call(**overrides):
    batch = random_batch(0, 3, 4)
    kwargs = dict(level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean", **batch)
    kwargs.update(overrides)
    return policy_loss(**kwargs)


@pytest.mark.parametrize(
    ("overrides", "error", "pattern"),
    [
        ({"level": "seq"}, UnknownNameError, "valid names: sequence, sequence-token, token"),
        ({"aggregation": "mean"}, UnknownNameError, "valid names: seq-mean-token-mean, seq-mean-token-sum-norm"),
        ({"aggregation": "seq-mean-token-sum-norm"}, ValueError, "needs norm_constant"),
        ({"kl_coef": 0.1}, ValueError, "kl_coef > 0 needs ref_logp"),
        ({"kl_coef": -1.0}, ValueError, "kl_coef must be"),
        ({"clip_low": 1.5}, ValueError, "clip_low must be <= 1"),
        ({"clip_high": float("nan")}, ValueError, "clip_high must be a finite number"),
        ({"advantages": torch.zeros(4)}, ValueError, r"advantages has shape \(4,\); expected \[batch\]"),
        ({"mask": torch.full((3, 4), 0.5)}, ValueError, "only 0 and 1"),
        ({"mask": torch.ones(3, 5, dtype=torch.bool)}, ValueError, r"mask has shape \(3, 5\); expected \(3, 4\)"),
        ({"old_logp": torch.zeros(3, 5)}, ValueError, "old_logp has shape"),
        ({"logp": torch.zeros(3)}, ValueError, r"logp must be a floating \[batch, seq\] tensor"),
        ({"old_logp": torch.full((3, 4), float("nan"))}, ValueError, "old_logp has NaN or inf values on response"),
        ({"level": "sequence", "advantages": torch.zeros(3, 4)}, ValueError, "use level 'sequence-token'"),
    ],
)
def test_bad_input_errors(overrides, error, pattern):
    with pytest.raises(error, match=pattern):
        _call(**overrides)


@pytest.mark.parametrize("name", ["cispo", "gmpo"])
def test_token_only_losses_reject_other_levels(name):
    batch = random_batch(0, 2, 3)
    with pytest.raises(UnknownNameError, match=f"level for loss '{name}'.*valid names: token"):
        compute_policy_loss(name, **batch, level="sequence", clip_low=0.2, clip_high=0.2, aggregation="token-mean")


def test_unexpected_keyword_is_a_type_error():
    batch = random_batch(0, 2, 3)
    with pytest.raises(TypeError, match="gamma_min"):
        compute_policy_loss(
            "ppo-clip", **batch, level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean", gamma_min=0.1
        )
