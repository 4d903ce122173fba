"""Token layout shared by the rollout engine and the trainer.

A rollout of ``B`` sequences is laid out as the trainer's input ``[B, L]`` = prompt (left-padded,
``P`` columns) + generated tokens except the last one, so that logits at input position ``p``
predict the token at ``p + 1``. The response region is the last ``T = L - P + 1`` logit positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from moestab.routing import Routes


@dataclass(frozen=True)
class RolloutBatch:
    """Sequences sampled by the rollout engine, in the trainer's layout."""

    input_ids: torch.Tensor
    """``[B, L]`` trainer input: prompt + response[:-1]."""
    attention_mask: torch.Tensor
    """``[B, L]`` 1 for prompt tokens and response tokens up to the first EOS; 0 for padding."""
    targets: torch.Tensor
    """``[B, T]`` response tokens (predicted by input positions ``P-1 .. L-1``)."""
    response_mask: torch.Tensor
    """``[B, T]`` bool: response tokens up to and including the first EOS."""
    logp_rollout: torch.Tensor
    """``[B, T]`` float32 log-prob of each response token under the rollout engine's sampling distribution."""
    routes: Routes
    """Experts the rollout engine chose at each input position ``[B, L, layers, top_k]`` (and their gate weights,
    when the engine records them)."""
    prompt_len: int
    """``P``: columns of (left-padded) prompt."""
    completions: list[str]
    """Decoded responses (special tokens removed)."""

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    def response(self, per_position: torch.Tensor) -> torch.Tensor:
        """``[B, L, ...]`` per input position -> ``[tokens, ...]`` at the response tokens, in row-major order. A
        response token's routes are those of the input position whose logits score it (docs/run-format.md)."""
        return per_position[:, self.prompt_len - 1 :][self.response_mask]

    def response_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, L, V]`` trainer logits -> ``[B, T, V]`` logits of the response positions."""
        return logits[:, self.prompt_len - 1 :]

    def to(self, device: torch.device | str) -> RolloutBatch:
        """This batch with every tensor on ``device``."""
        return replace(self, input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device),
                       targets=self.targets.to(device), response_mask=self.response_mask.to(device),
                       logp_rollout=self.logp_rollout.to(device), routes=self.routes.to(device))

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The sequences ``rows`` (e.g. a minibatch)."""
        return RolloutBatch(
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            targets=self.targets[rows],
            response_mask=self.response_mask[rows],
            logp_rollout=self.logp_rollout[rows],
            routes=self.routes.select(rows),
            prompt_len=self.prompt_len,
            completions=[self.completions[i] for i in rows.tolist()],
        )


def cat_batches(parts: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Rollout batches stacked along the batch axis, re-laid out on a common prompt width and response length.

    Prompts stay left-padded (to the widest ``prompt_len``) and responses right-padded (to the longest), so
    every row keeps the trainer's layout; padding has attention 0, no route (-1) and no loss.
    """
    if len(parts) == 1:
        return parts[0]
    P = max(b.prompt_len for b in parts)
    T = max(b.targets.shape[1] for b in parts)

    def relay(b: RolloutBatch, x: torch.Tensor, fill) -> torch.Tensor:  # [B, L_b, ...] -> [B, P + T - 1, ...]
        return relay_positions(x, P - b.prompt_len, P + T - 1, fill)

    def right(b: RolloutBatch, x: torch.Tensor, fill) -> torch.Tensor:  # [B, T_b] -> [B, T]
        return pad_positions(x, T, fill)

    routes = Routes.cat([replace(b.routes.shift(P - b.prompt_len), rows=None) for b in parts])  # [sum B, P+T-1, ..]
    return RolloutBatch(
        input_ids=torch.cat([relay(b, b.input_ids, pad_token_id) for b in parts]),
        attention_mask=torch.cat([relay(b, b.attention_mask, 0) for b in parts]),
        targets=torch.cat([right(b, b.targets, pad_token_id) for b in parts]),
        response_mask=torch.cat([right(b, b.response_mask, False) for b in parts]),
        logp_rollout=torch.cat([right(b, b.logp_rollout, 0.0) for b in parts]),
        routes=routes,
        prompt_len=P,
        completions=[c for b in parts for c in b.completions],
    )


def pad_positions(x: torch.Tensor, length: int, fill) -> torch.Tensor:
    """``[B, n, ...]`` -> ``[B, length, ...]``, right-padded with ``fill``."""
    return torch.cat([x, x.new_full((x.shape[0], length - x.shape[1], *x.shape[2:]), fill)], dim=1)


def relay_positions(x: torch.Tensor, left: int, length: int, fill) -> torch.Tensor:
    """``[B, n, ...]`` -> ``[B, length, ...]``: ``left`` positions of ``fill`` before, the rest after (a batch's
    positions on a wider prompt)."""
    return pad_positions(torch.cat([x.new_full((x.shape[0], left, *x.shape[2:]), fill), x], dim=1), length, fill)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens, as ``generate()`` computes them for left padding."""
    positions = attention_mask.long().cumsum(-1) - 1  # [B, L]
    return positions.masked_fill(attention_mask == 0, 0)


def response_mask_from_tokens(generated: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """``[B, T]`` bool: tokens up to and including the first EOS (all of them when there is none)."""
    is_eos = generated == eos_token_id  # [B, T]
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    return ~after_eos
