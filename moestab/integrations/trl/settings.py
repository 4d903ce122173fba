"""What moestab records inside TRL's ``GRPOTrainer``, and which TRL settings it can record: pure functions of the
``GRPOConfig``, checked before training starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from moestab import rl
from moestab.recording.measure_budget import MeasureBudget
from moestab.run_folder.schema import COLLAPSE_POLICIES, INTEGRITY_POLICIES

PPO_CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
"""TRL loss types that clip the ratio as PPO does (``min(w A, clip(w) A)``): moestab's ``ppo-clip``."""
SUPPORTED_LOSSES = (*PPO_CLIP_LOSSES, "cispo")
"""TRL loss types whose clipping moestab defines (``sapo`` and ``vespo`` clip no ratio; they are refused)."""


@dataclass(frozen=True)
class RecordSettings:
    """Where and what to record; the TRL settings themselves come from the trainer's ``GRPOConfig``."""

    run_dir: str | Path
    """The run folder to create (docs/run-format.md)."""
    record_fraction: float = 1.0
    """Share of each step's sequences written to the per-token table; the metrics always use every sequence."""
    record_layers: tuple[int, ...] | None = None
    """Decoder-layer indices of the MoE layers the per-token table keeps (default: all)."""
    budget: MeasureBudget = field(default_factory=MeasureBudget)
    """The measurement budget, as ``moestab train``'s (:mod:`moestab.recording.measure_budget`): ``every`` records
    generation cycles 1, 1 + every, ... (the others run with no hook and no extra forward); ``fraction`` is the share of
    pi_old's forward chunks that pi_new re-runs after the updates (at least one chunk, drawn by the budget's seeded
    rule with TRL's seed + the step): pi_new costs about this share of a no-grad forward of the batch. The unit is
    a chunk of TRL's pi_old forward, not a group: pi_new must see exactly pi_old's inputs and shapes. Sequences left
    out have no pi_new (routes -1, ``logp_new`` NaN); old->new volatility is measured on the others and logged with
    its sampling error over the groups they hold (``routing/old_new/*_se``). Routing's share (``routing_share``)
    scores the same sequences when TRL runs its pi_old forward; without it, every sequence (it then costs no
    forward)."""
    overwrite: bool = False
    """Delete a finished, failed or stopped run already in ``run_dir`` first (never another kind of folder)."""
    routing_share: bool = False
    """Measure routing's share of the ratio (``routing_share/*`` keys, docs/metrics.md), as ``moestab train
    --routing-share`` does: after each loss forward of a recorded step's last pass, before its optimizer step, the
    micro-batch is scored once more without grad on the same weights with pi_old's routes replayed (TRL's update
    routes freely). Costs about one no-grad forward of the generation batch per recorded step; changes nothing TRL
    computes. When TRL computes no pi_old (one optimizer step per generation batch) pi_old's routes are the loss
    forward's own, so the replayed side is the update itself and no forward runs."""
    route_integrity: str = "warn"
    """What a step whose generation routes fail a route-integrity check does (``routes/integrity/*``,
    :mod:`moestab.metrics.integrity`): ``warn`` (log the first failing step, record it in run.json's warnings) or
    ``refuse`` (write the step, then stop training with :class:`~moestab.metrics.integrity.BrokenCaptureError` naming
    the step, layer and check). TRL's updates route freely, so no captured route is replayed either way."""
    on_collapse_warning: str = "log"
    """What a collapse warning does (``collapse/*`` keys, docs/collapse.md; the rule reads the recorded steps' keys,
    plus TRL's logged ``reward`` and ``grad_norm`` as ``reward/mean`` and ``grad_norm``): ``log`` (logged, in
    run.json's warnings) or ``stop`` (also ask the Trainer to save a checkpoint and stop: ``control.should_save``,
    ``should_training_stop``; run.json ends ``interrupted`` with the warning)."""
    report_expert_load_matrix: bool = False
    """Also send ``experts/load`` whole through TRL's ``log``, a series per layer and expert (6,144 a step for 48
    layers of 128 experts); by default only its summary goes (``moestab/experts/load/max_vio_max``, ``max_vio_mean``,
    ``dead_experts``: :func:`moestab.recording.trackers.scalars`). metrics.jsonl always holds the matrix."""

    def __post_init__(self) -> None:
        if not 0.0 < self.record_fraction <= 1.0:
            raise ValueError(f"record_fraction must be in (0, 1], got {self.record_fraction}")
        if self.route_integrity not in INTEGRITY_POLICIES:
            raise ValueError(f"route_integrity must be one of {list(INTEGRITY_POLICIES)}, got {self.route_integrity!r}")
        if self.on_collapse_warning not in COLLAPSE_POLICIES:
            raise ValueError(f"on_collapse_warning must be one of {list(COLLAPSE_POLICIES)}, got "
                             f"{self.on_collapse_warning!r}")
        if not isinstance(self.budget, MeasureBudget):
            raise ValueError(f"budget must be a moestab.recording.measure_budget.MeasureBudget, got {self.budget!r}")

    def new_chunks(self, chunks: int, seed: int) -> list[int]:
        """Indices (sorted) of pi_old's ``chunks`` forward chunks that pi_new re-runs, drawn with ``seed``."""
        return self.budget.groups(chunks, seed).tolist()


@dataclass(frozen=True)
class CycleLayout:
    """How TRL consumes one generation batch: the unit moestab calls a step.

    TRL generates once every ``steps_per_generation * num_iterations`` micro-steps (``training_step`` calls): the
    generation batch is split into ``steps_per_generation`` micro-batches, each used once per pass, for
    ``num_iterations`` passes; every ``gradient_accumulation_steps`` micro-steps end in an optimizer step.
    """

    micro_per_pass: int
    """``steps_per_generation``: micro-batches the generation batch is split into."""
    passes: int
    """``num_iterations``: times each micro-batch is trained on."""
    grad_accum: int
    """``gradient_accumulation_steps``: micro-steps per optimizer step."""

    @property
    def micro_steps(self) -> int:
        return self.micro_per_pass * self.passes

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per generation batch: moestab's minibatch updates of one step."""
        return self.micro_steps // self.grad_accum

    @property
    def old_forward(self) -> bool:
        """TRL computes pi_old in a no-grad forward after generating (its own condition, without vLLM); otherwise
        the whole generation batch is trained on in one optimizer step and pi_old is the loss forward itself."""
        return self.grad_accum % self.micro_steps != 0


def cycle_layout(args: Any) -> CycleLayout:
    """The ``CycleLayout`` of a ``GRPOConfig``; ``ValueError`` when a generation batch does not end on an optimizer
    step (moestab's step is one generation batch and the updates made from it)."""
    layout = CycleLayout(micro_per_pass=int(args.steps_per_generation), passes=int(args.num_iterations),
                         grad_accum=int(args.gradient_accumulation_steps))
    if layout.micro_steps % layout.grad_accum:
        raise ValueError(
            f"steps_per_generation * num_iterations = {layout.micro_steps} is not a multiple of "
            f"gradient_accumulation_steps = {layout.grad_accum}: a generation batch would end inside an optimizer "
            "step, and moestab's step is one generation batch and its updates; make it a multiple"
        )
    return layout


def check_supported(args: Any) -> None:
    """``ValueError`` naming each ``GRPOConfig`` setting whose runs moestab cannot record faithfully."""
    problems = []
    if args.use_vllm:
        problems.append("use_vllm=True: vLLM generates outside the policy module, so its routes cannot be hooked")
    if args.use_transformers_continuous_batching:
        problems.append("use_transformers_continuous_batching=True: generate_batch's paged calls are not recorded")
    if args.world_size > 1:
        problems.append(f"{args.world_size} processes: each sees only its slice of the batch (one process only)")
    if args.loss_type not in SUPPORTED_LOSSES:
        problems.append(f"loss_type={args.loss_type!r}: no clipped ratio to record; supported: {SUPPORTED_LOSSES}")
    if args.loss_type == "cispo" and args.importance_sampling_level != "token":
        problems.append("loss_type='cispo' with importance_sampling_level='sequence': moestab's CISPO is token-level")
    if args.importance_sampling_level not in ("token", "sequence"):
        problems.append(f"importance_sampling_level={args.importance_sampling_level!r}")
    if problems:
        raise ValueError("moestab cannot record this GRPOTrainer run: " + "; ".join(problems))
    cycle_layout(args)


@dataclass(frozen=True)
class ClipRule:
    """TRL's loss as the moestab loss whose ``clipped`` flags mean the same (tests/rl/test_trl_crosscheck.py)."""

    loss: str
    kwargs: dict[str, Any]

    def mask(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` bool: tokens whose governing ratio was clipped (``moestab.rl.compute_clipped_mask``)."""
        return rl.compute_clipped_mask(self.loss, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask,
                                       **self.kwargs)


def clip_rule(args: Any) -> ClipRule:
    """The ``ClipRule`` of a ``GRPOConfig`` (``epsilon_high`` defaults to ``epsilon``, as in TRL)."""
    low = float(args.epsilon)
    high = float(args.epsilon if args.epsilon_high is None else args.epsilon_high)
    if args.loss_type == "cispo":  # TRL caps w at epsilon_high itself, with no lower bound
        return ClipRule("cispo", {"level": "token", "clip_low": 1.0, "clip_high": high - 1.0,
                                  "aggregation": "token-mean"})
    # The aggregation does not change which tokens are clipped; token-mean needs no normalising constant.
    return ClipRule("ppo-clip", {"level": args.importance_sampling_level, "clip_low": low, "clip_high": high,
                                 "aggregation": "token-mean"})


NAMED_ALGOS = {("grpo", "token"): "grpo", ("grpo", "sequence"): "gspo"}
"""``(loss_type, importance_sampling_level)`` -> the algorithm the pair is, as ``moestab train`` names it: a ratio per
token (GRPO, DeepSeekMath) or per sequence (GSPO), each with TRL's ``loss_type="grpo"``, the loss a mean per sequence
as both papers write it. Other pairs are named by TRL's settings only: TRL's default ``loss_type="dapo"`` sums tokens
over the batch, which weighs a sequence by its length (with ``"sequence"`` TRL warns that this is not GSPO). The clip
range, ``beta`` and the batch layout are hyperparameters, in run.json's ``config.trl``."""


def algo_label(args: Any) -> str:
    """run.json's ``algo`` of a TRL run: ``trl-<loss_type>-<importance_sampling_level>``, after the algorithm's name
    when the pair is one of :data:`NAMED_ALGOS` (``gspo (trl-grpo-sequence)``), so GSPO and GRPO runs read as such
    beside ``moestab train``'s and a ``dapo``-loss run is never taken for either."""
    settings = f"trl-{args.loss_type}-{args.importance_sampling_level}"
    name = NAMED_ALGOS.get((args.loss_type, args.importance_sampling_level))
    return settings if name is None else f"{name} ({settings})"


RECORDED_ARGS = (
    "loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta", "beta", "learning_rate",
    "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
    "num_iterations", "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "scale_rewards", "mask_truncated_completions", "top_entropy_quantile", "off_policy_mask_threshold",
    "max_grad_norm", "bf16", "fp16", "gradient_checkpointing", "seed", "max_steps",
)
"""``GRPOConfig`` fields copied to run.json's ``config.trl``: what the recorded numbers depend on."""


def run_config(args: Any, *, model: str, steps: int, settings: RecordSettings) -> dict[str, Any]:
    """run.json ``config`` of a TRL run: the keys every run has (``algo``, ``routing_replay``, ``model``,
    ``steps``), the recording settings, and the TRL settings under ``trl``."""
    return {
        "trainer": "trl.GRPOTrainer",
        "algo": algo_label(args),
        "routing_replay": "off",  # TRL replays no routes
        "model": model,
        "steps": steps,
        "record_fraction": settings.record_fraction,
        "record_layers": None if settings.record_layers is None else list(settings.record_layers),
        "measure_fraction": settings.budget.fraction,
        "measure_every": settings.budget.every,
        "routing_share": settings.routing_share,
        "trl": {name: getattr(args, name, None) for name in RECORDED_ARGS},
    }
