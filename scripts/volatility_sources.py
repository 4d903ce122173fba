"""Where routing change comes from on a run's policy, per MoE layer: its routers' weights or the hidden states they
read (moestab.probes.volatility_sources), for one RL step from each of the run's checkpoints given.

    .venv/bin/python scripts/volatility_sources.py RUN [--checkpoints 0 20]

Each step is ``moestab train``'s first step (its prompts and seeds, moestab.probes.one_step) run from the checkpoint
with the run's objective, lr, batch, minibatches and rollout precision, and with the run's optimizer state at that
checkpoint (a fresh AdamW's first steps move every weight by about the lr, far more than a warmed-up one's); the
change is measured at the response positions of that step's rollout batch, as ``routing/old_new/changed`` is.
Prints one row per checkpoint and layer (``step_changed``: the step's own metric, from its chunked forwards), and the
mean over layers.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import pandas as pd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from moestab.probes.one_step import StepRecipe, one_step_with_tensors, prepare_tokenizer
    from moestab.probes.volatility_sources import volatility_sources
    from moestab.run_folder import RunFolder
    from moestab.run_folder.reader import read_run_info
    from moestab.tasks import task_from_spec
    from moestab.train.checkpoint import restore_training_state
    from moestab.train.optim import build_optimizer
    from moestab.train.recipe import load_policy

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    info = read_run_info(args.run)
    c = info.config
    recipe = StepRecipe(task=task_from_spec(c["task"]), algo=c["algo"], prompts=c["prompts_per_step"],
                        group_size=c["group_size"], seed=c["seed"], rollout_dtype=c["rollout_dtype"])
    folder = RunFolder(args.run)
    for step in args.checkpoints:  # before any work: each needs its weights, and its optimizer state but at step 0
        weights, state = step in folder.saved_checkpoints(), step in folder.complete_checkpoints()
        if not weights or (step and not state):
            print(f"checkpoint {step} of {args.run} has {'no training state' if weights else 'no weights'}: a run "
                  "keeps the training states of its two newest checkpoints (moestab.train.checkpoint.KEEP_STATES); "
                  f"valid: 0 and {folder.complete_checkpoints()}", file=sys.stderr)
            return 2
    tables = []
    for step in args.checkpoints:
        path = folder.checkpoint_dir(step)
        model = load_policy(str(path), torch.float32, torch.device("cpu"))
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        prepare_tokenizer(tokenizer, recipe, str(path))
        before = copy.deepcopy(model)
        optimizer = build_optimizer(model.parameters(), lr=c["lr"], weight_decay=c["weight_decay"])
        if step in folder.complete_checkpoints():  # step 0 without its state: AdamW before its first step, as saved
            restore_training_state(folder, step, model, optimizer)
        metrics, tensors = one_step_with_tensors(model, tokenizer, recipe, lr=c["lr"], minibatches=c["minibatches"],
                                                 optimizer=optimizer)
        batch = tensors.batch
        measured = torch.zeros_like(batch.attention_mask, dtype=torch.bool)  # [B, L] positions scoring a response
        measured[:, batch.prompt_len - 1:] = batch.response_mask[:, : measured.shape[1] - batch.prompt_len + 1]
        table = volatility_sources(before, model, batch.input_ids, batch.attention_mask, measured)
        tables.append(table.assign(checkpoint=step, step_changed=metrics["routing/old_new/changed"]))
    out = pd.concat(tables, ignore_index=True)
    print(f"{args.run}: lr {c['lr']}, {c['algo']}, {c['model']}, one step from each checkpoint\n")
    print(out.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print("\nmean over layers:")
    means = out.groupby("checkpoint")[["changed", "router", "hidden"]].mean()
    print(means.to_string(float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
