# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 09 · Which routing change breaks GRPO here: within a step or across steps?
#
# Notebook 07's registered result: at lr 5e-4 on the 8-layer MoE of 64 experts, holding route selection at the frozen
# base's (routing-constant) prevented GRPO's collapse, while R2 / R3, which remove only the routing change *within* a
# step (GSPO §5.3's mechanism), did not detectably help. Routing-constant also stops drift *across* steps and away
# from the base's balanced routes, removes routing's adaptation and is evaluated under the base's routes. Issue 52's
# experiment, registered before its runs (docs/drift.md; library `moestab.experiments.drift`), takes that apart:
#
# - **stage 1** (descriptive, no test registered): the three arms the analysis needs rebuilt on the same 15 seeds;
#   each final checkpoint evaluated under free routes and under the base's; per step, the distance of the rollout's
#   routes from the base's, the expert-load entropy, and the routing change after one update beside the change per
#   step (4 updates);
# - **stage 2** (a dose-response): routing held at a frozen copy of the policy refreshed every K steps (K = 1, 10, 33;
#   K = infinity is routing-constant), and the baseline with a load-balancing loss during RL;
# - **stage 3** (GSPO: routing or step size): GSPO with routing held and on the dense model, their GRPO counterparts,
#   and GRPO at the lr whose routing change is GSPO's.
#
# Outcomes, as registered: **mean eval accuracy over the run's 10 evaluations** (primary) and **collapse** (final
# accuracy more than 10 points below the start; co-primary, exact McNemar test), paired by seed, each stage's
# primary contrasts Holm-corrected together per outcome.
#
# At full size this notebook reads `docs/drift_results/`, which `scripts/drift_experiment.py report` wrote from the run
# folders (a stage's contrasts appear once all its runs have finished). At smoke size it runs a tiny design end to end
# (1 layer, every reward 0, 2 steps, 2 seeds) to exercise the pipeline; it measures nothing.

# %% tags=["parameters"]
SIZE = "full"  # "smoke": a tiny design run end to end (the pipeline only); "full": the registered experiment's results

# %%
import re
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's, with this machine's paths in it

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display
from transformers.utils import logging as hf_logging

from moestab.experiments import drift, powered
from moestab.experiments import precondition as pre
from moestab.experiments.figures import plot_intervals, plot_mean_sd
from moestab.experiments.findings import show_findings
from moestab.experiments.provenance import commit_problems, read_declarations
from moestab.experiments.registration import block
from moestab.metrics.paired import paired_interval

hf_logging.disable_progress_bar()
pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 14)
if SIZE == "full":
    setting = {s.name: s for s in pre.SETTINGS}["fine8-lr5e-4"]
    base = powered.Design(model=setting.model, lr=setting.lr, aux=setting.aux, task=setting.task)
    design = drift.DriftDesign(base, lr_match=drift.matching_lr(pd.read_csv("docs/powered_results/curves.csv")))
    RESULTS, REGISTRATION = Path("docs/drift_results"), Path("docs/drift.md")
else:  # every reward 0: exercises every stage on a tiny design, measures nothing
    OUT = Path("runs/notebooks/09/smoke")
    base = powered.smoke_design(OUT)
    design = drift.DriftDesign(base, lr_match=7e-4)
    RESULTS, REGISTRATION = OUT / "results", OUT / "drift.md"
    REGISTRATION.write_text("registered 2026-01-01T00:00:00+00:00\n\n" + block(drift.registration(design)) + "\n")
    drift.run_experiment(design, OUT / "runs", REGISTRATION, log=lambda line: None)  # finished runs are reused
    drift.write_results(design, OUT / "runs", RESULTS)
registered_at = re.search(r"^registered (\S+)$", REGISTRATION.read_text(), re.M).group(1)
outcomes = pd.read_csv(RESULTS / "outcomes.csv")
contrasts = pd.read_csv(RESULTS / "contrasts.csv")
checkpoints = pd.read_csv(RESULTS / "checkpoint_evals.csv")
curves = pd.read_csv(RESULTS / "step_curves.csv")
manifest = pd.read_csv(RESULTS / "manifest.csv")
stage_of = {arm: stage for arm, (stage, _) in drift.ARMS.items()}
finished_by_stage = outcomes["arm"].map(stage_of).value_counts().sort_index()
planned_by_stage = pd.Series([stage_of[r.run_dir.parent.name] for r in drift.all_runs(design, "out")]).value_counts()
per_stage = planned_by_stage.sort_index().items()
print(f"registered {registered_at}; runs reported per stage (a stage once all its runs have finished): "
      + ", ".join(f"stage {s} {int(finished_by_stage.get(s, 0))} of {n}" for s, n in per_stage))
declared = read_declarations(RESULTS / "same_code.csv")  # commits scripts/same_run.py showed give the same runs
problems = commit_problems(manifest, declared)
commits = sorted(set(manifest["commit"].fillna("none").astype(str).str[:7]))
print("provenance:", problems if problems else f"clean trees; commits {commits}"
      + (f", declared the same code ({len(declared)} declaration)" if len(declared) else ""))

# %% [markdown]
# ## Every finished arm: mean eval accuracy and collapses
#
# Mean eval accuracy over the run's evaluations after step 0 (the primary outcome), mean and sd over seeds; the number
# of runs that collapsed; `free_eval` and `free_collapses`: the same from the checkpoints of steps 20-100 evaluated with
# free routes (amendment 1; the free arms' recorded evaluations at those steps). A stage's arms appear once all its
# runs have finished: the report reads nothing of a stage before, so no interim look steers it.

# %%
by_arm = outcomes.groupby("arm").agg(stage=("arm", lambda a: stage_of[a.iloc[0]]), runs=("seed", "count"),
                                     mean_eval=("mean_eval_acc", "mean"), mean_eval_sd=("mean_eval_acc", "std"),
                                     start=("start_acc", "mean"), final=("final_acc", "mean"),
                                     collapses=("collapse", "sum"), free_eval=("free_eval_acc", "mean"),
                                     free_collapses=("free_collapse", "sum"))
by_arm = by_arm.reindex([a for a in drift.ARMS if a in by_arm.index])
by_arm.round(4)

# %% [markdown]
# ## Stage 1 beside the powered experiment: a replication, not a copy
#
# The registration reports the rebuilt runs' start and final accuracy beside the powered experiment's committed ones
# (same arm, seed and lr; `replication.csv`): equal where the code and the CPU give the same floats, otherwise a second
# draw of the same design. The powered experiment ran on a 2-core AMD EPYC VM, these runs on a 2-core Intel Xeon VM,
# with later code; which of the two makes the floats differ was not tested. Below: how many seeds match exactly, and
# per arm the means and collapses of both draws; then, **post hoc** (not registered; 95% t-intervals, no correction),
# the registered experiment's contrasts recomputed on the rebuilt runs.

# %%
replication = pd.read_csv(RESULTS / "replication.csv")
if not replication.empty:  # stage 3 rebuilds two more of the powered experiment's arms: this section is stage 1's
    replication = replication[replication["arm"].isin(drift.ANALYSED_ARMS)]
if replication.empty:
    print("no replication: the committed outcomes were not given to the report")
else:
    print(f"{int(replication['same_start'].sum())} of {len(replication)} runs start at the committed accuracy, "
          f"{int(replication['same_final'].sum())} end at it")
    committed = pd.read_csv("docs/powered_results/outcomes.csv") if SIZE == "full" else None
    draws = replication.groupby("arm")[["start_acc", "start_acc_committed", "final_acc", "final_acc_committed"]].mean()
    draws["collapses"] = outcomes.groupby("arm")["collapse"].sum()
    if committed is not None:
        at_lr = committed[committed["lr"] == design.powered.lr]
        draws["collapses_committed"] = at_lr.groupby("arm")["collapse"].sum().astype(int)
    display(draws.round(4))
rebuilt = {}
for outcome in ("final_acc", "mean_eval_acc"):
    wide_outcome = outcomes[outcomes["arm"].isin(drift.ANALYSED_ARMS)].pivot(index="seed", columns="arm",
                                                                                values=outcome)
    for arm in ("constant_grpo", "moe_grpo_r3"):
        if arm in wide_outcome and drift.BASELINE in wide_outcome:
            ci = paired_interval(wide_outcome[arm].tolist(), wide_outcome[drift.BASELINE].tolist())
            rebuilt[(outcome, arm)] = {"mean_diff": ci.mean, "ci_low": ci.low, "ci_high": ci.high, "n": ci.n}
pd.DataFrame(rebuilt).T.rename_axis(["outcome", f"arm - {drift.BASELINE}"]).round(4)

# %% [markdown]
# ## Stage 1: what holding routes at the base's does to the policy
#
# Each final checkpoint evaluated under free routes and under the base's (every forward routed as the run's own
# warm-started base routes the same tokens); `recorded` is what the run measured at its end under its own routing.
# Differences are base minus free, paired by seed, with 95% t-intervals.

# %%
wide = checkpoints.set_index(["arm", "seed"])
rows = {}
for arm in [a for a in drift.ANALYSED_ARMS if a in wide.index.get_level_values(0)]:
    ci = paired_interval(wide.loc[arm, "base"].tolist(), wide.loc[arm, "free"].tolist())
    rows[arm] = {"free": wide.loc[arm, "free"].mean(), "base": wide.loc[arm, "base"].mean(),
                 "base_minus_free": ci.mean, "ci_low": ci.low, "ci_high": ci.high, "n": ci.n}
routed = pd.DataFrame(rows).T
routed.round(4)

# %% [markdown]
# Per step, mean +- sd over seeds: how far the rollout's routes are from the base's (`routing/base_rollout/changed`),
# the expert-load entropy (mean over layers; RL runs without a load-balancing loss), and the routing change after one
# update (`routing/update_old/changed_by_minibatch` at the second minibatch; none where the updates replay routes)
# beside the change old->new per step (across the step's 4 minibatch updates). GSPO's "~10%" is per update.

# %%
stage1 = curves[curves["arm"].isin(drift.ANALYSED_ARMS)]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
plot_mean_sd(axes[0], stage1, "step", "base_distance", by=["arm"])
axes[0].set(ylabel="share of slots routed unlike the base", title="Drift from the base")
plot_mean_sd(axes[1], stage1, "step", "load_entropy", by=["arm"])
axes[1].set(ylabel="expert-load entropy (nats)", title="Load balance")
baseline = stage1[stage1["arm"] == drift.BASELINE]
plot_mean_sd(axes[2], baseline, "step", "old_new", label="old -> new, per step (4 updates)")
plot_mean_sd(axes[2], baseline, "step", "single_update", label="after one update")
axes[2].set(ylabel="share of routed slots changed", title=f"{drift.BASELINE}: one update against one step")
for ax in axes:
    ax.legend(fontsize=7)
    ax.title.set_fontsize(9)
fig.tight_layout()

# %%
at = baseline.groupby("step")[["base_distance", "single_update", "old_new"]].mean()
steps_shown = [s for s in (1, 10, 50, design.powered.steps) if s in at.index]
display(at.loc[steps_shown].round(4))
single, per_step = baseline["single_update"].mean(), baseline["old_new"].mean()
later = at.loc[at.index >= 10, "single_update"]
print(f"{drift.BASELINE}, mean over every step and seed: after one update {single:.2%}, per step {per_step:.2%}; "
      f"after one update from step 10 on, per step's mean over seeds: {later.min():.2%} to {later.max():.2%}")
r3_at = stage1[stage1["arm"] == "moe_grpo_r3"].groupby("step")["base_distance"].mean()
print("moe_grpo_r3's distance from the base at steps " + ", ".join(f"{s}: {r3_at[s]:.1%}" for s in steps_shown))
entropy = stage1.groupby(["arm", "step"])["load_entropy"].mean().unstack(0)
print("expert-load entropy (nats) at the first and last step:",
      entropy.loc[[entropy.index.min(), entropy.index.max()]].round(3).to_dict())

# %% [markdown]
# ## Stages 2 and 3: the registered contrasts
#
# Each contrast paired by seed: the mean difference with its 95% t-interval, p (paired t for the mean eval accuracy;
# the exact McNemar test for collapse; the trend: the per-seed slope over K = 1, 10, 33, infinity coded 0-3, tested
# against 0), Holm's adjusted p over the stage's primary contrasts, the realized sd and the minimum detectable
# difference it gives (accuracy rows). `as_good_as`: amendment 1's rule for "as good as", the interval inside +- the
# stage's registered minimum detectable difference. A stage appears once all its runs have finished.

# %%
SHOWN = ["contrast", "outcome", "primary", "n", "mean_diff", "ci_low", "ci_high", "p", "p_holm", "sd",
         "min_detectable"]


def with_equivalence(rows: pd.DataFrame, stage: int) -> pd.DataFrame:
    accuracy = ~rows["outcome"].isin([drift.OUTCOMES[1], drift.FREE_OUTCOMES[1]]) & rows["contrast"].str.contains(" - ")
    return rows.assign(as_good_as=[drift.equivalent(r, design, stage) if a else None
                                   for (_, r), a in zip(rows.iterrows(), accuracy, strict=True)])


for stage in sorted(drift.CONTRASTS):
    rows = contrasts[contrasts["stage"] == stage] if "stage" in contrasts else contrasts.iloc[0:0]
    if rows.empty:
        print(f"stage {stage}: not complete (the report reads its {int(planned_by_stage[stage])} runs once all have "
              f"finished); registered reading: {drift.READINGS[stage]}")
        continue
    print(f"stage {stage}, registered reading: {drift.READINGS[stage]}")
    registered = rows[rows["registered_outcome"] & (rows["kind"] != "amended")]
    display(with_equivalence(registered, stage)[[*SHOWN, "as_good_as"]].round(4))

# %% [markdown]
# ## Amendment 1: every evaluation with free routes, and the contrasts the readings need
#
# Written before any stage 2 or 3 contrast was computed (docs/drift.md, "Amendment 1"). A run routed by a frozen model
# evaluates under that model's routes, up to K steps stale, which favours it by more the longer routing is held. Below:
# per arm, its checkpoints of steps 20-100 evaluated with free routes against what it recorded (held minus free); then
# every registered contrast on the free outcomes (its own Holm family), and the amended contrasts (the trend without
# K = infinity, GRPO at GSPO's routing change minus GSPO, the 2 x 2 interactions), unadjusted.

# %%
free = pd.read_csv(RESULTS / "free_evals.csv")
if free.empty:
    print("no free evaluations yet")
else:
    gap = free.assign(held_minus_free=free["recorded"] - free["free"]).groupby("arm").agg(
        runs=("seed", "nunique"), recorded=("recorded", "mean"), free=("free", "mean"),
        held_minus_free=("held_minus_free", "mean"), source=("source", "first"))
    display(gap.reindex([a for a in drift.ARMS if a in gap.index]).round(4))
for stage in sorted(set(contrasts["stage"])) if "stage" in contrasts else []:
    amended = ~contrasts["registered_outcome"] | (contrasts["kind"] == "amended")
    rows = contrasts[(contrasts["stage"] == stage) & amended]
    print(f"stage {stage}, amendment 1 (the registered contrasts on the free outcomes, and the amended ones):")
    display(with_equivalence(rows, stage)[[*SHOWN, "kind", "as_good_as"]].round(4))
late = curves[(curves["step"] >= 40) & curves["eval_acc"].notna() & curves["arm"].isin([a for a, _ in drift.DOSE])]
if not late.empty:  # K = 33 runs as routing-constant for steps 1-33: its evaluations from step 40 on, descriptively
    print("mean eval accuracy over the evaluations of steps 40-100 (recorded), mean over seeds:",
          late.groupby("arm")["eval_acc"].mean().round(4).to_dict())
lr_check = drift.lr_match_check(curves)
print("lr match in this draw (mean old->new over steps 1-40, lr-matched GRPO against GSPO, paired):",
      {k: round(v, 5) for k, v in lr_check.items()})

# %%
done = sorted(set(contrasts["stage"])) if "stage" in contrasts else []
if done:
    fig, axes = plt.subplots(1, len(done), figsize=(6.5 * len(done), 3.4), squeeze=False)
    for ax, stage in zip(axes[0], done, strict=True):
        rows = contrasts[(contrasts["stage"] == stage) & (contrasts["outcome"] == drift.OUTCOMES[0])
                         & (contrasts["contrast"] != drift.TREND)]  # the trend is a slope: its own line below
        plot_intervals(ax, rows, label="contrast", title=f"Stage {stage}: mean eval accuracy, paired differences")
        ax.title.set_fontsize(9)
    fig.tight_layout()

# %%
if 2 in done:
    dose = outcomes[outcomes["arm"].isin([a for a, _ in drift.DOSE])].assign(
        window=lambda t: t["arm"].map({a: c for a, c in drift.DOSE}))
    trend = contrasts[(contrasts["contrast"] == drift.TREND) & (contrasts["outcome"] == drift.OUTCOMES[0])].iloc[0]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    plot_mean_sd(ax, dose, "window", "mean_eval_acc", label="routes held for K steps")
    plot_mean_sd(ax, dose, "window", "free_eval_acc", label="the same, evaluated with free routes (amendment 1)")
    ax.axhline(outcomes[outcomes["arm"] == drift.BASELINE]["mean_eval_acc"].mean(), color="grey", linestyle=":",
               label="baseline (routing free)")
    ax.set_xticks([c for _, c in drift.DOSE], ["K = 1", "K = 10", "K = 33", "K = inf"])
    ax.set(xlabel="routes held for K steps", ylabel="mean eval accuracy",
           title=f"Dose-response, mean +- sd over seeds; trend {trend.mean_diff:+.2%} per level "
                 f"({trend.ci_low:+.2%}, {trend.ci_high:+.2%})")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()

# %% [markdown]
# ## Cost
#
# docs/drift.md estimated 12.9 core-hours before the start. Measured: the sum over finished runs of created -> last
# update (one thread per run; runs shared the 2-core machine with up to three others, so a run took longer than alone,
# and a run resumed after a stop counts its gap). Not counted: the warm-started bases, and stage 1's checkpoint
# evaluations.

# %%
hours = powered.run_hours(manifest)
print(f"{len(manifest)} finished runs: {hours:.2f} core-hours measured")

# %%
findings = {"runs": len(manifest), "core_hours": hours, "seeds": len(design.powered.seeds),
            "single_update.mean": single, "per_step.mean": per_step}
for arm, row in by_arm.iterrows():
    findings.update({f"{arm}.mean_eval": row["mean_eval"], f"{arm}.mean_eval_sd": row["mean_eval_sd"],
                     f"{arm}.collapses": int(row["collapses"]), f"{arm}.runs": int(row["runs"]),
                     f"{arm}.free_eval": row["free_eval"], f"{arm}.free_collapses": int(row["free_collapses"])})
for arm, row in routed.iterrows():
    findings.update({f"{arm}.{column}": row[column] for column in ("free", "base", "base_minus_free", "ci_low",
                                                                   "ci_high")})
for step in steps_shown:
    findings[f"base_distance.step{step}"] = at.loc[step, "base_distance"]
    findings[f"moe_grpo_r3.base_distance.step{step}"] = r3_at[step]
findings.update({"single_update.from10_min": later.min(), "single_update.from10_max": later.max()})
if not replication.empty:
    findings.update({"replication.runs": len(replication),
                     "replication.same_start": int(replication["same_start"].sum()),
                     "replication.same_final": int(replication["same_final"].sum())})
    for arm, row in draws.iterrows():
        findings.update({f"replication.{arm}.{column}": row[column] for column in draws.columns})
for (outcome, arm), row in rebuilt.items():
    findings.update({f"posthoc.{outcome}.{arm}.{column}": row[column] for column in ("mean_diff", "ci_low", "ci_high")})
for arm in entropy.columns:
    findings[f"{arm}.entropy_first"] = entropy[arm].iloc[0]
    findings[f"{arm}.entropy_last"] = entropy[arm].iloc[-1]
for row in contrasts.itertuples(index=False) if done else []:
    name = f"stage{row.stage}.{row.contrast.replace(' - ', '_minus_')}.{row.outcome}"
    findings.update({f"{name}.{c}": getattr(row, c) for c in ("mean_diff", "ci_low", "ci_high", "p", "p_holm", "n",
                                                              "sd", "min_detectable")})
    if row.outcome in (drift.OUTCOMES[0], drift.FREE_OUTCOMES[0]) and " - " in row.contrast:  # arm - reference
        findings[f"{name}.as_good_as"] = drift.equivalent(row._asdict(), design, row.stage)
if not free.empty:
    for arm, row in gap.iterrows():
        findings[f"free.{arm}.held_minus_free"] = row["held_minus_free"]
findings.update({f"lr_match.{k}": v for k, v in lr_check.items()})
show_findings(findings)
