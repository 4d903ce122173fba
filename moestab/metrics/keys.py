"""Every metrics.jsonl key, declared once: its type and shape, the function that computes it, its definition.

The recording layer (:mod:`moestab.recording.step_metrics`) computes the keys this table gives to it and writes
each line in the table's order, refusing a key the table does not declare; ``moestab analyze``, the dashboard, the
probes, the trackers and the progress bar read the key names from here; docs/metrics.md's key reference is
generated from :data:`TABLE` (``python scripts/metric_docs.py``; ``tests/test_docs.py`` fails when they differ).

A row (:class:`MetricKey`) is a key, or a pattern with one field (``routing/{pair}/changed``) expanded over
``over``. Consecutive rows over the same values expand together, value by value
(``routing/old_new/changed``, ``routing/old_new/router_flip``, ..., ``routing/rollout_old/changed``, ...): that is
metrics.jsonl's order. A row is *computed* (its function, in the recording layer, gets the step's tensors and the
trainer's update reports and is called for every step) or *measured* by the trainer and handed over as it is.

**Adding a metric** is one function plus one row: write ``def my_metrics(v: StepView) -> dict`` in
``moestab/recording/step_metrics.py`` (the math, if any, in :mod:`moestab.metrics`), declare its key here with
``function=`` that function, and run ``python scripts/metric_docs.py``. Every step then computes and writes it,
and the docs list it.

This module is data (it imports no torch): every layer can import it.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from moestab.metrics.collapse_warning import SIGNALS
from moestab.metrics.ratios import RATIO_QUANTILES
from moestab.metrics.routing_share import ROUTING_SHARE_STATS
from moestab.run_folder import schema

# ---- types and shapes ---------------------------------------------------------------------------------------
FLOAT = "float"
INT = "int"
PER_LAYER = "list[layers] of float"
"""One value per MoE layer of the model (``moe_layers``, whatever the token tables record)."""
PER_MINIBATCH = "list[minibatches] of float, or null"
PER_LAYER_EXPERT = "list[layers][experts] of float"

# ---- when a key is written (a row's ``when``: every condition must hold; none = every step of every trainer) --
PHASE_TIMES = "phase times"
REWARDS = "rewards"
UPDATES = "updates"
TOKEN_ENTROPY = "token entropy"
ROUTER_STATS = "router stats"
OVERLONG = "overlong"
DYNAMIC_SAMPLING = "dynamic sampling"
HISTORY = "history"
RSPO = "rspo"
ROUTER_AUX = "router aux"
EVAL = "eval"
ROUTING_SHARE = "routing share"
DIAGNOSTICS = "diagnostics"
REPLAYED = "replayed"
BUDGET = "budget"
BASE_ROUTES = "base routes"
COLLAPSE_WATCH = "collapse watch"
CONDITIONS: dict[str, str] = {
    PHASE_TIMES: "the trainer times its rollout and its updates apart (`moestab train`)",
    REWARDS: "the trainer knows each sequence's reward and correctness (`moestab train`; TRL's micro-batches hold "
             "only the advantages)",
    UPDATES: "the trainer reports its minibatch updates (`moestab train`; TRL logs its own loss and grad norm)",
    TOKEN_ENTROPY: "the trainer recorded pi_old's token entropy (both trainers)",
    ROUTER_STATS: "pi_old's free routes were recorded with router statistics (both trainers)",
    OVERLONG: "DAPO's overlong shaping, `--overlong-cache` (on in the `dapo` preset)",
    DYNAMIC_SAMPLING: "DAPO's dynamic sampling, `--dynamic-sampling` (on in the `dapo` preset)",
    HISTORY: "SRPO's history resampling, `--history-resampling`",
    RSPO: "the `rspo` objective",
    ROUTER_AUX: "`--router-aux-loss-coef > 0`",
    EVAL: "an eval step (`--eval-every`, and the last step)",
    ROUTING_SHARE: "`--routing-share` (`moestab train`: one more no-grad forward per minibatch; the TRL "
                   "integration: `RecordSettings(routing_share=True)`, one per micro-batch; off by default in both)",
    BUDGET: "a measurement budget below every sequence of every step (`moestab train --measure-fraction` < 1 or "
            "`--measure-every` > 1; the TRL integration: `RecordSettings(budget=...)`); the sampled keys are absent "
            "on an unmeasured step",
    REPLAYED: "the updates replay routes (`--routing-replay old`, `rollout`, `rollout-gates` or `base`)",
    BASE_ROUTES: "`--measure-base-routes` (`moestab train`: one more no-grad forward of the warm-started base per "
                 "step)",
    COLLAPSE_WATCH: "the trainer watches for a collapse (`moestab train`, the TRL integration and `DiagnosticsRun`, "
                    "always; `--on-collapse-warning` says what a warning does) and the rule's signals have their "
                    "baseline (docs/collapse.md)",
    DIAGNOSTICS: "the step was written by the diagnostics call for any trainer (`moestab.recording.diagnostics`, "
                 "docs/integrations.md): another framework's rollout and trainer routes, no `moestab train` step",
}
"""Every condition a row may name, with what turns it on."""
MOESTAB_TRAIN = frozenset({PHASE_TIMES, REWARDS, UPDATES, TOKEN_ENTROPY, ROUTER_STATS})
"""The conditions every ``moestab train`` step meets (add the run's settings: :data:`OVERLONG`, :data:`EVAL`, ...)."""
TRL = frozenset({TOKEN_ENTROPY, ROUTER_STATS})
"""The conditions every step of the TRL integration (``moestab.integrations.trl``) meets."""
FOREIGN = frozenset({DIAGNOSTICS})
"""The conditions a step of the diagnostics call (:mod:`moestab.recording.diagnostics`) meets; it writes the keys of
the quantities it was given (routes always; log-probs, expert counts, routing confidence when passed)."""

# ---- docs/metrics.md sections, in order: (title, text under the title) ------------------------------------------
SECTIONS: dict[str, tuple[str, str]] = {
    "progress": ("Run progress", ""),
    "ratios": (
        "Ratios and clipping (`moestab.metrics.ratios`)",
        "Over all response tokens of the step. `log w = logp_update - logp_old` per token (the ratio that entered the "
        "loss); `log s = mean_t log w` per sequence (GSPO Eq. 7). The loss functions also return ratio and clip "
        "statistics per minibatch (docs/objectives.md); they are not logged, because a mean of per-minibatch maxima "
        "is not the step's maximum and the first minibatch dilutes a clip share. The step-level versions are these.",
    ),
    "routing": (
        "Routing change (`moestab.metrics.routes`)",
        "Over the step's response tokens and every MoE layer, for the route pairs `old_new`, `rollout_old` and "
        "`rollout_old_free` (table above).",
    ),
    "mismatch": (
        "Rollout -> trainer log-prob mismatch (`moestab.metrics.mismatch`)",
        "With `d = log pi_trainer - log mu_rollout` on the response tokens (REFERENCES \"Train-inference mismatch\"), "
        "for the log-prob pairs `rollout_old` (trainer = pi_old as used in the ratio) and `rollout_old_free` "
        "(trainer = free pi_old).",
    ),
    "routing_share": (
        "Routing's share of the ratio (`moestab.metrics.routing_share`)",
        "With `--routing-share`, each minibatch is scored twice on the weights of its update (before its optimizer "
        "step): with free routing and with the routes that produced `logp_old` replayed, giving per token "
        "`log w_free = logp_update(free) - logp_old` and `log w_replayed = logp_update(replayed) - logp_old`. Under "
        "`off` the update forward is the free one and the extra forward replays pi_old's trainer routes (R2's); under "
        "R2 the update forward is the replayed one and the extra forward routes freely; under R3 / TRR `logp_old` "
        "was computed with the rollout engine's routes (TRR: and gates), the update forward replays them and the "
        "extra forward routes freely, so the free side also carries the rollout -> trainer routing difference that "
        "R3 removes. Variances are population ones over the response tokens, as `ratio/token_log_var`; the clip "
        "fractions are the objective's own clip rule (`clip/token_frac`'s definition) evaluated on each log-ratio, "
        "every other loss input as in the update. On the replayed side under R2 / R3 / TRR (the free side under "
        "`off`) the numbers are `ratio/token_log_var` and `clip/token_frac` themselves. The TRL integration "
        "(`RecordSettings(routing_share=True)`) measures the same per micro-batch: TRL's loss forward routes freely "
        "and the extra forward replays the routes of TRL's pi_old forward, as under `off`.",
    ),
    "experts": ("Experts (`moestab.metrics.experts`)", ""),
    "collapse": (
        "Collapse warning (`moestab.metrics.collapse_warning`)",
        "The warning rule's reading of the run's own signals so far: each signal's z-score against the run's first "
        "steps, weighted into one score; a warning fires when the score passes the rule's threshold, at most once "
        "every 10 steps (docs/collapse.md: the rule, its signals and its measured recall and false alarms).",
    ),
    "integrity": (
        "Route integrity (`moestab.metrics.integrity`)",
        "Whether the captured routes tell the truth: `moestab train`'s rollout engine's (HF or vLLM), the TRL "
        "integration's generation, or the rollout side a `route_diagnostics` call is given (any importer's), checked "
        "per MoE layer over the step's response tokens, against the trainer's own free routes of the same tokens "
        "(pi_old, "
        "the `rollout_old_free` pair) where they are known. A layer fails at coverage < 0.99, invalid > 0, constant, "
        "or lift < 0.5 (`moestab.metrics.integrity.Thresholds`); `--route-integrity refuse` (the TRL integration's "
        "`RecordSettings(route_integrity=...)`, `DiagnosticsRun(route_integrity=...)`) stops at a failing step, "
        "before its routes are replayed. Under `--routing-replay base` the captured routes are the frozen base's by "
        "design, so the agreement check is left out there.",
    ),
    "measure": (
        "Measurement budget (`moestab.recording.measure_budget`, `moestab.metrics.sampling`)",
        "The forwards that exist only to measure (pi_new; the free pi_old under R3 / TRR; routing's share's "
        "counterfactual) run on a seeded sample of whole groups and/or every N-th step. The keys they feed "
        "(`routing/old_new/*`, and under R3 / TRR `routing/rollout_old_free/*`, `mismatch/rollout_old_free/*`, "
        "`entropy/token_mean`, `experts/*`; `routing_share/*`) are then computed on the sampled tokens; the sampling "
        "error of the change rates is the cluster-sampling standard error over groups with the finite-population "
        "correction (Cochran eq. 6.13): 0 when every group was measured, null with one group. `moestab train`'s "
        "default budget measures every sequence of one step in 4 (steps 1, 5, 9, ...): the measured steps carry "
        "exact values and no `_se` key, the other steps none of these keys (docs/benchmarks.md, \"Measurement "
        "budget\", says how the default was chosen).",
    ),
}

ROUTE_METRIC_PAIRS = ("old_new", *schema.LOGP_PAIRS)
"""Route pairs (:data:`moestab.run_folder.schema.ROUTE_PAIRS`) whose change every step logs."""
QUANTILES = tuple(f"{q:g}" for q in RATIO_QUANTILES)
"""The ratio quantiles every step logs, as written in the keys (``ratio/token_q0.99``)."""


@dataclass(frozen=True)
class MetricKey:
    """One row of the table: a metrics.jsonl key, or a pattern of keys."""

    pattern: str
    """The key, or a pattern with one field (``routing/{pair}/changed``) filled from :attr:`over`."""
    kind: str
    """Type and shape of the value (:data:`FLOAT`, :data:`PER_LAYER`, ...); NaN is written as ``null``."""
    definition: str
    """One line: what the number is."""
    section: str
    """Its section of docs/metrics.md (:data:`SECTIONS`)."""
    when: tuple[str, ...] = ()
    """Conditions (:data:`CONDITIONS`) under which a step writes it; none: every step of every trainer."""
    over: tuple[str, ...] = ()
    """The values of the pattern's field."""
    computed: bool = True
    """True: the recording layer computes it from the step's tensors and update reports (its function, marked
    :func:`computes`, is called for every step); False: the trainer measures it and hands it over (the function that
    does is marked :func:`computes` too)."""

    @property
    def field(self) -> str | None:
        """The pattern's field name (``pair``), or None for a plain key."""
        names = [name for _, name, _, _ in string.Formatter().parse(self.pattern) if name is not None]
        return names[0] if names else None

    def key(self, value: str | None = None) -> str:
        """The key of ``value`` of the pattern's field (the plain key when it has none)."""
        return self.pattern if self.field is None else self.pattern.format_map({self.field: value})

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key of the row."""
        return (self.pattern,) if self.field is None else tuple(self.key(v) for v in self.over)


TABLE: list[MetricKey] = []
"""Every row, in metrics.jsonl's order."""

F = TypeVar("F", bound=Callable)


def computes(*patterns: str) -> Callable[[F], F]:
    """Mark the function that computes the rows ``patterns`` (the recording layer's step metrics) or measures them
    (a trainer's): the key points at its code through the code's own import of the key, which a reader and a static
    tool can follow; ``owner_of`` reads the mark back."""

    def mark(function: F) -> F:
        function.metric_keys = patterns  # type: ignore[attr-defined]
        return function

    return mark


def owned_keys(function: Callable) -> tuple[str, ...]:
    """The row patterns ``function`` is marked to compute (:func:`computes`; none when unmarked)."""
    return getattr(function, "metric_keys", ())


def owner_name(function: Callable) -> str:
    """``module.qualname`` of a function (what docs/metrics.md names)."""
    return f"{function.__module__}.{function.__qualname__}"


def _row(pattern: str, kind: str, definition: str, section: str = "progress", *,
         when: tuple[str, ...] = (), over: tuple[str, ...] = (), computed: bool = True) -> str:
    """Declare a row; returns its pattern (the key of a plain row), for the module's constants."""
    row = MetricKey(pattern, kind, definition, section, when, over, computed)
    if (row.field is None) != (not over):
        raise ValueError(f"{pattern}: a pattern needs the values of its field, and only a pattern takes them")
    TABLE.append(row)
    return pattern



# ---- the table, in metrics.jsonl's order --------------------------------------------------------------------------
STEP = _row("step", INT, "1-based step", computed=False)
TIME_STEP = _row("time/step_s", FLOAT, "wall time of the step (s), metrics excluded "
                 "(TRL: of the generation batch and its optimizer steps)", computed=False)
TIME_ROLLOUT = _row("time/rollout_s", FLOAT, "wall time of the rollout and its scoring (s)",
                    when=(PHASE_TIMES,), computed=False)
TIME_UPDATE = _row("time/update_s", FLOAT, "wall time of the minibatch updates (s)",
                   when=(PHASE_TIMES,), computed=False)
REWARD_MEAN = _row("reward/mean", FLOAT, "mean sequence reward over the rollout batch "
                   "(after any shaping: what the advantages use)", when=(REWARDS,))
REWARD_STD = _row("reward/std", FLOAT, "standard deviation (n - 1) of the sequence "
                  "reward over the rollout batch; 0 for one sequence", when=(REWARDS,))
ACCURACY = _row("accuracy", FLOAT, "share of rollout responses the task scores "
                "correct", when=(REWARDS,))
RESPONSE_LENGTH_MEAN = _row("response/length_mean", FLOAT,
                            "mean response length in tokens (EOS included)")
RESPONSE_LENGTH_MAX = _row("response/length_max", INT,
                           "longest response in tokens (EOS included)")
ADVANTAGE_NONZERO = _row("advantage/nonzero_frac", FLOAT,
                         "share of the step's sequences with a nonzero advantage (0: every group's rewards were equal; "
                         "`--max-zero-advantage-steps` such steps in a row stop the run)")
ENTROPY = _row("entropy", FLOAT, "mean token entropy of pi_old (free routing) over "
               "response tokens, nats", when=(TOKEN_ENTROPY,))
REWARD_TASK_MEAN = _row("reward/task_mean", FLOAT, "mean task reward before overlong shaping",
                        when=(OVERLONG,), computed=False)
REWARD_OVERLONG_PENALTY = _row("reward/overlong_penalty_mean", FLOAT,
                               "mean overlong penalty (`moestab.rl.shaping`)", when=(OVERLONG,), computed=False)
REWARD_OVERLONG_FRAC = _row("reward/overlong_frac", FLOAT, "share of responses penalised as "
                            "overlong", when=(OVERLONG,), computed=False)
SAMPLING_DRAWN = _row("sampling/groups_drawn", INT, "prompt groups sampled, every process's "
                      "(with `--nproc N` each samples its share of every round; the decisions are the whole step's)",
                      when=(DYNAMIC_SAMPLING,), computed=False)
SAMPLING_DROPPED = _row("sampling/groups_dropped", INT, "groups dropped because their rewards "
                        "were all equal", when=(DYNAMIC_SAMPLING,), computed=False)
SAMPLING_EXTRA = _row("sampling/extra_rollouts", INT, "extra rollouts drawn (at most "
                      "`--dynamic-sampling-rounds`)", when=(DYNAMIC_SAMPLING,), computed=False)
SAMPLING_FILLED = _row("sampling/groups_filled", INT, "dropped groups kept to fill the batch "
                       "when the budget ran out", when=(DYNAMIC_SAMPLING,), computed=False)
MINIBATCHES = _row("minibatches", INT, "minibatch updates that ran (= `--minibatches`, which "
                   "must divide the batch; TRL: optimizer steps per generation batch)", computed=False)
LOSS = _row("loss", FLOAT, "the loss the updates minimised (policy loss, any KL "
            "penalty and coef x router aux loss), mean over the minibatches", when=(UPDATES,))
GRAD_NORM = _row("grad_norm", FLOAT, "gradient norm before clipping, mean over the "
                 "minibatches", when=(UPDATES,))
GRAD_NORM_MAX = _row("grad_norm_max", FLOAT, "gradient norm before clipping, max over "
                     "the minibatches", when=(UPDATES,))
LOSS_KL_OLD_NEW_K1 = _row("loss/kl/old_new_k1", FLOAT, "k1 estimate of KL(pi_old || pi) "
                          "at each update (docs/objectives.md), mean over minibatches", when=(UPDATES,))
LOSS_KL_OLD_NEW_K3 = _row("loss/kl/old_new_k3", FLOAT, "k3 estimate of KL(pi_old || pi) "
                          "at each update, mean over minibatches", when=(UPDATES,))
LOSS_KL_REF_K3 = _row("loss/kl/ref_k3", FLOAT, "k3 estimate of KL(pi || pi_ref), mean "
                      "over minibatches; null without a reference model (`--kl-coef 0`)", when=(UPDATES,))
LOSS_POLICY = _row("loss/objective/policy_loss", FLOAT, "the objective's policy term "
                   "(docs/objectives.md), mean over minibatches", when=(UPDATES,))
LOSS_KL_PENALTY = _row("loss/objective/kl_penalty", FLOAT, "the KL penalty term "
                       "(`--kl-coef` x k3 to the reference), mean over minibatches", when=(UPDATES,))
LOSS_RSPO_GAMMA_MEAN = _row("loss/rspo/gamma_mean", FLOAT, "RSPO's router-shift weight "
                            "gamma, mean over response tokens, then over minibatches", when=(UPDATES, RSPO))
LOSS_RSPO_GAMMA_MIN = _row("loss/rspo/gamma_min", FLOAT, "smallest gamma over response "
                           "tokens, mean over minibatches", when=(UPDATES, RSPO))
LOSS_RSPO_FLOOR = _row("loss/rspo/floor_frac", FLOAT, "share of response tokens whose "
                       "gamma was raised to its floor `gamma_min`, mean over minibatches", when=(UPDATES, RSPO))
LOSS_ROUTER_AUX = _row("loss/objective/router_aux_loss", FLOAT, "the model's own "
                       "load-balancing loss (transformers' `output_router_logits`), mean over minibatches; `loss` "
                       "includes coef x this", when=(UPDATES, ROUTER_AUX))
ROUTING_CHANGED = _row("routing/{pair}/changed", FLOAT, "slot-level changed fraction "
                       "`1 - sum |E_a ∩ E_b| / (k * decisions)` (GSPO §5.3)", "routing", over=ROUTE_METRIC_PAIRS)
ROUTING_ROUTER_FLIP = _row("routing/{pair}/router_flip", FLOAT, "share of (token, "
                           "layer) routers whose expert set differs (R3's \"routers\")", "routing",
                           over=ROUTE_METRIC_PAIRS)
ROUTING_TOKEN_FLIP = _row("routing/{pair}/token_flip", FLOAT, "share of tokens with "
                          ">= 1 flipped layer (R3's \"tokens\")", "routing", over=ROUTE_METRIC_PAIRS)
ROUTING_CHANGED_BY_LAYER = _row("routing/{pair}/changed_by_layer", PER_LAYER,
                                "`changed` per MoE layer", "routing", over=ROUTE_METRIC_PAIRS)
ROUTING_ROUTER_FLIP_BY_LAYER = _row("routing/{pair}/router_flip_by_layer", PER_LAYER, "`router_flip` per MoE "
                                    "layer", "routing", when=(DIAGNOSTICS,), over=tuple(schema.LOGP_PAIRS),
                                    computed=False)
ROUTING_CHANGED_SE = _row("routing/{pair}/changed_se", FLOAT, "sampling error "
                          "(standard error over the sampled groups) of `routing/{pair}/changed`", "measure",
                          when=(BUDGET,), over=("old_new", "rollout_old_free"))
ROUTING_ROUTER_FLIP_SE = _row("routing/{pair}/router_flip_se", FLOAT, "sampling "
                              "error of `routing/{pair}/router_flip`", "measure", when=(BUDGET,),
                              over=("old_new", "rollout_old_free"))
MEASURE_FRACTION = _row("measure/fraction", FLOAT, "share of the step's sequences "
                        "the measure-only forwards scored (0: an unmeasured step)", "measure", when=(BUDGET,))
ROUTING_UPDATE_DRIFT = _row("routing/update_old/changed_by_minibatch", PER_MINIBATCH,
                            "`changed` between the update forward's free routes and pi_old's, per minibatch index "
                            "(null for an empty one); null under R2/R3/TRR (the update forward does not choose its "
                            "routes)", "routing")
ROUTING_REPLACE_RATE = _row("routing/replay_replace_rate", FLOAT, "share of the "
                            "replayed expert slots the updates did not use: `changed` between the update forwards' "
                            "routes and the routes they replayed (those of `logp_old`); 0 for plain replay, the share "
                            "refilled under `--replay-score-ratio` (prime-rl's `router_replay_replace_rate`)",
                            "routing", when=(REPLAYED,))
MISMATCH_K1 = _row("mismatch/{pair}/k1", FLOAT, "`mean(-d)`, nats per token",
                   "mismatch", over=tuple(schema.LOGP_PAIRS))
MISMATCH_K3 = _row("mismatch/{pair}/k3", FLOAT, "`mean(exp(d) - 1 - d)` (>= 0 per "
                   "token), nats per token", "mismatch", over=tuple(schema.LOGP_PAIRS))
MISMATCH_F2 = _row("mismatch/{pair}/f2", FLOAT, "F(2) = `mean(|d| > ln 2)`: share "
                   "of tokens whose probability ratio is outside [1/2, 2]", "mismatch", over=tuple(schema.LOGP_PAIRS))
MISMATCH_ABS_D = _row("mismatch/{pair}/abs_d", FLOAT, "`mean(|d|)`, nats per token", "mismatch",
                      when=(DIAGNOSTICS,), over=tuple(schema.LOGP_PAIRS), computed=False)
MISMATCH_SQ_D = _row("mismatch/{pair}/sq_d", FLOAT, "`mean(d^2)`, nats^2 per token", "mismatch",
                     when=(DIAGNOSTICS,), over=tuple(schema.LOGP_PAIRS), computed=False)
MISMATCH_F5 = _row("mismatch/{pair}/f5", FLOAT, "F(5) = `mean(|d| > ln 5)`: share of tokens whose probability "
                   "ratio is outside [1/5, 5]", "mismatch", when=(DIAGNOSTICS,), over=tuple(schema.LOGP_PAIRS),
                   computed=False)
MISMATCH_PROB_DIFF_MEAN = _row("mismatch/{pair}/prob_diff_mean", FLOAT, "mean of `|exp(log pi_trainer) - "
                               "exp(log mu_rollout)|` over tokens", "mismatch", when=(DIAGNOSTICS,),
                               over=tuple(schema.LOGP_PAIRS), computed=False)
MISMATCH_PROB_DIFF_MAX = _row("mismatch/{pair}/prob_diff_max", FLOAT, "max of the token probability "
                              "difference", "mismatch", when=(DIAGNOSTICS,), over=tuple(schema.LOGP_PAIRS),
                              computed=False)
MISMATCH_PROB_DIFF_STD = _row("mismatch/{pair}/prob_diff_std", FLOAT, "standard deviation (n - 1) of the "
                              "token probability difference", "mismatch", when=(DIAGNOSTICS,),
                              over=tuple(schema.LOGP_PAIRS), computed=False)
RATIO_TOKEN_MIN = _row("ratio/token_min", FLOAT, "min of `w` over the step's tokens",
                       "ratios")
RATIO_TOKEN_MAX = _row("ratio/token_max", FLOAT, "max of `w` over the step's tokens",
                       "ratios")
RATIO_TOKEN_Q = _row("ratio/token_q{q}", FLOAT, "quantile `q` of `w` over the step's "
                     "tokens", "ratios", over=QUANTILES)
RATIO_TOKEN_LOG_VAR = _row("ratio/token_log_var", FLOAT, "population variance of "
                           "`log w` over the step's tokens", "ratios")
RATIO_SEQ_MIN = _row("ratio/seq_min", FLOAT, "min of `s` over the step's sequences",
                     "ratios")
RATIO_SEQ_MAX = _row("ratio/seq_max", FLOAT, "max of `s` over the step's sequences",
                     "ratios")
RATIO_SEQ_Q = _row("ratio/seq_q{q}", FLOAT, "quantile `q` of `s` over the step's "
                   "sequences", "ratios", over=QUANTILES)
RATIO_SEQ_LOG_VAR = _row("ratio/seq_log_var", FLOAT, "population variance of `log s` "
                         "over the step's sequences", "ratios")
CLIP_TOKEN_FRAC = _row("clip/token_frac", FLOAT, "token-weighted clipped fraction: tokens "
                       "whose governing ratio was clipped (a clipped sequence clips all its tokens), as GSPO Fig. 2 "
                       "compares them", "ratios")
CLIP_SEQ_FRAC = _row("clip/seq_frac", FLOAT, "share of sequences with a clipped token",
                     "ratios")
CLIP_TOKEN_FRAC_LATER = _row("clip/token_frac_later", FLOAT, "`clip/token_frac` over "
                             "minibatches 2..n only (the first updates from theta = theta_old: its ratio is 1 and "
                             "never clips); null with one minibatch", "ratios")
CLIP_SEQ_FRAC_LATER = _row("clip/seq_frac_later", FLOAT, "`clip/seq_frac` over "
                           "minibatches 2..n only; null with one minibatch", "ratios")
ROUTING_SHARE_VAR = _row("routing_share/var_share", FLOAT, "`1 - "
                         "Var(log w_replayed) / Var(log w_free)` over the step's tokens: the share of the log-ratio's "
                         "variance that routing change causes (0 when both variances are 0; negative when replay "
                         "raised it; null when only Var(log w_free) is 0)", "routing_share", when=(ROUTING_SHARE,))
ROUTING_SHARE_LOG_VAR_FREE = _row("routing_share/log_var_free", FLOAT,
                                  "population variance of `log w_free` over the step's tokens", "routing_share",
                                  when=(ROUTING_SHARE,))
ROUTING_SHARE_LOG_VAR_REPLAYED = _row("routing_share/log_var_replayed", FLOAT,
                                      "population variance of `log w_replayed` over the step's tokens",
                                      "routing_share", when=(ROUTING_SHARE,))
ROUTING_SHARE_CLIP_FREE = _row("routing_share/clip_frac_free", FLOAT,
                               "share of the step's tokens whose governing ratio the objective clips with "
                               "`log w_free`", "routing_share", when=(ROUTING_SHARE,))
ROUTING_SHARE_CLIP_REPLAYED = _row("routing_share/clip_frac_replayed", FLOAT,
                                   "share of the step's tokens whose governing ratio the objective clips with "
                                   "`log w_replayed`", "routing_share", when=(ROUTING_SHARE,))
ROUTING_SHARE_ABS_FREE = _row("routing_share/abs_log_w_free", FLOAT,
                              "mean `|log w_free|` over the step's tokens", "routing_share", when=(ROUTING_SHARE,))
ROUTING_SHARE_ABS_REPLAYED = _row("routing_share/abs_log_w_replayed", FLOAT,
                                  "mean `|log w_replayed|` over the step's tokens", "routing_share",
                                  when=(ROUTING_SHARE,))
ROUTING_SHARE_BY_MINIBATCH = _row("routing_share/by_minibatch/{stat}", PER_MINIBATCH,
                                  "`routing_share/{stat}` over each minibatch's tokens, per minibatch index (null for "
                                  "an empty one)", "routing_share",
                                  when=(ROUTING_SHARE,), over=ROUTING_SHARE_STATS)
INTEGRITY_COVERAGE = _row("routes/integrity/coverage", FLOAT, "share of (response token, MoE layer) "
                          "decisions the capture holds a route for (every slot recorded)", "integrity")
INTEGRITY_COVERAGE_BY_LAYER = _row("routes/integrity/coverage_by_layer", PER_LAYER, "`coverage` per "
                                   "MoE layer", "integrity")
INTEGRITY_INVALID_BY_LAYER = _row("routes/integrity/invalid_by_layer", PER_LAYER, "share of a layer's "
                                  "recorded decisions naming an expert outside the model or one expert twice",
                                  "integrity")
INTEGRITY_CONSTANT_BY_LAYER = _row("routes/integrity/constant_by_layer", PER_LAYER, "1 when every "
                                   "recorded decision of the layer names the same experts (16 or more of them): a "
                                   "zeroed or filled layer; else 0", "integrity")
INTEGRITY_WRAPPED = _row("routes/integrity/wrapped", INT, "1 when the model has more than 256 experts and "
                         "no captured id reaches 256 in 256 or more slots (ids stored as uint8 wrapped around), else 0",
                         "integrity")
INTEGRITY_AGREEMENT_BY_LAYER = _row("routes/integrity/agreement_by_layer", PER_LAYER, "mean share of "
                                    "a captured decision's slots whose expert the trainer's own routing also chose "
                                    "for the same token (`1 - changed`); absent without the trainer's routes",
                                    "integrity")
INTEGRITY_CHANCE = _row("routes/integrity/chance", FLOAT, "the agreement of a capture unrelated to the "
                        "trainer's routing: `top_k / num_experts`", "integrity")
INTEGRITY_LIFT = _row("routes/integrity/lift", FLOAT, "the worst layer's agreement rescaled from chance "
                      "(0) to full (1): `(agreement - chance) / (1 - chance)`", "integrity")
INTEGRITY_DISAGREEING = _row("routes/integrity/disagreeing", FLOAT, "share of the tokens whose "
                             "agreement over their layers, rescaled from chance, is below 0.5: a fault confined to "
                             "some tokens (one turn misaligned) that the layers' means dilute", "integrity")
INTEGRITY_FAILED = _row("routes/integrity/failed", INT, "number of (layer, check) pairs past their "
                        "threshold this step (0: the capture looks right)", "integrity")
INTEGRITY_LAYER_DETAIL = frozenset({INTEGRITY_COVERAGE_BY_LAYER, INTEGRITY_INVALID_BY_LAYER,
                                    INTEGRITY_CONSTANT_BY_LAYER, INTEGRITY_AGREEMENT_BY_LAYER})
"""The integrity keys' per-layer lists: in metrics.jsonl, not sent to trackers (their scalars summarise them)."""
EXPERTS_LOAD = _row("experts/load", PER_LAYER_EXPERT, "share of each layer's routed "
                    "slots per expert under pi_old (free), rounded to 6 decimals", "experts")
EXPERTS_LOAD_ENTROPY = _row("experts/load_entropy", PER_LAYER, "entropy of the load "
                            "distribution, nats (`ln E` when uniform)", "experts")
EXPERTS_ROUTER_ENTROPY = _row("experts/router_entropy", PER_LAYER, "mean entropy "
                              "(nats) of softmax(router logits) over response tokens under pi_old (free)", "experts",
                              when=(ROUTER_STATS,))
EXPERTS_CONFIDENCE = _row("experts/routing_confidence", PER_LAYER, "mean routing "
                          "confidence, the mass softmax(router logits) puts on the chosen experts (prime-rl, after the "
                          "StepFun 3.5 Flash report), over response tokens under pi_old (free)", "experts",
                          when=(ROUTER_STATS,))
EXPERTS_CONFIDENCE_MEAN = _row("experts/routing_confidence_mean", FLOAT,
                               "`experts/routing_confidence` over every layer", "experts", when=(ROUTER_STATS,))
EXPERTS_MAX_VIO = _row("experts/max_vio", PER_LAYER, "load violation `(max_e N_e - mean_e N_e) / mean_e N_e` "
                       "of the trainer's routes per layer (prime-rl's `max_vio` without its padding filter)", "experts",
                       when=(DIAGNOSTICS,), computed=False)
HISTORY_SKIPPED = _row("sampling/history_skipped", FLOAT,
                       "drawn prompts skipped because their last group was all correct", when=(HISTORY,),
                       computed=False)
HISTORY_KEPT_SOLVED = _row("sampling/history_kept_solved", FLOAT,
                           "solved prompts kept because replacement draws ran dry", when=(HISTORY,), computed=False)
EVAL_ACCURACY = _row("eval/accuracy", FLOAT, "greedy accuracy on the "
                     "fixed eval set", when=(EVAL,), computed=False)
ROUTING_BASE_CHANGED = _row("routing/base_rollout/changed", FLOAT,
                            "slot-level changed fraction between the rollout's routes and those the warm-started base "
                            "chooses for the same tokens (free routing, the trainer's dtype): how far routing has "
                            "moved from the base; at step 1, where the policy is the base, the rollout -> trainer gap "
                            "alone", "routing", when=(BASE_ROUTES,), computed=False)
ROUTING_BASE_CHANGED_BY_LAYER = _row("routing/base_rollout/changed_by_layer", PER_LAYER,
                                     "`routing/base_rollout/changed` per MoE layer", "routing", when=(BASE_ROUTES,),
                                     computed=False)
COLLAPSE_SCORE = _row("collapse/score", FLOAT, "the collapse warning rule's score at this step (a z-score for a "
                      "one-signal rule, log-odds for a model)", "collapse", when=(COLLAPSE_WATCH,), computed=False)
COLLAPSE_WARNING = _row("collapse/warning", INT, "1 at a step where a collapse warning fires, else 0", "collapse",
                        when=(COLLAPSE_WATCH,), computed=False)
COLLAPSE_WARNING_ON = _row("collapse/warning_on/{signal}", INT, "1 at a warning, for the signal that moved its score "
                           "most; absent at other steps", "collapse", when=(COLLAPSE_WATCH,), over=tuple(SIGNALS),
                           computed=False)

# ---- what the metric functions return, by the names of moestab.metrics -> the key (pattern) ----------------------
ROUTE_CHANGE_KEYS = {"changed": ROUTING_CHANGED, "router_flip": ROUTING_ROUTER_FLIP, "token_flip": ROUTING_TOKEN_FLIP,
                     "changed_by_layer": ROUTING_CHANGED_BY_LAYER}
"""Statistics of :func:`moestab.metrics.routes.route_change` -> their key patterns (field ``pair``)."""
ROUTE_CHANGE_SE_KEYS = {"changed": ROUTING_CHANGED_SE, "router_flip": ROUTING_ROUTER_FLIP_SE}
"""Change rates whose sampling error a sampled pair logs -> their key patterns (field ``pair``)."""
MISMATCH_KEYS = {"k1": MISMATCH_K1, "k3": MISMATCH_K3, "f2": MISMATCH_F2}
"""Statistics of :func:`moestab.metrics.mismatch.mismatch_stats` -> their key patterns (field ``pair``)."""
SPREAD_KEYS = {"abs_d": MISMATCH_ABS_D, "sq_d": MISMATCH_SQ_D, "f5": MISMATCH_F5,
               "prob_diff_mean": MISMATCH_PROB_DIFF_MEAN, "prob_diff_max": MISMATCH_PROB_DIFF_MAX,
               "prob_diff_std": MISMATCH_PROB_DIFF_STD}
"""Statistics of :func:`moestab.metrics.mismatch.mismatch_spread` -> their key patterns (field ``pair``)."""
CLIP_KEYS = {"token_frac": CLIP_TOKEN_FRAC, "seq_frac": CLIP_SEQ_FRAC, "token_frac_later": CLIP_TOKEN_FRAC_LATER,
             "seq_frac_later": CLIP_SEQ_FRAC_LATER}
"""Statistics of :func:`moestab.metrics.ratios.clip_fractions` -> their keys."""
ROUTING_SHARE_KEYS = {"var_share": ROUTING_SHARE_VAR, "log_var_free": ROUTING_SHARE_LOG_VAR_FREE,
                      "log_var_replayed": ROUTING_SHARE_LOG_VAR_REPLAYED, "clip_frac_free": ROUTING_SHARE_CLIP_FREE,
                      "clip_frac_replayed": ROUTING_SHARE_CLIP_REPLAYED, "abs_log_w_free": ROUTING_SHARE_ABS_FREE,
                      "abs_log_w_replayed": ROUTING_SHARE_ABS_REPLAYED}
"""Statistics of :func:`moestab.metrics.routing_share.routing_share` -> their step keys (per minibatch:
:data:`ROUTING_SHARE_BY_MINIBATCH` with field ``stat``)."""


@dataclass(frozen=True)
class Alias:
    """Another RL framework's name for a moestab key: the same number under the name its users log."""

    name: str
    """The framework's metric name."""
    framework: str
    """Who logs it (and where it is defined)."""
    pattern: str
    """The moestab key (pattern, field ``pair`` for the log-prob pairs)."""
    note: str = ""
    """How the two differ, if at all."""


ALIASES: tuple[Alias, ...] = (
    Alias("rollout_train_k3_kl", "AReaL (PR #1496)", MISMATCH_K3),
    Alias("logp_abs_diff", "AReaL (PR #1496)", MISMATCH_ABS_D),
    Alias("logp_sq_diff", "AReaL (PR #1496)", MISMATCH_SQ_D),
    Alias("extreme_frac_tau2", "AReaL (PR #1496)", MISMATCH_F2),
    Alias("extreme_frac_tau5", "AReaL (PR #1496)", MISMATCH_F5, "`|d| > ln 5`, by analogy with tau2"),
    Alias("training/rollout_probs_diff_mean", "verl (`verl.utils.debug.metrics`)", MISMATCH_PROB_DIFF_MEAN),
    Alias("training/rollout_probs_diff_max", "verl (`verl.utils.debug.metrics`)", MISMATCH_PROB_DIFF_MAX),
    Alias("training/rollout_probs_diff_std", "verl (`verl.utils.debug.metrics`)", MISMATCH_PROB_DIFF_STD),
    Alias("max_vio", "prime-rl (`get_load_balance_stats`)", EXPERTS_MAX_VIO, "per layer; prime-rl drops the top_k "
          "most loaded experts first by default (its padding tokens), moestab counts no padding"),
    Alias("routing_confidence", "prime-rl (`get_load_balance_stats`)", EXPERTS_CONFIDENCE,
          "per layer, the trainer's router"),
    Alias("router_replay_replace_rate", "prime-rl (PR #2703)", ROUTING_REPLACE_RATE, "prime-rl counts every replayed "
          "position; moestab the positions that score response tokens"),
)
"""Framework names of moestab keys: ``route_diagnostics(..., aliases=True)`` adds them to the dict it returns (never to
metrics.jsonl); docs/metrics.md lists them."""


def _ratio_keys(level: str, minimum: str, maximum: str, quantile: str, log_var: str) -> dict[str, str]:
    quantiles = {f"{level}_q{q}": quantile.format(q=q) for q in QUANTILES}
    return {f"{level}_min": minimum, f"{level}_max": maximum, **quantiles, f"{level}_log_var": log_var}


RATIO_KEYS = {**_ratio_keys("token", RATIO_TOKEN_MIN, RATIO_TOKEN_MAX, RATIO_TOKEN_Q, RATIO_TOKEN_LOG_VAR),
              **_ratio_keys("seq", RATIO_SEQ_MIN, RATIO_SEQ_MAX, RATIO_SEQ_Q, RATIO_SEQ_LOG_VAR)}
"""Statistics of :func:`moestab.metrics.ratios.ratio_stats` -> their keys."""


def _expand(rows: Iterable[MetricKey]) -> dict[str, MetricKey]:
    """Every key of ``rows`` -> its row, in metrics.jsonl's order (consecutive rows over the same values expand
    together, value by value)."""
    rows = list(rows)
    out: dict[str, MetricKey] = {}
    i = 0
    while i < len(rows):
        j = i + 1
        while rows[i].over and j < len(rows) and rows[j].over == rows[i].over:
            j += 1
        block = rows[i:j]
        values = block[0].over or (None,)
        for value in values:
            for row in block:
                out[row.key(value)] = row
        i = j
    return out


KEYS: dict[str, MetricKey] = _expand(TABLE)
"""Every metrics.jsonl key -> its row, in metrics.jsonl's order."""


class UndeclaredKeyError(KeyError):
    """A metrics line holds a key :data:`TABLE` does not declare."""


def in_table_order(values: Mapping[str, object]) -> dict[str, object]:
    """``values`` in metrics.jsonl's order; :class:`UndeclaredKeyError` names any key the table does not declare."""
    unknown = [key for key in values if key not in KEYS]
    if unknown:
        raise UndeclaredKeyError(f"metrics key(s) {unknown} are not declared in moestab/metrics/keys.py; add a row "
                                 "there (and run scripts/metric_docs.py)")
    return {key: values[key] for key in KEYS if key in values}


def written_keys(conditions: Iterable[str]) -> list[str]:
    """The keys a step writes when ``conditions`` (:data:`CONDITIONS`) hold, in metrics.jsonl's order."""
    conditions = set(conditions)
    unknown = sorted(conditions - set(CONDITIONS))
    if unknown:
        raise ValueError(f"unknown condition(s) {unknown}; valid: {sorted(CONDITIONS)}")
    return [key for key, row in KEYS.items() if set(row.when) <= conditions]


def markdown(owners: Mapping[str, str]) -> str:
    """docs/metrics.md's key reference: the conditions, then one table per section of :data:`SECTIONS`; ``owners``:
    each row's pattern -> the function that computes or measures it (``moestab.train.key_owners.key_owners``)."""
    lines = ["Every key a step writes, from the key table `moestab/metrics/keys.py` (this part of the file is "
             "generated from it by `python scripts/metric_docs.py`). NaN is written as `null`. The *when* column "
             "names the conditions under which a step writes the key (*always*: every step of every trainer); "
             "*computed by* is the recording layer's function, or the trainer's that measures the value:", "",
             "| condition | holds when |", "|---|---|"]
    lines += [f"| {name} | {text} |" for name, text in CONDITIONS.items()]
    for section, (title, text) in SECTIONS.items():
        lines += ["", f"### {title}", ""]
        if text:
            lines += [text, ""]
        lines += ["| key | type | when | computed by | meaning |", "|---|---|---|---|---|"]
        for row in TABLE:
            if row.section != section:
                continue
            cells = (", ".join(f"`{key}`" for key in row.keys), row.kind, ", ".join(row.when) or "always",
                     f"`{owners[row.pattern]}`" if row.computed else f"trainer: `{owners[row.pattern]}`",
                     row.definition)
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines += ["", "### Other frameworks' names (aliases)", "",
              "The diagnostics call for any trainer (`moestab.recording.diagnostics.route_diagnostics(..., "
              "aliases=True)`) also returns these names of the same numbers, for a trainer's own logger; metrics.jsonl "
              "holds only moestab's keys (`{pair}` is the call's log-prob pair):", "",
              "| name | framework | moestab key | note |", "|---|---|---|---|"]
    lines += [f"| `{a.name}` | {a.framework} | `{a.pattern}` | {a.note} |" for a in ALIASES]
    return "\n".join(lines) + "\n"


BEGIN_MARKER = "<!-- BEGIN GENERATED: metric keys (moestab/metrics/keys.py; python scripts/metric_docs.py) -->"
END_MARKER = "<!-- END GENERATED: metric keys -->"


def with_reference(doc: str, owners: Mapping[str, str]) -> str:
    """``doc`` (docs/metrics.md's text) with its part between :data:`BEGIN_MARKER` and :data:`END_MARKER` replaced by
    :func:`markdown` of ``owners``; ``ValueError`` when the markers are not there once each, in order."""
    start, end = doc.find(BEGIN_MARKER), doc.find(END_MARKER)
    if doc.count(BEGIN_MARKER) != 1 or doc.count(END_MARKER) != 1 or end < start:
        raise ValueError(f"the key reference must sit between one {BEGIN_MARKER!r} and one {END_MARKER!r}")
    return f"{doc[: start + len(BEGIN_MARKER)]}\n{markdown(owners)}{doc[end:]}"
