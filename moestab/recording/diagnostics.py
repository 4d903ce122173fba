"""Diagnostics for any trainer: a rollout engine's routes against a trainer's, under moestab's metric keys.

A trainer that moestab does not run (verl, Megatron-Core, NeMo, prime-rl, AReaL, slime, ...) hands over, once per step,
the response tokens' routes as its rollout engine chose them and as its own forward chose them (``[tokens, layers,
top_k]``, -1 where not recorded; ``moestab.routes_in`` turns each framework's payload into these), and,
when it has them, the two sides' log-probs of the same tokens. :func:`route_diagnostics` returns the step's metrics
under the keys of :mod:`moestab.metrics.keys` (``routing/<pair>/*``, ``mismatch/<pair>/*``, ``experts/*``), computed
by the same functions as every moestab step, and with ``aliases=True`` the same numbers under the names other
frameworks log (``keys.ALIASES``: AReaL's ``rollout_train_k3_kl``, verl's ``training/rollout_probs_diff_*``,
prime-rl's ``max_vio``, ...). :class:`DiagnosticsRun` appends those steps to a moestab run folder, which ``moestab
analyze`` and the dashboard read like any run (and, with ``report_to``, sends them to experiment trackers).

It is meant to run every step: routes and log-probs of a Qwen3-30B-A3B-sized step (48 layers, top-8, 1M tokens)
take well under a second on one CPU core (bench/bench_diagnostics.py, docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np
import yaml

from moestab import __version__
from moestab.metrics import keys
from moestab.metrics.experts import expert_counts as count_experts
from moestab.metrics.experts import max_violation
from moestab.metrics.integrity import route_integrity, with_model
from moestab.metrics.mismatch import mismatch_spread, mismatch_stats
from moestab.metrics.routes import check_routes, repeated_experts, route_change_of
from moestab.recording.capture_check import check_policy, verdict, warn_once
from moestab.recording.collapse_watch import CollapseMonitor, CollapseStop
from moestab.recording.step_records import write_step_metrics
from moestab.recording.trackers import TrackedRun, check_trackers, open_trackers, run_id
from moestab.run_folder import Remedies, RunFolder, schema
from moestab.run_folder.run_info import ModelInfo
from moestab.run_folder.writer import RunWriter

DIAGNOSTICS_PAIRS = tuple(schema.LOGP_PAIRS)
"""What the trainer's side is (the ``pair`` of the keys): ``rollout_old_free`` (default: the trainer's own free
routing, the gap routing creates; under R3 its native routes, not the replayed ones) or ``rollout_old`` (the routes
and log-probs the trainer's loss actually used: 0 routing change under R3)."""

REMEDIES = Remedies(folder="DiagnosticsRun(path)", overwrite="DiagnosticsRun(..., overwrite=True)", resume=None)
"""How a refused run folder tells the caller to go on."""

logger = logging.getLogger(__name__)


def _array(value: Any, field: str) -> np.ndarray:
    """``value`` (numpy array, torch tensor or sequence) as a numpy array, without a copy where possible."""
    if hasattr(value, "detach"):  # a torch tensor: no torch import here
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{field} must be an array, got {type(value).__name__}") from exc


LOGP_ROUNDING = 1e-4
"""How far above 0 a log-prob may be, from an engine's rounding (a bf16 log-softmax of a near-certain token)."""


def _routes(value: Any, field: str) -> np.ndarray:
    arr = _array(value, field)
    if arr.ndim != 3:
        raise ValueError(f"{field} must be [tokens, layers, top_k], got shape {tuple(arr.shape)}")
    routes = check_routes(arr, field)  # [tokens, layers, top_k] int16
    if routes.size and int(routes.min()) < -1:
        token, layer, slot = (int(i) for i in np.argwhere(routes < -1)[0])
        raise ValueError(f"{field}[{token}, {layer}, {slot}] is {int(routes[token, layer, slot])}; expert ids are 0 "
                         "or more, and -1 marks a decision not recorded")
    repeated = repeated_experts(routes)  # [tokens, layers]
    if repeated.any():
        token, layer = (int(i) for i in np.argwhere(repeated)[0])
        raise ValueError(f"{field}[{token}, {layer}] names an expert twice ({routes[token, layer].tolist()}); a "
                         "top-k decision holds k distinct experts (an engine's zero-filled unrecorded rows: import the "
                         "payload with moestab.routes_in, which marks them -1)")
    return routes


def _log_probs(value: Any, field: str, tokens: int) -> np.ndarray:
    arr = _array(value, field)
    if arr.shape != (tokens,):
        raise ValueError(f"{field} must be [tokens] = [{tokens}] like the routes, got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"{field} must hold float log-probs, got dtype {arr.dtype}")
    bad = ~np.isfinite(arr) | (arr > LOGP_ROUNDING)
    if bad.any():
        token = int(np.argmax(bad))
        raise ValueError(f"{field}[{token}] is {float(arr[token])}; a log-prob is finite and at most 0")
    return arr


def _layer_values(values: np.ndarray) -> list[float]:
    return [float(x) for x in values]


def routing_part(rates: dict[str, np.ndarray], pair: str) -> dict[str, object]:
    """``routing/<pair>/*`` of :func:`moestab.metrics.routes.route_change_of` of two checked route sets (one group:
    every value ``[1]`` or ``[1, layers]``)."""
    return {
        keys.ROUTING_CHANGED.format(pair=pair): float(rates["changed"][0]),
        keys.ROUTING_ROUTER_FLIP.format(pair=pair): float(rates["router_flip"][0]),
        keys.ROUTING_TOKEN_FLIP.format(pair=pair): float(rates["token_flip"][0]),
        keys.ROUTING_CHANGED_BY_LAYER.format(pair=pair): _layer_values(rates["changed_by_layer"][0]),
        keys.ROUTING_ROUTER_FLIP_BY_LAYER.format(pair=pair): _layer_values(rates["router_flip_by_layer"][0]),
    }


def mismatch_part(logp_trainer: np.ndarray, logp_rollout: np.ndarray, pair: str) -> dict[str, float]:
    """``mismatch/<pair>/*``: :func:`~moestab.metrics.mismatch.mismatch_stats` and
    :func:`~moestab.metrics.mismatch.mismatch_spread` of the two sides' log-probs."""
    stats = mismatch_stats(logp_trainer, logp_rollout)
    spread = mismatch_spread(logp_trainer, logp_rollout)
    out = {pattern.format(pair=pair): stats[stat] for stat, pattern in keys.MISMATCH_KEYS.items()}
    out.update({pattern.format(pair=pair): spread[stat] for stat, pattern in keys.SPREAD_KEYS.items()})
    return out


def experts_part(
    trainer: np.ndarray, expert_counts: Any | None, num_experts: int | None, routing_confidence: Any | None,
) -> dict[str, object]:
    """``experts/*`` of the trainer's side: its load violation per layer (from its own ``expert_counts`` ``[layers,
    experts]``, or counted from its routes when only ``num_experts`` is given) and its routing confidence (``[tokens,
    layers]`` per token, or ``[layers]`` already averaged)."""
    out: dict[str, object] = {}
    layers = trainer.shape[1]
    if expert_counts is not None:
        counts = _array(expert_counts, "expert_counts")
        if counts.ndim != 2 or counts.shape[0] != layers:
            raise ValueError(f"expert_counts must be [layers, experts] with {layers} layers, got shape "
                             f"{tuple(counts.shape)}")
        if not np.issubdtype(counts.dtype, np.number) or not np.isfinite(counts).all() or (counts < 0).any():
            bad = np.argwhere(~np.isfinite(counts) | (counts < 0))[0] if np.issubdtype(counts.dtype, np.number) \
                else None
            where = "" if bad is None else f": expert_counts[{bad[0]}, {bad[1]}] is {counts[tuple(bad)].item()!r}"
            raise ValueError(f"expert_counts are tokens routed to each expert, finite and >= 0{where}")
    elif num_experts is not None:
        counts = count_experts(trainer, num_experts)  # [layers, experts]
    else:
        counts = None
    if counts is not None:
        out[keys.EXPERTS_MAX_VIO] = _layer_values(max_violation(counts))
    if routing_confidence is not None:
        conf = _array(routing_confidence, "routing_confidence").astype(np.float64)
        if conf.ndim == 2 and conf.shape == (trainer.shape[0], layers):
            conf = np.nanmean(conf, axis=0)  # [layers]
        if conf.shape != (layers,):
            raise ValueError(f"routing_confidence must be [tokens, layers] = [{trainer.shape[0]}, {layers}] or "
                             f"[layers] = [{layers}], got shape {tuple(conf.shape)}")
        out[keys.EXPERTS_CONFIDENCE] = _layer_values(conf)
        out[keys.EXPERTS_CONFIDENCE_MEAN] = float(np.mean(conf))
    return out


def with_aliases(metrics: Mapping[str, object], pair: str) -> dict[str, object]:
    """``metrics`` and, for each of its keys that another framework logs under its own name (``keys.ALIASES``), that
    name with the same value."""
    out = dict(metrics)
    for alias in keys.ALIASES:
        key = alias.pattern.format(pair=pair) if "{pair}" in alias.pattern else alias.pattern
        if key in metrics:
            out[alias.name] = metrics[key]
    return out


@keys.computes(keys.ROUTING_ROUTER_FLIP_BY_LAYER, keys.MISMATCH_ABS_D, keys.MISMATCH_SQ_D, keys.MISMATCH_F5,
               keys.MISMATCH_PROB_DIFF_MEAN, keys.MISMATCH_PROB_DIFF_MAX, keys.MISMATCH_PROB_DIFF_STD,
               keys.EXPERTS_MAX_VIO)
def route_diagnostics(
    rollout_routes: Any,
    trainer_routes: Any,
    *,
    logp_rollout: Any | None = None,
    logp_trainer: Any | None = None,
    pair: str = "rollout_old_free",
    expert_counts: Any | None = None,
    num_experts: int | None = None,
    routing_confidence: Any | None = None,
    aliases: bool = False,
    threads: int | None = 1,
) -> dict[str, object]:
    """One step's rollout -> trainer diagnostics under moestab's keys.

    Args:
        rollout_routes: ``[tokens, layers, top_k]`` integer expert ids the rollout engine chose for the step's
            response tokens (numpy or torch, any integer dtype; -1 = not recorded, left out of every statistic).
        trainer_routes: the same tokens' routes as the trainer's forward chose them, same shape.
        logp_rollout: ``[tokens]`` the rollout engine's log-probs of the sampled tokens (with ``logp_trainer``).
        logp_trainer: ``[tokens]`` the trainer's log-probs of the same tokens.
        pair: the keys' pair, one of :data:`DIAGNOSTICS_PAIRS`: which trainer side this is.
        expert_counts: ``[layers, experts]`` the trainer's own routed tokens per expert, for ``experts/max_vio``.
        num_experts: the model's experts: the route-integrity checks of ids outside the model and of agreement
            against chance need it (``DiagnosticsRun.log`` supplies it from the run's model when absent); without
            ``expert_counts`` it also counts them from ``trainer_routes`` (slower: several seconds at 1M tokens).
        routing_confidence: the trainer router's mass on its chosen experts, ``[tokens, layers]`` or ``[layers]``.
        aliases: also return each value under the names other frameworks log it (``keys.ALIASES``).
        threads: threads for the route comparison (default 1: a training job owns the other cores).

    Returns:
        ``routing/<pair>/{changed, router_flip, token_flip, changed_by_layer, router_flip_by_layer}`` and
        ``routes/integrity/*`` (the rollout side checked against the trainer's, :mod:`moestab.metrics.integrity`)
        always; with the
        log-probs ``mismatch/<pair>/{k1, k3, f2, abs_d, sq_d, f5, prob_diff_mean, prob_diff_max, prob_diff_std}``; with
        counts ``experts/max_vio``; with confidence ``experts/routing_confidence[_mean]``. Per-layer values are lists.
        ``ValueError`` / ``TypeError`` name the argument and its shape when an input does not fit.
    """
    if pair not in DIAGNOSTICS_PAIRS:
        raise ValueError(f"pair must be one of {list(DIAGNOSTICS_PAIRS)}, got {pair!r}")
    rollout = _routes(rollout_routes, "rollout_routes")
    trainer = _routes(trainer_routes, "trainer_routes")
    if rollout.shape != trainer.shape:
        raise ValueError(f"rollout_routes {tuple(rollout.shape)} and trainer_routes {tuple(trainer.shape)} must be the "
                         "same tokens, layers and top_k")
    rates = route_change_of(rollout, trainer, threads=threads, by_token=True)  # one group: [1] or [1, layers]
    out: dict[str, object] = routing_part(rates, pair)
    # the rollout side is the capture; _routes has refused a decision naming an expert twice
    out.update(route_integrity(rollout, trainer, num_experts=num_experts, changes=rates, distinct=True))
    if (logp_rollout is None) != (logp_trainer is None):
        raise ValueError("pass both logp_rollout and logp_trainer, or neither")
    if logp_rollout is not None:
        tokens = rollout.shape[0]
        out.update(mismatch_part(_log_probs(logp_trainer, "logp_trainer", tokens),
                                 _log_probs(logp_rollout, "logp_rollout", tokens), pair))
    out.update(experts_part(trainer, expert_counts, num_experts, routing_confidence))
    out = keys.in_table_order(out)
    return with_aliases(out, pair) if aliases else out


def _check_value(key: str, value: object, kind: str) -> None:
    """ValueError unless ``value`` fits the key table's ``kind`` of ``key``: a number (None for no value), or a list
    of them (lists of lists for per-layer-and-expert keys). metrics.jsonl's readers average what is written."""
    def number(x: object) -> bool:
        return x is None or (isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool))

    depth = {keys.PER_LAYER: 1, keys.PER_MINIBATCH: 1, keys.PER_LAYER_EXPERT: 2}.get(kind, 0)
    if depth == 0:
        ok = number(value)
    elif depth == 1:
        ok = value is None or (isinstance(value, list) and all(number(x) for x in value))
    else:
        ok = isinstance(value, list) and all(isinstance(r, list) and all(number(x) for x in r) for r in value)
    if not ok:
        raise ValueError(f"metrics[{key!r}] is {repr(value)[:60]}; the key table says {kind} (moestab.metrics.keys)")


class DiagnosticsRun:
    """A moestab run folder that another framework's trainer appends :func:`route_diagnostics` steps to.

    Use it as a context manager around training, or :meth:`open` / :meth:`close` from a trainer's own hooks::

        with DiagnosticsRun("runs/verl-r3", trainer="verl", replay="rollout", layers=range(48), num_experts=128,
                            top_k=8) as run:
            for step in ...:
                run.log(step, route_diagnostics(rollout, trainer, logp_rollout=..., logp_trainer=...))

    The folder is checked and locked as ``moestab train`` does (absent, empty, or ``overwrite`` of a run no process
    is writing); run.json's config names the trainer, the replay mode (``schema.REPLAY_MODES``) and the model, and
    ends ``finished`` or ``failed``. Only keys of the key table are written; aliases stay out of metrics.jsonl.

    ``route_integrity``: what a step whose rollout routes fail a route-integrity check (``routes/integrity/*``,
    :mod:`moestab.metrics.integrity`) does: ``warn`` (the first one logged and in run.json's ``warnings``) or
    ``refuse`` (:class:`~moestab.metrics.integrity.BrokenCaptureError` from :meth:`log`, naming the step, layer and
    check, before the step is written: stop before the trainer replays those routes). The agreement's chance level
    comes from the run's ``top_k`` and ``num_experts`` when the metrics lack it.

    ``on_collapse_warning``: what a collapse warning (``collapse/*``, docs/collapse.md: the rule over the logged
    steps' own keys) does: ``log`` (logged, in run.json's ``warnings``) or ``stop``
    (:class:`~moestab.recording.collapse_watch.CollapseStop` from :meth:`log` after the step is written, naming the
    step and the signal; leaving the ``with`` block with it marks the run ``interrupted``). The rule reads the keys it
    needs from what :meth:`log` is given; without them it says once that no warning can fire.

    ``report_to`` (any of ``tensorboard``, ``wandb``, ``trackio``) also sends each logged step to those trackers, as
    ``moestab train --report-to`` does (:mod:`moestab.recording.trackers`: the same trackers, keys ``moestab/<key>``,
    ``experts/load`` summarised unless ``report_expert_load_matrix``), opened with the folder and closed with it; an
    unknown tracker or a missing package is refused here, before anything is written.
    """

    def __init__(
        self,
        path: Any,
        *,
        trainer: str,
        layers: Sequence[int],
        num_experts: int,
        top_k: int,
        replay: str = "off",
        algo: str = "external",
        model: str = "",
        family: str = "unknown",
        steps: int = 0,
        overwrite: bool = False,
        report_to: str | Sequence[str] = (),
        report_expert_load_matrix: bool = False,
        route_integrity: str = "warn",
        on_collapse_warning: str = "log",
    ) -> None:
        check_policy(route_integrity)
        self.collapse = CollapseMonitor(on_collapse_warning)
        if replay not in schema.REPLAY_MODES:
            raise ValueError(f"replay must be one of {list(schema.REPLAY_MODES)} (the trainer's routing replay: off, "
                             f"R2 = old, R3 = rollout, TRR = rollout-gates, routing-constant = base), got {replay!r}")
        layers = tuple(int(x) for x in layers)
        if not layers or num_experts < 1 or not 1 <= top_k <= num_experts:
            raise ValueError(f"need MoE layers, num_experts >= 1 and 1 <= top_k <= num_experts; got {len(layers)} "
                             f"layers, num_experts={num_experts}, top_k={top_k}")
        self.report_to = (report_to,) if isinstance(report_to, str) else tuple(report_to)
        check_trackers(self.report_to)
        self.report_expert_load_matrix = report_expert_load_matrix
        self.route_integrity = route_integrity
        self.folder = RunFolder(path)
        self.overwrite = overwrite
        self.model = ModelInfo(family=family, moe_layers=layers, num_experts=num_experts, top_k=top_k,
                               recorded_layers=layers)
        self.config = {"trainer": trainer, "algo": algo, "routing_replay": replay, "model": model or trainer,
                       "steps": int(steps), "diagnostics": True}
        self.writer: RunWriter | None = None
        self.last_step = 0
        self._stack: ExitStack | None = None
        self._report: Callable[[Mapping[str, object], int], None] | None = None

    def open(self) -> DiagnosticsRun:
        """Lock the folder, check it takes a new run (clearing an old one with ``overwrite``) and write run.json."""
        if self._stack is not None:
            raise RuntimeError(f"{self.folder} is already open")
        stack = ExitStack()
        try:
            stack.enter_context(self.folder.lock(note=logger.warning))  # a dead writer's lock taken over
            if self.folder.check_new(overwrite=self.overwrite, remedies=REMEDIES):
                self.folder.clear()
            self.folder.check_tracker_folders(self.report_to)  # before run.json: no link out, no file in the way
            writer = RunWriter(self.folder.path)
            environment = {"moestab": __version__, "host": socket.gethostname(), "trainer": self.config["trainer"]}
            info = writer.start(config=self.config, model=self.model, environment=environment,
                                config_yaml=yaml.safe_dump(self.config, sort_keys=False), subfolders=())  # no tables
            tracked = TrackedRun(self.folder.path, self.config, run_id=run_id(info.created, self.folder.path),
                                 start_step=0)
            report = stack.enter_context(open_trackers(self.report_to, tracked,
                                                       expert_load_matrix=self.report_expert_load_matrix))
        except BaseException:
            stack.close()
            raise
        self.writer, self._stack, self._report = writer, stack, report
        return self

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        """Append ``step`` (1-based, increasing) with the table's keys of ``metrics`` to metrics.jsonl, and send them
        to the ``report_to`` trackers."""
        if self.writer is None:
            raise RuntimeError(f"open {self.folder} first (DiagnosticsRun.open, or a with block)")
        if step <= self.last_step:
            raise ValueError(f"steps must increase: step {step} after step {self.last_step}")
        widths = [len(v) for k, v in metrics.items() if k in keys.KEYS and keys.KEYS[k].kind == keys.PER_LAYER
                  and isinstance(v, list)]
        if any(w != self.model.num_layers for w in widths):
            raise ValueError(f"per-layer metrics have {sorted(set(widths))} values; this run has "
                             f"{self.model.num_layers} MoE layers")
        written = with_model({k: v for k, v in metrics.items() if k in keys.KEYS}, self.model.top_k,
                             self.model.num_experts)
        for key, value in written.items():
            _check_value(key, value, keys.KEYS[key].kind)
        judged = self.config["routing_replay"] not in schema.BASE_ROUTED_MODES
        broken = verdict(written, step=step, policy=self.route_integrity, agreement=judged)  # refuse: nothing written
        added, warning = self.collapse.observe(step, written)
        written.update(added)
        write_step_metrics(self.writer, step, written)
        self.writer.update(last_step=step)
        self.last_step = step
        self._report(written, step)
        if broken is not None:
            warn_once(broken, self.writer.read_info().warnings, self.writer.add_warning, logger.warning)
        note = self.collapse.missing_note()
        if note is not None:
            logger.warning(note)
        if warning is not None:
            message = self.collapse.message(warning)
            logger.warning(message)
            self.writer.add_warning(message)
            if self.collapse.policy == "stop":
                raise CollapseStop(warning, message)

    def close(self, error: BaseException | None = None) -> None:
        """Mark the run ``finished`` (or ``failed`` with ``error``) and release the folder."""
        if self._stack is None:
            return
        try:
            if self.writer is not None:
                if error is None:
                    self.writer.update(status=schema.STATUS_FINISHED)
                elif isinstance(error, CollapseStop):
                    self.writer.update(status=schema.STATUS_INTERRUPTED, error=str(error))
                else:
                    self.writer.update(status=schema.STATUS_FAILED, error=f"{type(error).__name__}: {error}")
        finally:
            self._stack.close()  # the trackers, then the lock
            self._stack, self.writer, self._report = None, None, None

    def __enter__(self) -> DiagnosticsRun:
        return self.open()

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close(exc)
