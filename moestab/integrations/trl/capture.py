"""What the policy's forwards inside one TRL training step computed: routes, inputs, log-probs.

TRL's ``GRPOTrainer`` runs three kinds of top-level forward of the policy, told apart by their arguments:

- ``generate()`` calls (a KV cache is passed): the prefill and its KV-cached decode steps, the
  rollout. The tokens fed to the decode steps are the sampled ones, so each step's sampling distribution is scored
  at the next step's input; the last sampled token is never fed, so its distribution is kept until it is known.
- scoring calls (``fused_lm_head=True``, TRL's fused LM head): ``outputs.log_probs[:, p]`` is the log-prob of token
  ``p + 1`` at temperature ``T``. pi_old (without grad) and the loss forward (with grad) are scoring calls.
- anything else (e.g. a reward function running the policy) is recorded only to keep the routes aligned.

:class:`ForwardCapture` records them with a ``RoutingRecorder`` (routes of every forward, one segment per call, a
generation's decode steps stitched onto its prefill) and two hooks of its own, all removed on exit.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from moestab.routing import RecordingError, Routes, RoutingRecorder
from moestab.routing.forward_call import read_forward_call


@dataclass(frozen=True)
class ScoringCall:
    """One ``model(input_ids=..., attention_mask=..., labels=..., fused_lm_head=True)`` call of TRL's."""

    kwargs: dict[str, Any]
    """The call's keyword arguments, TRL's own tensors (not copies): pi_new replays them in the same chunks."""
    grad: bool
    """Autograd was on (TRL's loss forward); pi_old and the reference run without it."""
    log_probs: torch.Tensor  # [b, L - 1] log-prob of token p + 1 at input position p (0 where unlabelled)
    entropy: torch.Tensor | None  # [b, L - 1] entropy of the distribution at input position p
    routes: Routes  # [b, L, layers, k]

    @property
    def input_ids(self) -> torch.Tensor:
        return self.kwargs["input_ids"]  # [b, L]


@dataclass(frozen=True)
class GenerationCall:
    """One ``model.generate()``: its prompts, the tokens it fed back, their log-probs and routes."""

    prompt_ids: torch.Tensor  # [N, P] left-padded prompts
    prompt_mask: torch.Tensor  # [N, P]
    fed: torch.Tensor  # [N, S] sampled tokens fed to the decode steps (every sampled token but the last)
    fed_logp: torch.Tensor  # [N, S] float32 log-prob of each fed token under the step that sampled it
    last_logp: torch.Tensor  # [N, V] float32 log-softmax of the last step: its sampled token is never fed
    routes: Routes  # [N, P + S, layers, k]


@dataclass(frozen=True)
class Captured:
    """Every forward of one training step, in call order within each kind."""

    generations: list[GenerationCall]
    scoring: list[ScoringCall]


@dataclass
class _Generation:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    fed: list[torch.Tensor] = field(default_factory=list)  # per step [N]
    fed_logp: list[torch.Tensor] = field(default_factory=list)  # per step [N]
    dist: torch.Tensor | None = None  # [N, V] the latest step's log-softmax


@dataclass
class _Segment:
    """One recorder segment: a generation (prefill + decode steps) or a single other call."""

    kind: str  # "generate" | "score" | "other"
    batch: int
    generation: _Generation | None = None
    kwargs: dict[str, Any] | None = None
    grad: bool = False
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


class ForwardCapture:
    """Context manager recording every top-level forward of ``model`` (see the module docstring).

    ``recorder`` is entered and exited with the capture, so its routes are exactly those of the captured calls.
    ``temperature`` is the sampling temperature: a generation step's distribution is ``softmax(logits / T)``.
    """

    def __init__(self, model: nn.Module, recorder: RoutingRecorder, *, temperature: float) -> None:
        if recorder.model is not model:
            raise ValueError("the recorder must record the captured model")
        self.model, self.recorder, self.temperature = model, recorder, temperature
        self._stack: ExitStack | None = None
        self._segments: list[_Segment] = []

    def __enter__(self) -> ForwardCapture:
        self._segments = []
        with ExitStack() as stack:
            stack.enter_context(self.recorder)  # its pre-hook runs before ours, its forward hook before ours too
            stack.callback(self.model.register_forward_pre_hook(self._before, with_kwargs=True).remove)
            stack.callback(self.model.register_forward_hook(self._after, with_kwargs=True).remove)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    # ---- hooks ---------------------------------------------------------------------------------
    def _before(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = read_forward_call(args, kwargs)
        last = self._segments[-1] if self._segments else None
        continues = call.continuation and last is not None and last.batch == call.batch  # the recorder's rule
        if call.cached:
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]  # [N, s]
            if continues:
                if last.kind != "generate":
                    raise RecordingError("a KV-cached decode step continued a forward that was not a generation")
                self._feed(last.generation, ids[:, -1])
                return
            mask = kwargs.get("attention_mask")
            mask = torch.ones_like(ids) if mask is None else mask[:, -ids.shape[1] :]
            self._segments.append(_Segment("generate", call.batch, generation=_Generation(ids, mask)))
            return
        if continues:
            raise RecordingError("a cached forward continued outside generate(); moestab cannot align its routes")
        kind = "score" if kwargs.get("fused_lm_head") else "other"
        self._segments.append(_Segment(kind, call.batch, kwargs=dict(kwargs), grad=torch.is_grad_enabled()))

    def _feed(self, gen: _Generation, token: torch.Tensor) -> None:
        """The step before sampled ``token`` ``[N]``: keep its log-prob."""
        if gen.dist is None:
            raise RecordingError("a decode step ran before its prefill returned")
        gen.fed.append(token)
        gen.fed_logp.append(gen.dist.gather(-1, token[:, None].to(gen.dist.device))[:, 0])  # [N]

    def _after(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        segment = self._segments[-1]
        if segment.kind == "generate":
            logits = output.logits[:, -1].detach().float()  # [N, V] raw logits of the last position
            segment.generation.dist = torch.log_softmax(logits / self.temperature, dim=-1)  # [N, V]
        elif segment.kind == "score":
            log_probs = getattr(output, "log_probs", None)
            if log_probs is None:
                raise RecordingError(
                    "a fused_lm_head forward returned no log_probs: moestab.integrations.trl reads TRL's fused LM "
                    "head (trl >= 1.16); this TRL scores differently"
                )
            entropy = getattr(output, "entropy", None)
            segment.log_probs = log_probs.detach()  # [b, L - 1]
            segment.entropy = None if entropy is None else entropy.detach()  # [b, L - 1]

    # ---- result --------------------------------------------------------------------------------
    def captured(self) -> Captured:
        """The calls recorded inside the context (read it after exit)."""
        routes = self.recorder.segments  # one per captured segment, by the same rule
        if len(routes) != len(self._segments):
            raise RecordingError(f"{len(self._segments)} forwards were captured but the recorder has {len(routes)}")
        generations, scoring = [], []
        for seg, r in zip(self._segments, routes, strict=True):
            if seg.kind == "generate":
                gen = seg.generation
                if gen.dist is None:
                    raise RecordingError("a generation step did not return")
                n = gen.prompt_ids.shape[0]
                fed = torch.stack(gen.fed, 1) if gen.fed else gen.prompt_ids.new_zeros(n, 0)  # [N, S]
                fed_logp = torch.stack(gen.fed_logp, 1) if gen.fed_logp else gen.dist.new_zeros(n, 0)  # [N, S]
                generations.append(GenerationCall(gen.prompt_ids, gen.prompt_mask, fed, fed_logp, gen.dist, r))
            elif seg.kind == "score":
                if seg.log_probs is None:
                    raise RecordingError("a scoring forward did not return")
                scoring.append(ScoringCall(seg.kwargs, seg.grad, seg.log_probs, seg.entropy, r))
        return Captured(generations, scoring)
