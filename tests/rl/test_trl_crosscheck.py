"""Cross-check of moestab.rl losses against TRL 1.16's GRPOTrainer loss code, run on identical tensors.

How TRL is driven: ``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py) is called on a trainer object
made with ``object.__new__`` (its ``__init__`` would need a model, datasets, an accelerator...). Only the
attributes ``_compute_loss`` reads are set, with the values ``GRPOTrainer.__init__`` would derive from a
``GRPOConfig`` (``epsilon_low = config.epsilon``, ``epsilon_high = config.epsilon_high``, ``beta``,
``loss_type``, ``importance_sampling_level``, ...), and the instance's ``_get_per_token_logps_and_entropies``
is replaced so that it returns our ``logp`` tensor (a leaf with ``requires_grad``). TRL's own formula then
runs unmodified; we compare its loss and ``d loss / d logp`` with ours. The single-process accelerator is a
stand-in whose ``gather`` / ``reduce`` are the identity (what they are with one process).

Not driven: TRL's advantage computation (inline in ``_generate_and_score_completions``, which needs a model,
reward functions and generation), its vLLM importance-sampling correction, entropy masking, off-policy masks
and the sapo / vespo / luspo / bnpo losses (no moestab counterpart). Rows are never all-masked here: TRL's
``grpo`` / ``dr_grpo`` divide by the full batch size, moestab by the non-empty rows (documented difference;
``test_empty_row_differs_from_trl_by_the_row_count`` pins it).
"""

from __future__ import annotations

import types
from collections import defaultdict

import pytest
import torch

from moestab.rl import compute_loss_parts
from tests.support.rl import grad_of, random_batch

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

TOL = {"rtol": 1e-12, "atol": 1e-12}  # float64 throughout: both sides compute the same expressions
# TRL's sequence-level metric stacks the float64 sum with a float32 count, so its fractions are float32-rounded.
METRIC_ABS = 1e-7
SHAPES = [(1, 1), (3, 5), (8, 17)]
SEEDS = [0, 1, 2]


def _trl_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str,
    importance_sampling_level: str,
    epsilon: float,
    epsilon_high: float,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """TRL's GRPOTrainer._compute_loss on our tensors; returns (loss, TRL's logged metrics)."""
    trainer = object.__new__(trl_grpo.GRPOTrainer)
    batch, seq = logp.shape
    float_mask = mask.to(logp.dtype)

    def per_token_logps_and_entropies(*_args, **_kwargs):
        return logp, torch.zeros_like(logp.detach()), None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    # Attributes as GRPOTrainer.__init__ sets them from GRPOConfig(loss_type=..., importance_sampling_level=...,
    # epsilon=..., epsilon_high=..., beta=..., max_completion_length=...), defaults elsewhere.
    trainer.loss_type = loss_type
    trainer.importance_sampling_level = importance_sampling_level
    trainer.epsilon_low = epsilon
    trainer.epsilon_high = epsilon_high
    trainer.beta = beta
    trainer.max_completion_length = max_completion_length
    trainer.args = types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1)
    trainer.top_entropy_quantile = 1.0
    trainer.off_policy_mask_threshold = None
    trainer.use_vllm = False
    trainer.aux_loss_enabled = False
    trainer._entropy_bonus_enabled = False
    trainer.current_gradient_accumulation_steps = 1
    trainer.model = torch.nn.Module()  # .training is True: "train" mode
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.accelerator = types.SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
    )
    inputs = {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.zeros(batch, seq, dtype=torch.long),
        "completion_mask": float_mask,
        "advantages": advantages,
        "old_per_token_logps": old_logp,
        # dapo / cispo normalise by the tokens of the accumulated batch: here, this batch.
        "num_items_in_batch": float_mask.sum(),
    }
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    loss = trainer._compute_loss(None, inputs)
    return loss, dict(trainer._metrics["train"])


def _ours(batch: dict[str, torch.Tensor], name: str, **kwargs):
    return compute_loss_parts(
        name,
        logp=batch["logp"],
        old_logp=batch["old_logp"],
        advantages=batch["advantages"],
        mask=batch["mask"],
        **kwargs,
    )


def _trl(batch: dict[str, torch.Tensor], **kwargs):
    return _trl_loss(batch["logp"], batch["old_logp"], batch["advantages"], batch["mask"], **kwargs)


def _assert_same(ours_loss, trl_loss, logp):
    torch.testing.assert_close(ours_loss, trl_loss, **TOL)
    torch.testing.assert_close(grad_of(ours_loss, logp), grad_of(trl_loss, logp), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_grpo_token_level_matches_trl(seed, shape, per_token_adv):
    """TRL: loss_type="grpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.27, beta=0.0."""
    batch = random_batch(seed, *shape, per_token_advantages=per_token_adv)
    ours = _ours(batch, "ppo-clip", level="token", clip_low=0.2, clip_high=0.27, aggregation="seq-mean-token-mean")
    trl_loss, trl_metrics = _trl(
        batch, loss_type="grpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.27
    )
    _assert_same(ours.loss, trl_loss, batch["logp"])
    # TRL's token-level clip ratios are token-weighted global means, like ours.
    assert ours.metrics["clip/low_frac"].item() == pytest.approx(trl_metrics["clip_ratio/low_mean"][0], abs=METRIC_ABS)
    assert ours.metrics["clip/high_frac"].item() == pytest.approx(
        trl_metrics["clip_ratio/high_mean"][0], abs=METRIC_ABS
    )
    assert ours.metrics["clip/frac"].item() == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=METRIC_ABS)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("clip", [(3e-4, 4e-4), (0.01, 0.015)])
def test_gspo_sequence_level_matches_trl(seed, shape, clip):
    """TRL: loss_type="grpo", importance_sampling_level="sequence", epsilon=clip_low, epsilon_high=clip_high,
    beta=0.0 (the GSPO configuration TRL documents); (3e-4, 4e-4) is the GSPO paper's, (0.01, 0.015) clips fewer
    sequences so both clipped and unclipped ones occur."""
    batch = random_batch(seed, *shape, scale=0.05)
    ours = _ours(
        batch, "ppo-clip", level="sequence", clip_low=clip[0], clip_high=clip[1], aggregation="seq-mean-token-mean"
    )
    trl_loss, trl_metrics = _trl(
        batch, loss_type="grpo", importance_sampling_level="sequence", epsilon=clip[0], epsilon_high=clip[1]
    )
    _assert_same(ours.loss, trl_loss, batch["logp"])
    # At the sequence level TRL's clip ratios are fractions of sequences, as our level fractions are.
    assert ours.metrics["clip/low_frac"].item() == pytest.approx(trl_metrics["clip_ratio/low_mean"][0], abs=METRIC_ABS)
    assert ours.metrics["clip/high_frac"].item() == pytest.approx(
        trl_metrics["clip_ratio/high_mean"][0], abs=METRIC_ABS
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_gspo_token_matches_trl_sequence_level(seed, shape):
    """GSPO-token with per-sequence advantages vs TRL loss_type="grpo", importance_sampling_level="sequence",
    epsilon=0.01, epsilon_high=0.015, beta=0.0 (GSPO Eq. 13-14: equal value and gradient)."""
    batch = random_batch(seed, *shape, scale=0.05)
    ours = _ours(
        batch, "ppo-clip", level="sequence-token", clip_low=0.01, clip_high=0.015, aggregation="seq-mean-token-mean"
    )
    trl_loss, _ = _trl(batch, loss_type="grpo", importance_sampling_level="sequence", epsilon=0.01, epsilon_high=0.015)
    _assert_same(ours.loss, trl_loss, batch["logp"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_dapo_token_mean_matches_trl(seed, shape):
    """TRL: loss_type="dapo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.28, beta=0.0, one
    process, no gradient accumulation (normaliser = tokens of this batch)."""
    batch = random_batch(seed, *shape)
    ours = _ours(batch, "ppo-clip", level="token", clip_low=0.2, clip_high=0.28, aggregation="token-mean")
    trl_loss, _ = _trl(batch, loss_type="dapo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.28)
    _assert_same(ours.loss, trl_loss, batch["logp"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_dr_grpo_matches_trl(seed, shape):
    """TRL: loss_type="dr_grpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.2, beta=0.0,
    max_completion_length = seq (our norm_constant)."""
    batch = random_batch(seed, *shape)
    seq = shape[1]
    ours = _ours(
        batch,
        "ppo-clip",
        level="token",
        clip_low=0.2,
        clip_high=0.2,
        aggregation="seq-mean-token-sum-norm",
        norm_constant=seq,
    )
    trl_loss, _ = _trl(
        batch,
        loss_type="dr_grpo",
        importance_sampling_level="token",
        epsilon=0.2,
        epsilon_high=0.2,
        max_completion_length=seq,
    )
    _assert_same(ours.loss, trl_loss, batch["logp"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_cispo_matches_trl(seed, shape):
    """TRL: loss_type="cispo", importance_sampling_level="token", epsilon_high=1.25, beta=0.0. TRL's CISPO caps
    the weight at epsilon_high with no lower bound (clamp(w, max=epsilon_high)); ours with clip_low=1.0 (lower
    bound 0, never active) and clip_high=0.25 (cap 1 + 0.25) is the same weight."""
    batch = random_batch(seed, *shape)
    ours = _ours(batch, "cispo", level="token", clip_low=1.0, clip_high=0.25, aggregation="token-mean")
    trl_loss, _ = _trl(batch, loss_type="cispo", importance_sampling_level="token", epsilon=0.2, epsilon_high=1.25)
    _assert_same(ours.loss, trl_loss, batch["logp"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("level", "trl_level"), [("token", "token"), ("sequence", "sequence")])
def test_kl_penalty_matches_trl_beta(seed, level, trl_level):
    """TRL: loss_type="grpo", importance_sampling_level=level, epsilon=0.2, epsilon_high=0.27, beta=0.04
    (k3 penalty exp(ref - logp) - (ref - logp) - 1 per token), use_bias_correction_kl=False."""
    batch = random_batch(seed, 4, 6, scale=0.1 if level == "sequence" else 0.3)
    gen = torch.Generator().manual_seed(100 + seed)
    ref_logp = batch["old_logp"] + 0.2 * torch.randn(batch["old_logp"].shape, generator=gen, dtype=torch.float64)
    ours = _ours(
        batch,
        "ppo-clip",
        level=level,
        clip_low=0.2,
        clip_high=0.27,
        aggregation="seq-mean-token-mean",
        kl_coef=0.04,
        ref_logp=ref_logp,
    )
    trl_loss, trl_metrics = _trl(
        batch,
        loss_type="grpo",
        importance_sampling_level=trl_level,
        epsilon=0.2,
        epsilon_high=0.27,
        beta=0.04,
        ref_logp=ref_logp,
    )
    _assert_same(ours.loss, trl_loss, batch["logp"])
    assert ours.metrics["kl/ref_k3"].item() == pytest.approx(trl_metrics["kl"][0], rel=1e-10)


def test_empty_row_differs_from_trl_by_the_row_count():
    """With an all-masked row, TRL's "grpo" (token level, epsilon=0.2, epsilon_high=0.27, beta=0.0) averages over
    all B rows and ours over the B - 1 non-empty ones: ours = TRL * B / (B - 1), gradients alike."""
    batch = random_batch(5, 4, 6)
    batch["mask"][2] = False
    ours = _ours(batch, "ppo-clip", level="token", clip_low=0.2, clip_high=0.27, aggregation="seq-mean-token-mean")
    trl_loss, _ = _trl(batch, loss_type="grpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.27)
    torch.testing.assert_close(ours.loss, trl_loss * 4 / 3, **TOL)
    torch.testing.assert_close(grad_of(ours.loss, batch["logp"]), grad_of(trl_loss, batch["logp"]) * 4 / 3, **TOL)


@pytest.mark.parametrize(("level", "scale", "clip"), [("token", 0.3, (0.2, 0.27)), ("sequence", 0.05, (0.01, 0.015))])
def test_crosscheck_inputs_exercise_both_branches(level, scale, clip):
    """Guard: on the largest shape the cross-check inputs have clipped and unclipped units, so the comparisons
    above cover both branches of the min, and that both bounds clip somewhere across the seeds."""
    lows, highs = [], []
    for seed in SEEDS:
        batch = random_batch(seed, 8, 17, scale=scale)
        parts = _ours(batch, "ppo-clip", level=level, clip_low=clip[0], clip_high=clip[1], aggregation="token-mean")
        assert 0.0 < parts.metrics["clip/frac"].item() < 1.0
        lows.append(parts.metrics["clip/low_frac"].item())
        highs.append(parts.metrics["clip/high_frac"].item())
    assert max(lows) > 0.0 and max(highs) > 0.0
