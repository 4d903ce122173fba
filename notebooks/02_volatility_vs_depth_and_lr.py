# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 02 · One-step routing volatility: how it compounds over depth, and how it grows with lr and updates
#
# The R3 paper reports that 10% of routers but 94% of tokens (at least one layer) route differently between the
# rollout engine and the trainer on the same weights: small per-router differences add up over depth. The GSPO
# paper reports that the experts chosen for the same tokens drift with every gradient update. This notebook
# measures both on the embedded policy with the step probes (`moestab.probes.depth`,
# `moestab.probes.step_volatility`): one GRPO step of `moestab train` (32 prompts x 8 samples, arithmetic), replay
# off, from warm-started bases. Claims checked (docs/findings.md): **4**, tokens with >= 1 flipped layer >>
# per-router flip rate, read against the independent-layer baseline `1 - (1 - p)^L` (`moestab.analysis.depth`)
# for both the rollout->trainer gap (a bf16 rollout engine against the fp32 trainer, R3's setting) and one
# update (old->new); **2**, the first minibatch's drift is 0 and later minibatches drift more, rising with index
# and lr.

# %% tags=["parameters"]
SIZE = "full"  # "smoke": fresh weights, 2 depths, 1 seed, to check the notebook runs; "full": docs/findings.md

# %%
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's, with this machine's paths in it

import matplotlib.pyplot as plt
import pandas as pd
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from moestab.analysis.depth import depth_baseline
from moestab.experiments.figures import plot_mean_sd
from moestab.experiments.findings import show_findings
from moestab.probes.depth import depth
from moestab.probes.one_step import StepRecipe
from moestab.probes.step_volatility import step_volatility
from moestab.tasks import task_from_spec
from moestab.train import TrainConfig
from moestab.train.recipe import base_policy_path

hf_logging.disable_progress_bar()
if SIZE == "smoke":  # a random policy earns no arithmetic reward; smoke uses a reward that varies anyway
    Path("smoke_reward.py").write_text("def parity(prompt, completion, answer):\n    return float(len(completion) % 2)\n")
P = {"smoke": dict(layers=[2, 4], seeds=[0], lrs=[1e-3], minibatch_counts=[1, 2], warm_start=False,
                   task="arithmetic:reward=smoke_reward.py:parity"),
     "full": dict(layers=[2, 4, 8, 16], seeds=[0, 1], lrs=[2e-4, 5e-4, 1e-3], minibatch_counts=[1, 2, 4],
                  warm_start=True, task="arithmetic")}[SIZE]
P

# %% [markdown]
# ## Depth: the rollout->trainer gap and one update (minibatches = 1, lr 2e-4, `moestab train`'s default)
#
# Each depth is its own warm-started base (supervised until 40% greedy accuracy, as `moestab train` builds it,
# cached), so the policies differ in more than depth; `warm_start_accuracy` shows where each started. The rollout
# engine samples with a bf16 copy of the policy (`moestab train --rollout-dtype bfloat16`), the trainer runs fp32
# on the same weights, so one step gives both pairs on the same tokens: **rollout->trainer** (`rollout_old`: the
# engine's experts against the trainer's pi_old, what R3's 10% / 94% measures) and **old->new** (one update of the
# trainer). For each, the measured share of tokens with >= 1 flipped layer is set beside what independent layers
# would give at the row's router flip rate `p`: `1 - (1 - p)^L` (`_independent`), and their ratio (`_excess`: 1 =
# independent layers; < 1 = a token's layers flip together, e.g. one flip cascading into later layers, so the same
# flips fall on fewer tokens).

# %%
PAIRS = ("rollout_old", "old_new")
frames, layer_frames = [], []
for seed in P["seeds"]:
    recipe = StepRecipe(task=task_from_spec(P["task"]), seed=seed, rollout_dtype="bfloat16")
    tables = depth(recipe, layers=P["layers"], lr=2e-4, warm_start=P["warm_start"])
    frames.append(tables["depth"].assign(seed=seed))
    layer_frames.append(tables["depth_by_layer"].assign(seed=seed))
by_depth = depth_baseline(pd.concat(frames, ignore_index=True), PAIRS)
for pair in PAIRS:
    by_depth[f"{pair}_token_router_ratio"] = by_depth[f"{pair}_token_flip"] / by_depth[f"{pair}_router_flip"]
columns = [f"{pair}_{c}" for pair in PAIRS for c in ("router_flip", "token_flip", "token_flip_independent",
                                                       "token_flip_excess")]
depth_stats = by_depth.groupby("depth")[[*columns, "warm_start_accuracy"]].agg(["mean", "std"])
found = {"depth.seeds": len(P["seeds"])}
for n, rows in by_depth.groupby("depth"):
    for pair, name in (("rollout_old", "rollout"), ("old_new", "update")):
        found |= {f"depth.{name}_routers_{n}": rows[f"{pair}_router_flip"].mean(),
                  f"depth.{name}_routers_sd_{n}": rows[f"{pair}_router_flip"].std(),
                  f"depth.{name}_tokens_{n}": rows[f"{pair}_token_flip"].mean(),
                  f"depth.{name}_tokens_sd_{n}": rows[f"{pair}_token_flip"].std(),
                  f"depth.{name}_predicted_tokens_{n}": rows[f"{pair}_token_flip_independent"].mean(),
                  f"depth.{name}_excess_{n}": rows[f"{pair}_token_flip_excess"].mean(),
                  f"depth.{name}_token_router_ratio_{n}": rows[f"{pair}_token_router_ratio"].mean()}
    found[f"depth.warm_start_accuracy_{n}"] = rows.warm_start_accuracy.mean()
show_findings(found)
depth_stats.T.round(4)

# %%
fig, ax = plt.subplots(1, 3, figsize=(15, 3.6))
for a, pair, title in ((ax[0], "rollout_old", "rollout (bf16) -> trainer (fp32)"), (ax[1], "old_new", "one update")):
    plot_mean_sd(a, by_depth, "depth", f"{pair}_router_flip", label="routers flipped")
    plot_mean_sd(a, by_depth, "depth", f"{pair}_token_flip", label="tokens with >= 1 flipped layer")
    plot_mean_sd(a, by_depth, "depth", f"{pair}_token_flip_independent", label="independent layers: 1 - (1 - p)^L")
    a.set(xscale="log", xticks=P["layers"], xticklabels=P["layers"], ylabel="share", title=title)
    a.minorticks_off()
    a.legend()
per_layer = pd.concat(layer_frames, ignore_index=True).groupby(["depth", "layer"]).changed.mean().reset_index()
for n, rows in per_layer.groupby("depth"):
    ax[2].plot(rows.layer / max(rows.layer.max(), 1), rows.changed, marker="o", label=f"{n} layers")
ax[2].set(xlabel="relative layer position (0 = first, 1 = last)", ylabel="changed old -> new (activated experts)",
          title="one update: change by layer")
ax[2].legend()
fig.tight_layout()

# %% [markdown]
# ## Learning rate and number of updates: one step from the 4-layer base

# %%
vol, by_mb = [], []
for seed in P["seeds"]:
    recipe = StepRecipe(task=task_from_spec(P["task"]), seed=seed)
    if P["warm_start"]:
        path, _ = base_policy_path(TrainConfig(seed=seed), recipe.task, log=lambda s: None)
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    else:
        from moestab.models import build_embedded_policy

        model, tokenizer = build_embedded_policy()
    tables = step_volatility(model, tokenizer, recipe, lrs=P["lrs"], minibatch_counts=P["minibatch_counts"])
    vol.append(tables["step_volatility"].assign(seed=seed))
    by_mb.append(tables["step_volatility_by_minibatch"].assign(seed=seed))
vol, by_mb = pd.concat(vol, ignore_index=True), pd.concat(by_mb, ignore_index=True)
vol.groupby(["lr", "minibatches"])[["old_new_changed", "old_new_router_flip", "old_new_token_flip",
                                    "ratio_token_log_var", "clip_token_frac"]].mean()

# %%
most = max(P["minibatch_counts"])
drift = by_mb[by_mb.minibatches == most]
fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
plot_mean_sd(ax[0], drift, "minibatch", "update_old_changed", by=["lr"])
ax[0].set(title=f"drift from pi_old at each of {most} updates", xlabel="minibatch (0-based)",
          ylabel="update -> old changed")
ax[0].legend()
plot_mean_sd(ax[1], vol, "minibatches", "old_new_changed", by=["lr"])
ax[1].set(title="old -> new change after the step", ylabel="changed")
ax[1].legend()
fig.tight_layout()
drift_stats = drift.groupby(["lr", "minibatch"]).update_old_changed.agg(["mean", "std"])
found = {"drift.seeds": len(P["seeds"]), "drift.minibatches": most,
         "drift.first_update_max": by_mb[by_mb.minibatch == 0].update_old_changed.abs().max()}
for (lr, m), row in drift_stats.iterrows():
    found |= {f"drift.lr{lr:g}_mb{m + 1}": row["mean"], f"drift.lr{lr:g}_mb{m + 1}_sd": row["std"]}
for (lr, n), rows in vol.groupby(["lr", "minibatches"]):
    found |= {f"step.lr{lr:g}_mb{n}_old_new_changed": rows.old_new_changed.mean(),
              f"step.lr{lr:g}_mb{n}_token_log_var": rows.ratio_token_log_var.mean(),
              f"step.lr{lr:g}_mb{n}_clip_token_frac": rows.clip_token_frac.mean()}
show_findings(found)
drift_stats

# %% [markdown]
# ## R3's 10% / 94% read at its model's depth
#
# The R3 paper compared the rollout engine with the trainer on Qwen3-30B-A3B, whose 48 layers are all MoE layers:
# 10% of routers and 94% of tokens (>= 1 flipped layer) differed. If those 48 layers flipped independently at 10%
# each, the token share would be `1 - (1 - p)^L` (`independent_token_flip`, the baseline of the depth cells).
# Inverting it gives what the 94% implies: the per-layer rate at which 48 independent layers reach 94%, and the depth
# at which 10% per layer reaches it.
#
# This cell is arithmetic on the paper's figures and reads nothing the cells above compute. It was added (issue 41.5)
# after the full-size run and executed on its own, after the notebook's setup cell: re-executing the whole notebook
# now would warm-start its bases with the load-balancing loss that issue 41.1 made the default, which would change
# every measured number above (`--warm-start-aux-loss-coef`, docs/routers.md).

# %%
import math

from moestab.analysis.depth import independent_token_flip

R3 = {"layers": 48, "router_flip": 0.10, "token_flip": 0.94}  # the R3 paper's figures, Qwen3-30B-A3B
r3_independent = float(independent_token_flip(R3["router_flip"], R3["layers"]))
r3_rate = 1 - (1 - R3["token_flip"]) ** (1 / R3["layers"])  # p with 1 - (1 - p)^48 = 0.94
r3_depth = math.log(1 - R3["token_flip"]) / math.log(1 - R3["router_flip"])  # L with 1 - 0.9^L = 0.94
show_findings({"r3.layers": R3["layers"], "r3.router_flip": R3["router_flip"], "r3.token_flip": R3["token_flip"],
               "r3.independent_tokens": r3_independent, "r3.rate_for_tokens": r3_rate,
               "r3.layers_for_tokens": r3_depth})
print(f"independent layers, {R3['layers']} layers at {R3['router_flip']:.0%} each: {r3_independent:.1%} of tokens "
      f"(R3 measured {R3['token_flip']:.0%})")
print(f"{R3['token_flip']:.0%} of tokens at {R3['layers']} independent layers needs {r3_rate:.1%} per layer; "
      f"{R3['router_flip']:.0%} per layer reaches it at {r3_depth:.1f} layers")

# %% [markdown]
# ## Reading
#
# Written from the full-size run (2 seeds; one GRPO step of 32 prompts x 8 samples from each warm-started base, the
# rollouts sampled by a bf16 engine); the numbers are the published findings above.
#
# - **Claim 4, direction reproduced; the growth with depth is what independent layers give, nothing more.** Between
#   the bf16 rollout engine and the fp32 trainer on the same weights (R3's measurement), 0.3-0.7% of routers
#   flipped at every depth, and the share of tokens with at least one flipped layer grew with depth: 1.1 / 2.2 /
#   5.2 / 4.3% at 2 / 4 / 8 / 16 layers, against 1.1 / 2.2 / 5.1 / 5.0% that `1 - (1 - p)^L` predicts from each
#   policy's own router flip rate `p` (measured / predicted 1.00 / 0.98 / 1.01 / 0.90). One update (old->new) flips
#   more, 2.3-4.4% of routers, and 5.7 / 16.5 / 14.8 / 30.9% of tokens against 5.7 / 16.3 / 16.8 / 30.4% predicted
#   (1.00 / 1.02 / 0.88 / 1.02). So the token/router ratio growing about linearly with depth (14.0x at 16 layers
#   rollout->trainer, 13.7x old->new) is the arithmetic of L independent chances: flips in one layer do not cascade
#   into later ones beyond that (where measured / predicted is below 1, 0.88 at 8 layers old->new and 0.90 at 16
#   layers rollout->trainer, flips fell on the same tokens slightly more often than chance). The R3 paper's 10% of
#   routers vs 94% of tokens is *not* what independent layers give on its model: at Qwen3-30B-A3B's 48 MoE layers,
#   10% per layer would put a flip on more tokens than 94% (`r3.independent_tokens` above), so R3's 94% implies
#   flips correlated across a token's layers (they fall on the same tokens), or a lower per-layer rate
#   (`r3.rate_for_tokens`); 10% per layer reaches 94% only at about half that depth (`r3.layers_for_tokens`). An
#   earlier version of this reading compared 94% with 27 independent layers and missed that the model has 48. This
#   policy's gap is far smaller (at 16 layers 0.32% +- 0.11% of routers, 4.3% +- 0.6% of tokens), and its old->new
#   change is one update, not the rollout->trainer gap R3 reports.
# - **Claim 2, reproduced for lr, mostly for the update index.** The first update's drift from pi_old is exactly 0
#   in every setting (it updates from pi_old's own weights). Later updates drift 2-3% of the activated experts at
#   lr 2e-4, 5-7% at 5e-4 and 9-14% at 1e-3: rising with lr. Within a step the fourth update drifts most, but the
#   third is not always above the second (lr 2e-4: 2.5%, 2.2%, 3.0%; 2 seeds, sd about half the mean).
# - The token log-ratio variance grows with both (0.10 at lr 2e-4 with 2 updates, 5.9 at 1e-3 with 4), and so
#   does GRPO's clip fraction (6% to 19%).
# - Caveats: each depth is a different warm-started base (greedy accuracy 42-54% at the start); 2 seeds, whose
#   router flip rates differ by up to a factor of 2 at some depths (the baseline is computed per seed, from each
#   policy's own rate); this is the first RL step with a fresh optimizer, which moves routing more than the average
#   step of a run (README: 0.36-0.77% drift per update over 60 steps at lr 2e-4).
