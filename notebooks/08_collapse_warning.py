# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 08 · See a collapse coming: does a rule over moestab's per-step signals warn before a GRPO run collapses?
#
# MoE GRPO runs collapse (notebook 07: 8 of 15 baseline runs at lr 5e-4, nearly every run at 1e-3; 1 of 15 in
# notebook 09's second draw of the same design), and a user
# learns of it from the reward curve. Issue 57 asked whether moestab's per-step signals (routing change old->new and
# rollout->trainer, expert-load entropy, ratio spread, clipping, KL, reward, gradient norm) warn of a collapse before
# it shows, and whether the routing signals add anything over what any trainer logs. This notebook reads the study
# registered before any of its evaluations (docs/collapse.md; library `moestab.experiments.collapse_study`, the rule
# `moestab.metrics.collapse_warning`):
#
# - **collapse**: final eval accuracy more than 10 points below the start; **onset**: the first evaluation from which
#   every evaluation stays more than 5 points below the start;
# - **hit**: a warning in the 30 steps before the onset (lead time: the onset minus the first such warning);
#   **false alarm**: a warning in a run that did not collapse, per 100 watched steps (after the 10-step baseline);
# - **candidates**: one rule per signal (its z-score against the run's own first 10 steps, smoothed) and three small
#   logistic models (baselines only; baselines and routing; all), each calibrated on the **development runs** to at
#   most 0.5 false alarms per 100 steps; the one with the highest development recall is shipped as moestab's default;
# - **held-out runs**, never used to fit: new seeds (3000-3009) of MoE GRPO without replay and with R3 at lr 5e-4 and
#   without replay at 1e-3, and a setting the development runs lack (the default 4-layer model at 1e-3), scored once.
#
# At full size it reads `docs/collapse_results/`, which `scripts/collapse_study.py fit` and `report` wrote from the run
# folders. At smoke size it runs the same fit and report on synthetic records (noise, and a planted rise of one signal
# before a planted onset) to exercise the pipeline; it measures nothing.

# %% tags=["parameters"]
SIZE = "full"  # "smoke": synthetic records through fit and report (the pipeline only); "full": the study's results

# %%
import json
import re
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's, with this machine's paths in it

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from moestab.experiments import collapse_study as study
from moestab.experiments import powered
from moestab.experiments.figures import plot_recall_curves, plot_warning_timelines
from moestab.experiments.findings import show_findings
from moestab.metrics.collapse_warning import DEFAULT_RULE, SIGNALS

pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 14)
STEPS = 100
if SIZE == "full":
    RESULTS, REGISTRATION = Path("docs/collapse_results"), Path("docs/collapse.md")
    registered_at = re.search(r"^registered (\S+)$", REGISTRATION.read_text(), re.M).group(1)
else:  # synthetic records: every signal noise; a collapsed run's routing change rises 30 steps before its onset
    RESULTS = Path("runs/notebooks/08/smoke")
    RESULTS.mkdir(parents=True, exist_ok=True)
    registered_at = "smoke"

    def synthetic(seed: int, split: str, collapsed: bool) -> study.RunRecord:
        rng = np.random.default_rng(seed)
        frame = pd.DataFrame({"step": np.arange(1, STEPS + 1)})
        for signal in SIGNALS.values():
            frame[signal.key] = 1.0 + 0.05 * rng.standard_normal(STEPS)
        if collapsed:
            frame.loc[49:, SIGNALS["vol"].key] += np.linspace(0, 1.0, STEPS - 49)
        run = study.StudyRun(Path(f"synthetic/{split}/seed-{seed}"), split, "synthetic", seed)
        return study.RunRecord(run, frame, 80 if collapsed else None, 0.5, 0.3 if collapsed else 0.5)

    dev = [synthetic(s, "dev", s % 2 == 0) for s in range(8)]
    held = [synthetic(s, "held_seeds", s % 2 == 0) for s in range(100, 104)]
    study.save_fit(study.fit(dev), RESULTS)
    study.save_report(study.report(dev, held, json.loads((RESULTS / "chosen.json").read_text())), RESULTS)
choice = json.loads((RESULTS / "chosen.json").read_text())
candidates = pd.read_csv(RESULTS / "dev_candidates.csv")
dev_runs = pd.read_csv(RESULTS / "dev_runs.csv", dtype={"warnings": str})  # "12" alone is not a number
held_out_scored = (RESULTS / "held_out_runs.csv").is_file()
print(f"registered {registered_at}; {len(dev_runs)} development runs, {int(dev_runs.collapsed.sum())} collapsed; "
      f"held-out runs scored: {'yes' if held_out_scored else 'not yet'}")

# %% [markdown]
# ## On the development runs: every candidate at the operating point
#
# Each candidate at the lowest threshold whose false alarms stay within 0.5 per 100 watched steps of the development
# runs that did not collapse. `family`: *baseline* signals any trainer logs (reward falling, KL rising, clip fraction
# rising, gradient norm), *routing*, *ratio* and *policy* (entropy) signals moestab records; a model over several
# families lists them. Recall is the share of collapsed runs warned
# in the 30 steps before their onset; the lead is in steps.

# %%
def family(signals: str) -> str:
    kinds = {SIGNALS[s].family for s in signals.split()}
    return kinds.pop() if len(kinds) == 1 else "+".join(sorted(kinds))


candidates["family"] = candidates["signals"].map(family)
shown = ["rule", "family", "threshold", "collapsed", "hits", "recall", "false_alarms_per_100", "lead_median",
         "lead_min", "lead_max"]
display(candidates[shown].sort_values(["recall", "lead_median"], ascending=False).round(3))
print("shipped (the registered choice):", choice["shipped"]["name"], "; best with baselines only:",
      choice["best_baselines_only"]["name"], "; best holding a routing signal:", choice["best_with_routing"]["name"])

# %%
fig, ax = plt.subplots(figsize=(7, 3.6))
order = candidates.sort_values("recall")
colours = {"baseline": "tab:grey", "routing": "tab:blue", "ratio": "tab:green", "policy": "tab:olive"}
ax.barh(order["rule"], order["recall"], color=[colours.get(f, "tab:purple") for f in order["family"]])
ax.set(xlabel="development recall at <= 0.5 false alarms per 100 steps", xlim=(0, 1),
       title="Candidates on the development runs (grey: baselines; blue: routing; green: ratio; olive: policy "
             "entropy; purple: a model mixing families)")
ax.title.set_fontsize(9)
fig.tight_layout()

# %% [markdown]
# ## The shipped rule, run by run (development)
#
# Each row a collapsed development run (every run that did not collapse is summarised below it): the shipped rule's
# warnings (blue ticks), the onset (red cross) and the 30 steps before it in which a warning is a hit (shaded).

# %%
collapsed_dev = dev_runs[dev_runs.collapsed].sort_values(["arm", "seed"])
fig, ax = plt.subplots(figsize=(8, 0.3 * len(collapsed_dev) + 1.2))
plot_warning_timelines(ax, collapsed_dev, study.HORIZON, STEPS)
ax.set_title(f"{choice['shipped']['name']} on the collapsed development runs", fontsize=9)
fig.tight_layout()
quiet_dev = dev_runs[~dev_runs.collapsed]
print(f"{len(quiet_dev)} development runs did not collapse: {int(quiet_dev.false_alarms.sum())} false alarm(s) over "
      f"{int(quiet_dev.watched_steps.sum())} watched steps, in {int((quiet_dev.false_alarms > 0).sum())} run(s)")

# %% [markdown]
# ## The held-out runs, scored once
#
# The shipped rule on every held-out run (new seeds; the default model, a setting the development runs lack), then
# every calibrated candidate per held-out set, and the recall curve: the shipped rule and the best rule of each family
# re-calibrated on the development runs at 0.25, 0.5, 1 and 2 false alarms per 100 steps, each scored on the held-out
# runs. The registered reading: routing signals add over the baselines if the best candidate holding a routing signal
# has a higher held-out recall at the operating point than the best baselines-only candidate.

# %%
if held_out_scored:
    held_runs = pd.read_csv(RESULTS / "held_out_runs.csv", dtype={"warnings": str})
    held_table = pd.read_csv(RESULTS / "held_out.csv")
    curve = pd.read_csv(RESULTS / "recall_curve.csv")
    display(held_runs[["split", "arm", "seed", "collapsed", "onset", "warnings", "hit", "lead", "false_alarms"]])
else:
    print("Not yet: the held-out runs are still training (scripts/collapse_study.py run); `report` scores them once "
          "all have finished.")

# %%
if held_out_scored:
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(held_runs) + 1.2))
    plot_warning_timelines(ax, held_runs.sort_values(["split", "arm", "seed"]), study.HORIZON, STEPS)
    ax.set_title(f"{choice['shipped']['name']} on every held-out run", fontsize=9)
    fig.tight_layout()

# %%
if held_out_scored:
    named = {}  # rule -> its roles (the shipped rule may also be the best holding a routing signal)
    for role in ("shipped", "best_baselines_only", "best_with_routing"):
        named[choice[role]["name"]] = " + ".join(filter(None, [named.get(choice[role]["name"]), role]))
    display(held_table[held_table["rule"].isin(named)].assign(role=lambda t: t["rule"].map(named))[
        ["split", "rule", "role", "runs", "collapsed", "hits", "recall", "false_alarms_per_100", "lead_median"]]
        .round(3))
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    plot_recall_curves(ax, curve, "false_alarms_per_100_dev", "held_out_recall")
    ax.set(xlabel="false alarms per 100 steps allowed on the development runs", ylabel="held-out recall")
    ax.set_title("Held-out recall against the false-alarm budget", fontsize=9)
    fig.tight_layout()

# %% [markdown]
# ## Cost
#
# docs/collapse.md estimated the study's own runs before they started. Measured: the sum over the study's own runs of
# created -> finished (one thread per run, so run-hours are core-hours; two runs shared the 2-core machine, so a run
# took longer than alone). The development runs borrowed from issue 52 are counted in its cost (docs/drift.md).

# %%
hours = None  # the smoke's synthetic records have no run folders
if held_out_scored and SIZE == "full":
    runs_manifest = pd.read_csv(RESULTS / "manifest.csv")
    hours = powered.run_hours(runs_manifest)
    print(f"{len(runs_manifest)} runs of the study's own: {hours:.2f} core-hours measured")

# %%
shipped = candidates.set_index("rule").loc[choice["shipped"]["name"]]
baselines = candidates.set_index("rule").loc[choice["best_baselines_only"]["name"]]
findings = {"dev.runs": len(dev_runs), "dev.collapsed": int(dev_runs.collapsed.sum()),
            "shipped.rule": choice["shipped"]["name"], "shipped.signals": len(choice["shipped"]["signals"]),
            "dev.shipped.hits": int(shipped["hits"]), "dev.shipped.recall": shipped["recall"],
            "dev.shipped.fa_per_100": shipped["false_alarms_per_100"],
            "dev.shipped.lead_median": shipped["lead_median"],
            "baselines.rule": choice["best_baselines_only"]["name"], "dev.baselines.hits": int(baselines["hits"]),
            "dev.baselines.recall": baselines["recall"], "dev.baselines.fa_per_100": baselines["false_alarms_per_100"],
            "default_rule_is_shipped": SIZE != "full" or study.rule_from_dict(choice["shipped"]) == DEFAULT_RULE,
            "held_out.scored": held_out_scored}
if held_out_scored:
    together = held_table[held_table["split"] == "held_out"].set_index("rule")
    for role in ("shipped", "best_baselines_only", "best_with_routing"):
        row = together.loc[choice[role]["name"]]
        for column in ("runs", "collapsed", "hits", "recall", "false_alarms_per_100", "lead_median"):
            findings[f"held_out.{role}.{column}"] = row[column]
    with_routing = together.loc[choice["best_with_routing"]["name"], "recall"]
    baselines_only = together.loc[choice["best_baselines_only"]["name"], "recall"]
    # The registered reading; undefined (None) when no held-out run collapsed and recall is not defined.
    findings["held_out.routing_adds"] = (None if pd.isna(with_routing) or pd.isna(baselines_only)
                                         else bool(with_routing > baselines_only))
    for split, rows in held_table[held_table["split"] != "held_out"].groupby("split"):
        row = rows.set_index("rule").loc[choice["shipped"]["name"]]
        for column in ("runs", "collapsed", "hits", "false_alarms_per_100", "lead_median"):
            findings[f"{split}.shipped.{column}"] = row[column]
    arms = held_runs.groupby("arm")
    findings.update({f"{arm}.collapsed": int(rows["collapsed"].sum()) for arm, rows in arms})
    findings.update({f"{arm}.onset_min": rows["onset"].min() for arm, rows in arms})
    findings["core_hours"] = hours
show_findings(findings)
