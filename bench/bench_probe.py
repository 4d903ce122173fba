"""Probe throughput (tokens/s) with routing recording on against off, on a mid-size MoE built in code.

The model: the embedded Qwen3-MoE at 8 layers, 32 experts, top-4, hidden 512 (random weights; throughput does not
depend on them). The suite: ``general`` (standard-library docstrings), ``--texts`` texts cut to ``--max-tokens``.
Contenders, interleaved round by round in rotating order in one process (this machine is noisy):

- ``collect``: what every probe runs -- ``moestab.probes.collect.collect``: batched forwards under the routing
  recorder (routes ranked by the router's own score, margins), next-token log-probs, real tokens kept;
- ``plain``: the same batches, forwards and log-prob gather with no recorder and no routes kept.

Each ratio is median(collect) / median(plain), for wall and process CPU time; tokens/s from the medians.

    .venv/bin/python bench/bench_probe.py [--rounds 7] [--threads 2] [--texts 64] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import platform

import torch
from bench_train import interleave, med, ratio_row  # bench/ is the script's directory, hence on sys.path

from moestab.models import EmbeddedModelSpec, build_embedded_policy
from moestab.probes.collect import collect, right_padded, tokenize_suite
from moestab.probes.suites import load_suite


@torch.no_grad()
def plain(model, rows: list[list[int]], batch_size: int, pad: int) -> int:
    """The forwards and log-prob gather of ``collect`` without the recorder; returns the real tokens seen."""
    tokens = 0
    for start in range(0, len(rows), batch_size):
        ids, mask = right_padded(rows[start : start + batch_size], pad)  # [b, seq] each
        logits = model(input_ids=ids, attention_mask=mask).logits  # [b, seq, vocab]
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None])  # [b, seq-1, 1]
        logp[mask[:, 1:].bool()].numpy()
        tokens += int(mask.sum())
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = EmbeddedModelSpec(num_layers=8, num_experts=32, top_k=4, hidden_size=512)
    model, tokenizer = build_embedded_policy(spec)
    model.eval()
    texts = load_suite("general", args.texts).texts
    rows = tokenize_suite(tokenizer, texts, args.max_tokens)
    tokens = sum(map(len, rows))
    samples = interleave({
        "collect": lambda: collect(model, tokenizer, texts, batch_size=args.batch_size, max_tokens=args.max_tokens),
        "plain": lambda: plain(model, rows, args.batch_size, tokenizer.pad_token_id),
    }, args.rounds)
    print(f"torch {torch.__version__}; {platform.machine()}, {torch.get_num_threads()} torch thread(s); embedded "
          f"qwen3_moe 8L, 32E, top-4, h512; suite general, {len(texts)} texts, {tokens} tokens "
          f"(max {args.max_tokens} per text), batch {args.batch_size}; {args.rounds} rounds (+1 warm-up)\n")
    print("| measurement | contender ms | baseline ms | ratio (wall) | ratio (CPU time) "
          "| per-round wall ratio p25-p75 |")
    print("|---|---|---|---|---|---|")
    print(ratio_row("probe `collect` (recording) vs plain forwards", samples["collect"], samples["plain"]))
    print(f"\nthroughput: collect {tokens / med(samples['collect'].wall):.0f} tokens/s, plain "
          f"{tokens / med(samples['plain'].wall):.0f} tokens/s (wall medians)")


if __name__ == "__main__":
    main()
