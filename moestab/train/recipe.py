"""The recipe of a ``moestab train`` step, shared with whatever steps as training does (the probes, the notebooks).

From a :class:`~moestab.train.config.TrainConfig`: the device and dtypes, the policy RL starts from (given, or the
embedded policy warm-started), loading it with errors that name what is wrong, the checks a policy must pass before
anything is written, which layers the token tables keep, and the settings each step runs with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from moestab.configs import ConfigError, cache_root
from moestab.models import build_embedded_policy, is_embedded, parse_model_spec
from moestab.models.precision import float64_norms
from moestab.recording.measurements import switched_on
from moestab.routing import IncompatibleTransformersError, RoutingError, find_routers
from moestab.routing.compat import check_generate_recording
from moestab.run_folder.run_info import ModelInfo
from moestab.tasks import Task
from moestab.train.config import TrainConfig
from moestab.train.distributed import World
from moestab.train.run_lifetime import TrainingError
from moestab.train.step_settings import StepSettings
from moestab.train.warm_start import WarmStartSpec, warm_start

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
"""Config ``dtype`` / ``rollout_dtype`` -> torch dtype."""

logger = logging.getLogger(__name__)
"""The warm start's notes when no ``log`` is given."""


def choose_device(name: str, world: World) -> torch.device:
    """Config ``device`` as a torch device: one GPU per process (``world.local_rank``), or the CPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but torch sees no CUDA device; valid here: cpu, auto")
    if name == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", world.local_rank)  # one GPU per process


def cache_dir(config: TrainConfig) -> Path:
    """Where warm-started policies are cached: ``cache_dir``, else ``$MOESTAB_CACHE``, else ``~/.cache/moestab``."""
    return cache_root(config.cache_dir)


def base_policy_path(config: TrainConfig, task: Task, log: Callable[[str], None]) -> tuple[str, dict | None]:
    """The policy RL starts from: ``config.model`` as given, or the embedded policy warm-started on ``task`` (built
    now or found in the cache), with the warm start's record (``None`` for a given model)."""
    if not is_embedded(config.model):
        return config.model, None
    model_spec = parse_model_spec(config.model, seed=config.seed)
    untrained, _ = build_embedded_policy(model_spec)
    find_routers(untrained)  # this transformers' routing math, then its generate(), before a warm start of minutes
    check_recording(untrained)
    spec = WarmStartSpec(
        model=model_spec,
        task_spec=task.spec,
        target=config.warm_start_target,
        max_steps=config.warm_start_max_steps,
        seed=config.seed,
        eval_size=config.eval_size,
        aux_loss_coef=config.warm_start_aux_loss_coef,
        z_loss_coef=config.warm_start_z_loss_coef,
    )
    path, record = warm_start(spec, task, cache_dir(config), log=log)
    return str(path), record


def warm_started_base(model: str = "embedded", *, seed: int = 0, task: str = "arithmetic",
                      cache_dir: str | None = None, log: Callable[[str], None] = logger.info) -> str:
    """The folder of ``model`` (an embedded spec) warm-started on ``task`` for ``seed``, as ``moestab train`` starts
    from it: built once (minutes on a CPU) and cached (``cache_dir``, else ``$MOESTAB_CACHE``, else
    ``~/.cache/moestab``). A policy another trainer (TRL) can learn from: an untrained one answers nothing right, so
    every reward and advantage is 0."""
    from moestab.configs import build_config
    from moestab.tasks import task_from_spec

    config = build_config(TrainConfig, {"model": model, "seed": seed, "task": task, "cache_dir": cache_dir})
    path, _ = base_policy_path(config, task_from_spec(config.task), log)
    return path


def hf_folder_problem(folder: Path) -> str:
    """Why ``folder`` cannot be a Hugging Face model folder (no config.json, one that is not a JSON object with a
    ``model_type``, no weights), or "" when it may be one."""
    import json

    config = folder / "config.json"
    if not config.is_file():
        return "it has no config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        return f"its config.json is not a JSON object ({type(exc).__name__})"
    if not isinstance(model_type, str) or not model_type:
        return "its config.json names no model_type"
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        return "it holds no weights (*.safetensors or *.bin)"
    return ""


def load_policy(path: str, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    """A supported MoE policy from a local folder (or a hub id), with errors that name what is wrong."""
    folder = Path(path).expanduser()
    if not folder.exists() and (path.startswith((".", "/", "~")) or path.count("/") != 1):
        raise TrainingError(f"model: the folder {path!r} does not exist (give a Hugging Face checkpoint folder, "
                            "or 'embedded')")
    if folder.is_dir():
        problem = hf_folder_problem(folder)
        if problem:
            raise TrainingError(f"model: {path} is not a Hugging Face model folder ({problem}); give a checkpoint "
                                "folder (config.json and weights), or 'embedded'")
    try:
        eager = {"experts_implementation": "eager"} if dtype == torch.float64 else {}  # grouped kernels: <= fp32
        model = AutoModelForCausalLM.from_pretrained(str(folder) if folder.exists() else path, dtype=dtype, **eager)
    except Exception as exc:  # transformers / safetensors raise many types for a damaged folder
        weights = sorted(p.name for p in folder.glob("*.safetensors")) if folder.is_dir() else []
        files = f" (weights: {', '.join(weights)})" if weights else ""
        raise TrainingError(f"cannot load model {path!r}{files}: {type(exc).__name__}: {exc}") from exc
    if dtype == torch.float64:
        float64_norms(model)  # the family's norms compute in float32: a float64 run is float64 there too
    try:
        find_routers(model)  # a dense model fails here with the list of supported families
    except RoutingError as exc:
        raise TrainingError(f"model {path}: {exc}") from exc
    return model.to(device)


def check_recording(model: PreTrainedModel) -> None:
    """Refuse, before anything is written, a transformers whose generate() this moestab cannot record."""
    try:
        check_generate_recording(model)
    except IncompatibleTransformersError as exc:
        raise TrainingError(str(exc)) from exc


def check_policy_settings(config: TrainConfig, model: PreTrainedModel) -> None:
    """Refuse settings the loaded policy cannot honour: a load-balancing loss it does not have, a routing replay
    its family cannot make exact."""
    if config.router_aux_loss_coef > 0 and not hasattr(model.config, "router_aux_loss_coef"):
        raise ConfigError(f"router_aux_loss_coef: {model.config.model_type} has no load-balancing loss (it balances "
                          "its experts otherwise, e.g. DeepSeek-V3's selection bias); leave it at 0")
    if config.routing_replay != "off":
        for site in find_routers(model, verify=False):
            if site.adapter.training_replay is not None:
                raise ConfigError(f"routing_replay: {config.routing_replay!r} cannot be exact for "
                                  f"{site.adapter.family}: {site.adapter.training_replay}; use --routing-replay off")


def record_slots(model: PreTrainedModel, record_layers: tuple[int, ...] | None) -> list[int]:
    """Positions on the routes' layer axis of the MoE layers the per-token tables keep."""
    moe_layers = [s.layer for s in find_routers(model)]
    wanted = record_layers or tuple(moe_layers)
    unknown = sorted(set(wanted) - set(moe_layers))
    if unknown:
        raise ConfigError(f"record_layers {unknown} are not MoE layers of this model; valid: {moe_layers}")
    return [moe_layers.index(layer) for layer in sorted(set(wanted))]


def model_info(model: PreTrainedModel, slots: list[int]) -> ModelInfo:
    """run.json ``model``: the policy's MoE layout and the layers at ``slots`` (:func:`record_slots`) it records."""
    sites = find_routers(model, verify=False)
    return ModelInfo(
        family=model.config.model_type,
        moe_layers=tuple(s.layer for s in sites),
        num_experts=sites[0].num_experts,
        top_k=sites[0].top_k,
        recorded_layers=tuple(sites[i].layer for i in slots),
    )


def step_settings(config: TrainConfig, max_new_tokens: int) -> StepSettings:
    """What each step of ``config`` runs with: the preset with its overrides, DAPO's shaping and sampling resolved
    (``max_new_tokens``: :func:`response_budget`). The probes' steps use it too, so they step as training does."""
    preset = config.resolved_preset()
    return StepSettings(
        preset=preset, replay=config.routing_replay,
        minibatches=config.minibatches, group_size=config.group_size, temperature=config.temperature,
        max_new_tokens=max_new_tokens, max_grad_norm=config.max_grad_norm,
        router_aux_loss_coef=config.router_aux_loss_coef,
        overlong_cache=config.overlong_cache_tokens(max_new_tokens),
        dynamic_sampling=config.dynamic_sampling if config.dynamic_sampling is not None else preset.dynamic_sampling,
        dynamic_sampling_rounds=config.dynamic_sampling_rounds, measure_switches=switched_on(config),
        replay_score_ratio=config.replay_score_ratio, route_integrity=config.route_integrity,
    )


def response_budget(config: TrainConfig, task: Task) -> int:
    """``max_new_tokens``, refused when it cannot hold the task's longest answer (the task would be unsolvable)."""
    needed = task.max_answer_chars + 1  # answer + EOS; the embedded tokenizer has one token per character
    if config.max_new_tokens is None:
        return needed
    if is_embedded(config.model) and config.max_new_tokens < needed:
        raise ConfigError(f"max_new_tokens={config.max_new_tokens} cannot hold the task's longest answer plus the "
                          f"end-of-sequence token ({needed} tokens), so no response could be right; use >= {needed} "
                          "or leave it unset")
    return config.max_new_tokens
