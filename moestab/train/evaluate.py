"""Greedy accuracy of a policy on a fixed set of task examples."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.tasks import Example, Task
from moestab.train.batch import response_mask_from_tokens


@torch.no_grad()
def greedy_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[str]:
    """Greedy-decoded responses (up to the first EOS, special tokens removed)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True,
                            padding_side="left", add_special_tokens=False).to(device)
            seqs = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            generated = seqs[:, enc.input_ids.shape[1] :]  # [b, T]
            keep = response_mask_from_tokens(generated, tokenizer.eos_token_id)
            out += tokenizer.batch_decode(generated.masked_fill(~keep, tokenizer.pad_token_id),
                                          skip_special_tokens=True)
    finally:
        model.train(was_training)
    return out


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    examples: list[Example],
    *,
    max_new_tokens: int,
) -> float:
    """Share of ``examples`` the policy answers correctly with greedy decoding."""
    completions = greedy_completions(model, tokenizer, [e.prompt for e in examples], max_new_tokens=max_new_tokens)
    return sum(task.is_correct(e, c) for e, c in zip(examples, completions, strict=True)) / len(examples)
