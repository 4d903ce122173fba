"""Greedy accuracy of a policy on a fixed set of task examples."""

from __future__ import annotations

import itertools
import math

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.metrics import keys
from moestab.recording.batch import response_mask_from_tokens
from moestab.tasks import Example, Task
from moestab.train.distributed import World


@torch.no_grad()
def greedy_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int,
    batch_size: int = 256,
    batches: int | None = None,
    synced: bool = False,
) -> list[str]:
    """Greedy-decoded responses (up to the first EOS, special tokens removed), in batches of ``batch_size`` prompts
    or, given ``batches``, in exactly that many near-equal batches.

    ``synced``: the model is sharded over several processes, each decoding its own prompts: every process must run
    as many forwards (``generate(synced_gpus=True)``), so all pass the same ``batches``.
    """
    device = next(model.parameters()).device
    if batches is None:
        spans = [(start, start + batch_size) for start in range(0, len(prompts), batch_size)]
    else:
        bounds = [len(prompts) * i // batches for i in range(batches + 1)]
        spans = list(itertools.pairwise(bounds))
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        for start, stop in spans:
            enc = tokenizer(prompts[start:stop], return_tensors="pt", padding=True,
                            padding_side="left", add_special_tokens=False).to(device)
            seqs = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, synced_gpus=synced,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            generated = seqs[:, enc.input_ids.shape[1] :]  # [b, T]
            keep = response_mask_from_tokens(generated, tokenizer.eos_token_id)
            out += tokenizer.batch_decode(generated.masked_fill(~keep, tokenizer.pad_token_id),
                                          skip_special_tokens=True)
    finally:
        model.train(was_training)
    return out


@keys.computes(keys.EVAL_ACCURACY)
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


def sharded_greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    examples: list[Example],
    *,
    max_new_tokens: int,
    world: World,
    batch_size: int = 256,
) -> float:
    """:func:`greedy_accuracy` of a policy sharded over ``world``: each process decodes its contiguous share of
    ``examples`` (``len(examples) >= world.size``) and the correct answers are summed."""
    bounds = [len(examples) * r // world.size for r in range(world.size + 1)]
    mine = examples[bounds[world.rank] : bounds[world.rank + 1]]
    batches = math.ceil(math.ceil(len(examples) / world.size) / batch_size)
    completions = greedy_completions(model, tokenizer, [e.prompt for e in mine], max_new_tokens=max_new_tokens,
                                     batches=batches, synced=True)
    correct = sum(task.is_correct(e, c) for e, c in zip(mine, completions, strict=True))
    return world.sum(correct) / len(examples)
