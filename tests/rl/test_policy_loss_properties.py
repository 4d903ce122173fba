"""Structural properties of the losses on random batches: GSPO-token == GSPO, on-policy gradient, where
clipping stops the gradient, padding and empty rows, data-parallel sharding."""

from __future__ import annotations

import math

import pytest
import torch

from moestab.rl import compute_loss_parts, policy_loss
from tests.support.rl import grad_of, random_batch

F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-14}
AGGREGATIONS = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


def _run(batch, name="ppo-clip", **kwargs):
    return compute_loss_parts(
        name,
        logp=batch["logp"],
        old_logp=batch["old_logp"],
        advantages=batch["advantages"],
        mask=batch["mask"],
        **kwargs,
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("clip", [(3e-4, 4e-4), (0.01, 0.015), (0.5, 0.5)])
def test_gspo_token_equals_gspo_with_sequence_advantages(seed, aggregation, clip):
    """GSPO Eq. 13-14: with one advantage per sequence, GSPO-token has GSPO's value, clipping and gradient,
    whether the advantages are given as [batch] or broadcast to [batch, seq]."""
    batch = random_batch(seed, 6, 9, scale=0.05, empty_rows=True)
    common = dict(clip_low=clip[0], clip_high=clip[1], aggregation=aggregation, norm_constant=9)
    gspo = _run(batch, level="sequence", **common)
    tok = _run(batch, level="sequence-token", **common)
    per_token = dict(batch, advantages=batch["advantages"][:, None].expand(6, 9).clone())
    tok2 = _run(per_token, level="sequence-token", **common)
    gspo_grad = grad_of(gspo.loss, batch["logp"])
    for other in (tok, tok2):
        torch.testing.assert_close(other.loss, gspo.loss, **TOL)
        torch.testing.assert_close(grad_of(other.loss, batch["logp"]), gspo_grad, **TOL)
        assert torch.equal(other.clipped, gspo.clipped)
        assert other.metrics["clip/token_frac"] == gspo.metrics["clip/token_frac"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("name", "level", "clip"),
    [
        ("ppo-clip", "token", (0.2, 0.28)),
        ("ppo-clip", "sequence", (3e-4, 4e-4)),
        ("ppo-clip", "sequence-token", (3e-4, 4e-4)),
        ("cispo", "token", (1.0, 4.0)),
        ("gmpo", "token", (0.4, 0.4)),
    ],
)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_on_policy_gradient_is_plain_policy_gradient(seed, name, level, clip, aggregation):
    """With logp == old_logp every ratio is 1, nothing is clipped, and d loss / d logp[i,t] is -A_i times the
    aggregation weight of token (i, t): 1/(|y_i| G') for seq-mean-token-mean, 1/N for token-mean,
    1/(C G') for seq-mean-token-sum-norm (G' non-empty rows, N tokens, C the constant)."""
    batch = random_batch(seed, 5, 7, empty_rows=True)
    logp = batch["old_logp"].clone().requires_grad_(True)
    mask = batch["mask"]
    parts = compute_loss_parts(
        name,
        logp=logp,
        old_logp=batch["old_logp"],
        advantages=batch["advantages"],
        mask=mask,
        level=level,
        clip_low=clip[0],
        clip_high=clip[1],
        aggregation=aggregation,
        norm_constant=10,
    )
    lengths = mask.sum(-1, keepdim=True).to(F64)  # [batch, 1]
    num_seqs = (lengths > 0).sum().to(F64)
    if aggregation == "seq-mean-token-mean":
        weight = 1 / (lengths.clamp(min=1) * num_seqs)
    elif aggregation == "token-mean":
        weight = 1 / lengths.sum()
    else:
        weight = torch.full_like(lengths, 1 / (10 * num_seqs.item()))
    expected = -batch["advantages"][:, None] * weight * mask  # [batch, seq]
    torch.testing.assert_close(grad_of(parts.loss, logp), expected, **TOL)
    assert not parts.clipped.any()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_token_clipping_zeroes_exactly_the_clipped_tokens(seed, per_token_adv):
    """Token level: a token's gradient is 0 iff (w > 1 + eh and A > 0) or (w < 1 - el and A < 0), and
    otherwise equals -A w / (|y_i| G') (seq-mean-token-mean)."""
    batch = random_batch(seed, 6, 11, scale=0.4, per_token_advantages=per_token_adv)
    parts = _run(batch, level="token", clip_low=0.2, clip_high=0.28, aggregation="seq-mean-token-mean")
    grad = grad_of(parts.loss, batch["logp"])
    mask = batch["mask"]
    w = torch.exp(batch["logp"].detach() - batch["old_logp"])
    adv = batch["advantages"] if per_token_adv else batch["advantages"][:, None].expand_as(w)
    should_clip = ((w > 1.28) & (adv > 0) | (w < 0.8) & (adv < 0)) & mask
    assert should_clip.any() and (mask & ~should_clip).any()  # both cases occur
    assert torch.equal(parts.clipped, should_clip)
    assert (grad[should_clip] == 0).all()
    lengths = mask.sum(-1, keepdim=True).to(F64)
    expected = torch.where(should_clip | ~mask, 0.0, -adv * w / (lengths * mask.any(-1).sum()))
    torch.testing.assert_close(grad, expected, **TOL)
    assert (grad[mask & ~should_clip] != 0).all()


@pytest.mark.parametrize("seed", range(4))
def test_sequence_clipping_zeroes_whole_clipped_sequences(seed):
    """GSPO: every token of a sequence with (s > 1 + eh and A > 0) or (s < 1 - el and A < 0) has zero gradient;
    every token of the other sequences has -A s / (|y_i| G')."""
    batch = random_batch(seed, 8, 10, scale=0.05)
    parts = _run(batch, level="sequence", clip_low=0.01, clip_high=0.015, aggregation="seq-mean-token-mean")
    grad = grad_of(parts.loss, batch["logp"])
    mask = batch["mask"]
    lengths = mask.sum(-1).to(F64)
    s = torch.exp(((batch["logp"].detach() - batch["old_logp"]) * mask).sum(-1) / lengths)  # [batch]
    adv = batch["advantages"]
    seq_clipped = (s > 1.015) & (adv > 0) | (s < 0.99) & (adv < 0)  # [batch]
    assert seq_clipped.any() and (~seq_clipped).any()
    assert torch.equal(parts.clipped, seq_clipped[:, None] & mask)
    expected = torch.where(seq_clipped, 0.0, -adv * s / (lengths * len(lengths)))[:, None] * mask
    torch.testing.assert_close(grad, expected, **TOL)
    assert (grad[(~seq_clipped)[:, None] & mask] != 0).all()


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("ppo-clip", "token"),
        ("ppo-clip", "sequence"),
        ("ppo-clip", "sequence-token"),
        ("cispo", "token"),
        ("gmpo", "token"),
    ],
)
def test_nan_padding_is_never_read(name, level):
    """Garbage (NaN, +-inf) at masked positions of logp / old_logp / advantages changes nothing."""
    batch = random_batch(0, 5, 8, empty_rows=True)
    kwargs = dict(level=level, clip_low=0.2, clip_high=0.28, aggregation="token-mean")
    clean = _run(batch, name, **kwargs)
    pad = ~batch["mask"]
    dirty_logp = batch["logp"].detach().clone()
    dirty_logp[pad] = math.nan
    dirty_logp.requires_grad_(True)
    dirty_old = batch["old_logp"].clone()
    dirty_old[pad] = -math.inf
    dirty_adv = batch["advantages"].clone()
    dirty_adv[~batch["mask"].any(-1)] = math.nan  # advantages of empty rows are unused too
    dirty = compute_loss_parts(
        name, logp=dirty_logp, old_logp=dirty_old, advantages=dirty_adv, mask=batch["mask"], **kwargs
    )
    torch.testing.assert_close(dirty.loss, clean.loss, **TOL)
    torch.testing.assert_close(grad_of(dirty.loss, dirty_logp), grad_of(clean.loss, batch["logp"]), **TOL)
    for key, value in clean.metrics.items():
        torch.testing.assert_close(dirty.metrics[key], value, equal_nan=True, msg=key)


@pytest.mark.parametrize("level", ["token", "sequence", "sequence-token"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_all_masked_row_contributes_nothing(level, aggregation):
    """Adding an all-masked row leaves loss, gradient and metrics as if the row were absent."""
    batch = random_batch(3, 4, 6)
    kwargs = dict(level=level, clip_low=0.2, clip_high=0.28, aggregation=aggregation, norm_constant=6)
    base = _run(batch, **kwargs)
    logp = torch.cat([batch["logp"].detach(), torch.full((1, 6), math.nan, dtype=F64)]).requires_grad_(True)
    bigger = compute_loss_parts(
        "ppo-clip",
        logp=logp,
        old_logp=torch.cat([batch["old_logp"], torch.zeros(1, 6, dtype=F64)]),
        advantages=torch.cat([batch["advantages"], torch.tensor([5.0], dtype=F64)]),
        mask=torch.cat([batch["mask"], torch.zeros(1, 6, dtype=torch.bool)]),
        **kwargs,
    )
    torch.testing.assert_close(bigger.loss, base.loss, **TOL)
    grad = grad_of(bigger.loss, logp)
    torch.testing.assert_close(grad[:4], grad_of(base.loss, batch["logp"]), **TOL)
    assert (grad[4] == 0).all()
    for key, value in base.metrics.items():
        torch.testing.assert_close(bigger.metrics[key], value, rtol=1e-12, atol=1e-14, equal_nan=True, msg=key)


def test_empty_batch_gives_zero_loss_and_nan_statistics():
    logp = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    loss, m = policy_loss(
        logp,
        torch.zeros(2, 3, dtype=F64),
        torch.ones(2, dtype=F64),
        torch.zeros(2, 3, dtype=torch.bool),
        level="sequence",
        clip_low=0.2,
        clip_high=0.2,
        aggregation="seq-mean-token-mean",
    )
    assert loss.item() == 0.0
    assert (grad_of(loss, logp) == 0).all()
    assert math.isnan(m["ratio/token_mean"].item()) and math.isnan(m["clip/frac"].item())
    assert m["count/tokens"].item() == 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("aggregation", "weight_key"),
    [("token-mean", "count/tokens"), ("seq-mean-token-mean", "count/seqs"), ("seq-mean-token-sum-norm", "count/seqs")],
)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_data_parallel_shards_recombine_to_the_global_loss(seed, aggregation, weight_key, level):
    """Split a batch into uneven shards (as data-parallel ranks / micro-batches would get it); weighting each
    shard's loss by its count (tokens for token-mean, non-empty rows for seq-mean) over the global count
    recovers the global loss and gradient exactly. The unweighted mean of shard losses does not."""
    batch = random_batch(seed, 10, 12, empty_rows=True)
    kwargs = dict(level=level, clip_low=0.2, clip_high=0.28, aggregation=aggregation, norm_constant=12)
    full = _run(batch, **kwargs)
    total = full.metrics[weight_key]
    combined = torch.zeros((), dtype=F64)
    naive = torch.zeros((), dtype=F64)
    bounds = [(0, 1), (1, 5), (5, 10)]
    for start, end in bounds:
        shard = {key: value[start:end] for key, value in batch.items()}
        part = compute_loss_parts(
            "ppo-clip",
            logp=batch["logp"][start:end],
            old_logp=shard["old_logp"],
            advantages=shard["advantages"],
            mask=shard["mask"],
            **kwargs,
        )
        combined = combined + part.loss * part.metrics[weight_key] / total
        naive = naive + part.loss / len(bounds)
    torch.testing.assert_close(combined, full.loss, **TOL)
    torch.testing.assert_close(grad_of(combined, batch["logp"]), grad_of(full.loss, batch["logp"]), **TOL)
    assert not torch.isclose(naive, full.loss, rtol=1e-6)


@pytest.mark.parametrize("on_host", ["old_logp", "advantages", "mask", "ref_logp"])
def test_a_tensor_on_another_device_than_logp_is_named(on_host: str) -> None:
    # The meta device stands in for a GPU: logp there, one input left on the host, as a trainer that keeps its
    # rewards on the CPU would (moestab train on CUDA did, until the GPU check ran it).
    data = random_batch(0, 3, 5)
    data["ref_logp"] = data["old_logp"].clone()
    given = {name: t if name == on_host else t.detach().to("meta") for name, t in data.items()}
    with pytest.raises(ValueError, match=rf"logp's device \(meta\); got {on_host} on cpu"):
        compute_loss_parts("ppo-clip", **given, level="sequence", clip_low=3e-4, clip_high=4e-4,
                           aggregation="seq-mean-token-mean", kl_coef=0.1)
