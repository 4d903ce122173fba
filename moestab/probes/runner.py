"""Probes by name: each takes checkpoints, a suite and settings and returns a :class:`ProbeResult`.

The registry's error lists the valid names; inputs are checked (checkpoint count, dtypes) before any model is
loaded, so bad input fails fast and writes nothing. The step probes (step-volatility, depth) take no suite: they run
RL steps on a task's prompts, which their result records as its suite.

The probes' own modules (torch, transformers, pandas) are imported inside the functions that run them, not at the
top: ``moestab probe --help`` reads :data:`PROBES` and :class:`ProbeSettings`' defaults without loading them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moestab.configs import (
    ConfigError,
    check_at_least,
    check_cache_dir,
    check_group_size,
    check_minibatches,
    check_response_cap,
    check_seed,
    check_threads,
    is_finite_number,
)
from moestab.probes.errors import ProbeError
from moestab.probes.suites import GENERAL, SUITE_FORMS, ProbeSuite, load_suite
from moestab.text import shown
from moestab.train.config import TrainConfig

if TYPE_CHECKING:
    import pandas as pd

    from moestab.probes.checkpoints import Checkpoint
    from moestab.probes.compare import Comparison
    from moestab.probes.folder import ProbeResult
    from moestab.probes.one_step import StepRecipe


@dataclass(frozen=True)
class ProbeSettings:
    """Settings every probe takes."""

    dtype: str = "float32"
    """Precision the checkpoints are loaded in (numerics: the reference precision)."""
    other_dtype: str = "bfloat16"
    """numerics only: the precision compared with ``dtype``."""
    device: str = "cpu"
    """Where the checkpoints run: cpu, cuda or cuda:N."""
    batch_size: int = 16
    """Suite texts per forward pass."""
    max_tokens: int | None = None
    """Cut every suite text to this many tokens."""
    reference: int = -1
    """saturation only: index of the reference checkpoint (default: the last)."""
    task: str | None = None
    """Step probes: task spec of the step (default: the run's task for a run folder, else arithmetic)."""
    algo: str = "grpo"
    """Step probes: objective preset of the step (``moestab.rl.PRESETS``); routing replay is off."""
    prompts: int = TrainConfig.prompts_per_step
    """Step probes: prompts of the step (``moestab train``'s prompts_per_step)."""
    group_size: int = TrainConfig.group_size
    """Step probes: samples per prompt."""
    seed: int = 0
    """Step probes: the step is ``moestab train``'s step 1 with this seed (prompts, sampling, minibatch split); depth:
    also the seed of the policies' initialisation. 0 <= seed < 2**63, as ``moestab train``'s."""
    max_new_tokens: int | None = None
    """Step probes: response cap, 1 to 65,536 as ``moestab train``'s (default: the task's longest answer plus
    end-of-sequence)."""
    lrs: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    """step-volatility only: learning rates, each a step from the same weights (0 allowed: the no-change control)."""
    minibatch_counts: tuple[int, ...] = (1, 2, 4)
    """step-volatility only: updates per step, each a step from the same weights; each must divide prompts x
    group_size."""
    layers: tuple[int, ...] = (2, 4, 8, 16)
    """depth only: MoE layer counts of the embedded policies, one step each."""
    lr: float = TrainConfig.lr
    """depth only: learning rate of the single update (``moestab train``'s default)."""
    model: str = "embedded"
    """depth only: the embedded variant whose depth varies, without ``layers`` (e.g. 'embedded:experts=32,top_k=4')."""
    warm_start: bool = False
    """depth only: start from ``moestab train``'s supervised warm start of each variant (cached; minutes per deep
    variant the first time) instead of fresh weights with ``seed``."""
    cache_dir: str | None = None
    """depth only: warm-start cache folder, created if missing (default: $MOESTAB_CACHE or ~/.cache/moestab, as
    ``moestab train``)."""
    progress: bool = False
    """Show a progress bar."""
    threads: int | None = None
    """torch CPU threads, 1 to 4,096, set by ``moestab probe`` before probing (default: torch's choice); as with
    ``moestab train``, the library's :func:`run_probe` leaves the process's thread count to its caller."""

    def check(self) -> None:
        """Refuse a bad setting before any model is loaded: :class:`ProbeError` naming it and what is valid. The
        rules shared with ``moestab train`` are :mod:`moestab.configs`'."""
        with _as_probe_error():
            check_threads("--threads", self.threads, what="")
            self._check_collect()
            self._check_steps()

    def _check_collect(self) -> None:
        """Precisions, batch, text cut and device of the probes that run checkpoints on a suite."""
        from moestab.probes.checkpoints import check_dtype

        check_dtype(self.dtype)
        check_dtype(self.other_dtype)
        if self.batch_size < 1:
            raise ProbeError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ProbeError(f"max_tokens must be >= 2, got {self.max_tokens}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ProbeError(f"device {self.device!r} is not valid; valid: cpu, cuda, cuda:N")

    def _check_steps(self) -> None:
        """The step probes' settings, with ``moestab train``'s rules where they are its settings."""
        from moestab.probes.depth import check_depth_settings
        from moestab.probes.one_step import probe_task
        from moestab.rl import PRESETS

        if self.algo not in PRESETS:
            raise ProbeError(f"algo {shown(self.algo)} is not valid; valid: {', '.join(PRESETS)}")
        check_at_least("prompts", self.prompts, 1)
        check_group_size("group_size", self.group_size)
        check_seed("seed", self.seed)
        check_response_cap("max_new_tokens", self.max_new_tokens, as_range=True)
        check_cache_dir("cache_dir", self.cache_dir)
        self._check_updates()
        check_depth_settings(self.layers, self.model)
        if self.task is not None:
            probe_task(self.task, [])  # a bad spec fails here, naming what is valid

    def _check_updates(self) -> None:
        """Learning rates finite and >= 0; minibatch counts that divide the rollout batch; no value given twice."""
        if not self.lrs:
            raise ProbeError("lrs: give at least one learning rate; valid: finite numbers >= 0")
        for name, values in (("lrs", self.lrs), ("lr", (self.lr,))):
            bad = [v for v in values if not is_finite_number(v) or v < 0]
            if bad:
                raise ProbeError(f"{name} {bad} are not valid; valid: finite numbers >= 0 (0: the no-change control)")
        check_minibatches("minibatch_counts", self.minibatch_counts, self.prompts * self.group_size,
                          f"prompts x group_size = {self.prompts} x {self.group_size}")
        for name, values in (("lrs", self.lrs), ("minibatch_counts", self.minibatch_counts)):
            if len(set(values)) != len(values):
                raise ProbeError(f"{name} {list(values)} repeat a value; give each once")


@contextmanager
def _as_probe_error() -> Iterator[None]:
    """A refusal of a shared settings rule (:class:`ConfigError`) raised as the probes' :class:`ProbeError`."""
    try:
        yield
    except ConfigError as exc:
        raise ProbeError(str(exc)) from None


def _comparison_tables(comparison: Comparison, label: str | None = None) -> dict[str, pd.DataFrame]:
    tables = {"summary": comparison.summary, "by_layer": comparison.by_layer,
              "by_position": comparison.by_position, "by_margin": comparison.by_margin}
    if label is None:
        return tables
    return {name: table.assign(comparison=label) for name, table in tables.items()}


def _compare(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    from moestab.probes.checkpoints import check_same_architecture, load_checkpoint
    from moestab.probes.collect import collect
    from moestab.probes.compare import compare_records

    (a, b) = checkpoints
    model_a, tok_a = load_checkpoint(a, dtype=s.dtype, device=s.device)
    model_b, tok_b = load_checkpoint(b, dtype=s.dtype, device=s.device)
    check_same_architecture((a.label, model_a), (b.label, model_b))
    kwargs = {"batch_size": s.batch_size, "max_tokens": s.max_tokens, "progress": s.progress}
    record_a = collect(model_a, tok_a, suite.texts, **kwargs)
    record_b = collect(model_b, tok_b, suite.texts, **kwargs)
    return _comparison_tables(compare_records(record_a, record_b))


def _numerics(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    import pandas as pd

    from moestab.probes.numerics import numerics

    (checkpoint,) = checkpoints  # dtype == other_dtype is allowed: the control that must show no flips
    parts = numerics(checkpoint, suite.texts, dtypes=(s.dtype, s.other_dtype), batch_size=s.batch_size,
                     max_tokens=s.max_tokens, device=s.device, progress=s.progress)
    tables: dict[str, list[pd.DataFrame]] = {}
    for label, comparison in parts.items():
        for name, table in _comparison_tables(comparison, label).items():
            tables.setdefault(name, []).append(table)
    return {name: pd.concat(frames, ignore_index=True) for name, frames in tables.items()}


def _saturation(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    from moestab.probes.saturation import saturation

    return {"saturation": saturation(checkpoints, suite.texts, reference=s.reference, dtype=s.dtype,
                                     batch_size=s.batch_size, max_tokens=s.max_tokens, device=s.device,
                                     progress=s.progress)}


def _routers(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    from moestab.probes.routers import routers

    return {"routers": routers(checkpoints, suite.texts, dtype=s.dtype, batch_size=s.batch_size,
                               max_tokens=s.max_tokens, device=s.device, progress=s.progress)}


def _recipe(checkpoints: list[Checkpoint], s: ProbeSettings) -> StepRecipe:
    from moestab.probes.one_step import StepRecipe, probe_task

    return StepRecipe(probe_task(s.task, checkpoints), algo=s.algo, prompts=s.prompts, group_size=s.group_size,
                      seed=s.seed, max_new_tokens=s.max_new_tokens)


def _step_suite(checkpoints: list[Checkpoint], s: ProbeSettings) -> ProbeSuite:
    return _recipe(checkpoints, s).suite()


def _step_volatility(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    from moestab.probes.checkpoints import load_checkpoint
    from moestab.probes.one_step import prepare_tokenizer
    from moestab.probes.step_volatility import step_volatility

    (checkpoint,) = checkpoints
    recipe = _recipe(checkpoints, s)
    for n in s.minibatch_counts:  # the step's own checks (e.g. max_new_tokens) before the model is loaded
        recipe.step_settings(n)
    model, tokenizer = load_checkpoint(checkpoint, dtype=s.dtype, device=s.device)
    prepare_tokenizer(tokenizer, recipe, checkpoint.label)
    return step_volatility(model, tokenizer, recipe, lrs=s.lrs, minibatch_counts=s.minibatch_counts,
                           label=checkpoint.label, progress=s.progress)


def _depth(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    from moestab.probes.depth import depth

    return depth(_recipe(checkpoints, s), layers=s.layers, lr=s.lr, model=s.model, warm_start=s.warm_start,
                 cache_dir=s.cache_dir, dtype=s.dtype, device=s.device, progress=s.progress)


_COLLECT = ("dtype", "device", "batch_size", "max_tokens")
_STEP = ("dtype", "device", "task", "algo", "prompts", "group_size", "seed", "max_new_tokens")


@dataclass(frozen=True)
class Probe:
    run: Callable[[list[Checkpoint], ProbeSuite, ProbeSettings], dict[str, pd.DataFrame]]
    checkpoints: str
    """How many checkpoints it takes: 'none', 'one', 'two', 'many' (two or more) or 'any' (one or more); a run
    folder gives its last checkpoint ('one', 'two') or all of them ('many', 'any')."""
    help: str
    settings: tuple[str, ...]
    """The :class:`ProbeSettings` fields it reads: what its result records."""
    own_suite: Callable[[list[Checkpoint], ProbeSettings], ProbeSuite] | None = None
    """``None``: it runs on the suite it is given; else it takes none and this makes the one its result records."""


PROBES: dict[str, Probe] = {
    "compare": Probe(_compare, "two", "routing and log-prob difference between two checkpoints on the same tokens",
                     _COLLECT),
    "numerics": Probe(_numerics, "one", "the same weights in two precisions, and batched vs one sequence at a time",
                      (*_COLLECT, "other_dtype")),
    "saturation": Probe(_saturation, "many", "OLMoE router saturation of each checkpoint against a reference",
                        (*_COLLECT, "reference")),
    "routers": Probe(_routers, "any", "how peaked and balanced each checkpoint's routers are, per layer: top-k "
                     "margin quantiles, normalised entropy, load max_vio, idle experts", _COLLECT),
    "step-volatility": Probe(_step_volatility, "one", "one RL step from one checkpoint at each --lrs and "
                             "--minibatch-counts: routing change, log-ratio variance, clipping",
                             (*_STEP, "lrs", "minibatch_counts"), _step_suite),
    "depth": Probe(_depth, "none", "one RL update of embedded policies of each --layers depth (no checkpoint): "
                   "router vs token flip against depth", (*_STEP, "layers", "lr", "model", "warm_start", "cache_dir"),
                   _step_suite),
}


def get_probe(name: str) -> Probe:
    if name not in PROBES:
        raise ProbeError(f"unknown probe {name!r}; valid probes: {', '.join(PROBES)}")
    return PROBES[name]


def select_checkpoints(probe: str, given: list[list[Checkpoint]]) -> list[Checkpoint]:
    """The checkpoints ``probe`` runs on, from what each argument resolved to (a run folder: its checkpoints)."""
    want = get_probe(probe).checkpoints
    if want == "none":
        if given:
            raise ProbeError(f"{probe} takes no checkpoint (it builds its own policies), got {len(given)}")
        return []
    if want in ("many", "any"):
        chosen = [c for group in given for c in group]
        if want == "any" and not chosen:
            raise ProbeError(f"{probe} needs a checkpoint or a run folder, got none")
        if want == "many" and len(chosen) < 2:
            raise ProbeError(f"{probe} needs at least 2 checkpoints (or a run folder with several), got {len(chosen)}")
        return chosen
    count = {"one": 1, "two": 2}[want]
    if len(given) != count:
        raise ProbeError(f"{probe} takes {count} checkpoint{'s' if count > 1 else ''} (a run folder means its last "
                         f"checkpoint), got {len(given)}")
    return [group[-1] for group in given]


def probe_inputs(
    name: str, checkpoint_args: Sequence[str], suite: str | None, count: int | None, settings: ProbeSettings
) -> tuple[list[Checkpoint], ProbeSuite | None]:
    """What ``moestab probe NAME CHECKPOINT... [--suite SUITE] [--count N]`` runs on, all checked before any model is
    loaded, in this order: the probe's name, ``settings``, ``count``, the checkpoints (each argument a run folder or
    a model folder, see :func:`select_checkpoints`) and the suite (default: general; ``None`` for the step probes,
    which take neither a suite nor a count)."""
    from moestab.probes.checkpoints import resolve_checkpoints

    probe = get_probe(name)
    settings.check()
    if count is not None and count < 1:
        raise ProbeError(f"--count must be >= 1, got {count}")
    checkpoints = select_checkpoints(name, [resolve_checkpoints([c]) for c in checkpoint_args])
    if probe.own_suite is None:
        return checkpoints, load_suite(GENERAL if suite is None else suite, count)
    if suite is not None or count is not None:
        raise ProbeError(f"{name} takes no --suite or --count: it runs RL steps on --task's prompts (--prompts sets "
                         "how many)")
    return checkpoints, None


def run_probe(
    name: str, checkpoints: list[Checkpoint], suite: ProbeSuite | None, settings: ProbeSettings
) -> ProbeResult:
    """Probe ``name`` on ``checkpoints`` (see :func:`select_checkpoints`); ``suite`` is ``None`` for the probes
    that take none (step-volatility, depth) and required by the others."""
    from moestab.probes.folder import ProbeResult

    probe = get_probe(name)
    settings.check()
    expected = {"none": 0, "one": 1, "two": 2}.get(probe.checkpoints)
    if expected is not None and len(checkpoints) != expected:
        raise ProbeError(f"{name} takes {expected} checkpoint(s), got {len(checkpoints)} (select_checkpoints picks "
                         "them from run folders)")
    if probe.own_suite is not None:
        if suite is not None:
            raise ProbeError(f"{name} takes no suite: it runs RL steps on the prompts of --task")
        suite = probe.own_suite(checkpoints, settings)
    elif suite is None:
        raise ProbeError(f"{name} needs a suite; valid suites: {SUITE_FORMS}")
    tables = probe.run(checkpoints, suite, settings)
    return ProbeResult(name, [f"{c.label}={c.path}" for c in checkpoints], suite.manifest(),
                       {k: getattr(settings, k) for k in probe.settings}, tables)
