"""A new objective is one decorated function plus its preset: the declaration fills every table keyed by its name."""

from __future__ import annotations

import inspect

import pytest
import torch

from moestab.rl import (
    LOSSES,
    PRESETS,
    AlgorithmPreset,
    LossInputs,
    LossTerms,
    UnknownNameError,
    compute_clipped_mask,
    compute_loss_parts,
    get_loss,
    objective,
    policy_loss,
    scoped_objectives,
    token_ratios,
)
from moestab.rl.metrics import ClipFlags
from tests.support.rl import grad_of, random_batch

BUILT_IN = {"cispo", "gmpo", "ppo-clip", "rspo"}
TOL = {"rtol": 1e-12, "atol": 1e-14}


def weighted_pg(x: LossInputs, *, token_weights: torch.Tensor) -> LossTerms:
    """Toy objective: the unclipped importance-weighted policy gradient ``-w A``, each token's term times a weight
    the trainer supplies (``token_weights`` ``[batch, seq]``). Never clips."""
    w = token_ratios(x.logp, x.old_logp, x.mask)  # [batch, seq]
    never = torch.zeros_like(x.mask)  # [batch, seq] bool
    return LossTerms(-w * x.advantages * token_weights, ClipFlags.from_tokens(never, never, x.mask))


def _toy_preset(**overrides) -> AlgorithmPreset:
    values = dict(name="toy", loss="toy", level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean",
                  advantage="group-normalized", citation="a test's toy objective")
    return AlgorithmPreset(**{**values, **overrides})


def test_a_new_objective_is_one_function_plus_its_preset():
    batch = random_batch(3, 4, 5, per_token_advantages=True)  # float64
    with scoped_objectives():
        toy = objective("toy", levels=("token",), runtime_inputs=("token_weights",))(weighted_pg)
        assert get_loss("toy") is toy and toy.inputs == ("token_weights",) and toy.settings == ()
        preset = _toy_preset()
        assert preset.objective is toy
        assert preset.runtime_inputs == ("token_weights",)  # what the trainer must compute for it
        assert preset.loss_kwargs() == dict(level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean",
                                            kl_coef=0.0)
        assert list(inspect.signature(toy).parameters)[-4:] == ["token_weights", "norm_constant", "kl_coef",
                                                                "ref_logp"]
        ones = torch.ones(4, 5, dtype=torch.float64)  # [batch, seq]
        parts = compute_loss_parts(preset.loss, **batch, **preset.loss_kwargs(), token_weights=ones)
        # Second implementation: ppo-clip whose clip range [0, 1e9] never binds is the same -w A.
        base = compute_loss_parts("ppo-clip", **batch, level="token", clip_low=1.0, clip_high=1e9,
                                  aggregation="token-mean")
        torch.testing.assert_close(parts.loss, base.loss, **TOL)
        torch.testing.assert_close(grad_of(parts.loss, batch["logp"]), grad_of(base.loss, batch["logp"]), **TOL)
        assert parts.metrics.keys() == base.metrics.keys()  # the shared metrics, with no code in the toy
        assert parts.metrics["clip/frac"].item() == 0.0 and not parts.clipped.any()
        assert base.loss.item() != 0.0  # not trivially equal
        doubled = compute_loss_parts("toy", **batch, **preset.loss_kwargs(), token_weights=2 * ones)
        torch.testing.assert_close(doubled.loss, 2 * parts.loss, **TOL)
        clipped = compute_clipped_mask("toy", **batch, **preset.loss_kwargs(), token_weights=ones)
        assert clipped.shape == (4, 5) and not clipped.any()
        # The shared prologue runs for it too: the levels it declared, the common input checks, its own arguments.
        with pytest.raises(UnknownNameError, match=r"level for loss 'toy'.*valid names: token"):
            toy(**batch, **{**preset.loss_kwargs(), "level": "sequence"}, token_weights=ones)
        with pytest.raises(ValueError, match="clip_low must be <= 1"):
            toy(**batch, **{**preset.loss_kwargs(), "clip_low": 1.5}, token_weights=ones)
        with pytest.raises(TypeError, match="token_weights"):
            toy(**batch, **preset.loss_kwargs())
    assert set(LOSSES) == BUILT_IN  # nothing leaks out of the scope
    with pytest.raises(UnknownNameError, match="unknown policy loss 'toy'; valid names: cispo, gmpo, ppo-clip, rspo"):
        _toy_preset()


def test_scoped_objectives_unregister_even_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"), scoped_objectives():
        objective("toy", runtime_inputs=("token_weights",))(weighted_pg)
        assert "toy" in LOSSES
        raise RuntimeError("boom")
    assert set(LOSSES) == BUILT_IN


def _no_inputs(x: LossInputs) -> LossTerms:
    return weighted_pg(x, token_weights=torch.ones_like(x.logp))


def _positional(x: LossInputs, scale: float) -> LossTerms:
    return _no_inputs(x)


def _common_again(x: LossInputs, *, level: str) -> LossTerms:
    return _no_inputs(x)


@pytest.mark.parametrize(
    ("name", "terms", "declared", "error", "pattern"),
    [
        ("ppo-clip", _no_inputs, {}, ValueError, "policy loss 'ppo-clip' is already registered"),
        ("toy", _no_inputs, {"runtime_inputs": ("router_logp_new",)}, ValueError,
         "runtime input 'router_logp_new' is not a keyword-only argument"),
        ("toy", _no_inputs, {"levels": ("seq",)}, UnknownNameError, "valid names: sequence, sequence-token, token"),
        ("toy", _positional, {}, TypeError, "argument 'scale' of _positional must be keyword-only"),
        ("toy", _common_again, {}, TypeError, "'level' is a common argument"),
    ],
)
def test_a_bad_declaration_is_refused_and_registers_nothing(name, terms, declared, error, pattern):
    with scoped_objectives():
        with pytest.raises(error, match=pattern):
            objective(name, **declared)(terms)
        assert set(LOSSES) == BUILT_IN
    assert LOSSES["ppo-clip"] is policy_loss


def test_the_declarations_are_what_the_other_tables_read():
    assert {name: (o.levels, o.log_space, o.runtime_inputs, o.settings) for name, o in LOSSES.items()} == {
        "ppo-clip": (("token", "sequence", "sequence-token"), False, (), ()),
        "cispo": (("token",), False, (), ()),
        "gmpo": (("token",), True, (), ()),  # clip bounds on log w: TrainConfig lets clip_low exceed 1
        "rspo": (("token", "sequence", "sequence-token"), False, ("router_logp_new", "router_logp_old"),
                 ("gamma_min",)),
    }
    assert PRESETS["rspo"].loss_kwargs()["gamma_min"] == 0.1  # a loss's setting comes from its preset's field
    assert PRESETS["rspo"].runtime_inputs == ("router_logp_new", "router_logp_old")
    for preset in PRESETS.values():
        assert preset.objective is LOSSES[preset.loss]


def test_a_loss_setting_must_be_a_preset_field():
    def scaled(x: LossInputs, *, scale: float) -> LossTerms:
        return weighted_pg(x, token_weights=torch.full_like(x.logp, scale))

    with scoped_objectives():
        objective("toy")(scaled)
        with pytest.raises(ValueError, match="loss 'toy' takes the setting 'scale', which no preset field fixes"):
            _toy_preset()
    with pytest.raises(ValueError, match="gamma_min is required for loss 'rspo' and only for it"):
        _toy_preset(loss="ppo-clip", gamma_min=0.1)


@pytest.mark.parametrize("algo", ["gmpo", "grpo"])
def test_train_config_reads_the_declared_clip_space(tmp_path, algo):
    from moestab.configs import ConfigError
    from tests.support.train import tiny_config

    def config():
        return tiny_config(tmp_path / "run", tmp_path / "cache", algo=algo, clip_low=1.5)

    if LOSSES[PRESETS[algo].loss].log_space:  # gmpo: a log-ratio bound of -1.5 is fine
        assert config().resolved_preset().clip_low == 1.5
    else:  # a ratio bound 1 - 1.5 < 0 is not
        with pytest.raises(ConfigError, match=r"clip_low must be a finite number in \(0, 1\]"):
            config()
