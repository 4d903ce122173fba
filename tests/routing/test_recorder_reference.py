"""RoutingRecorder against a plain reference recording, bit for bit, on tiny models built in code.

For speed the recorder keeps references in its hooks, stacks each forward's layers in one operation, and marks
padding once per segment (``moestab.routing.frames``). The reference below records the straightforward way: plain
forward hooks keep every router output, then each forward's fields follow the recipe as written (each layer viewed
as ``[batch, seq, ...]`` and its rows picked, layers stacked, statistics over the stack, padding marked in that
forward), and the forwards of a segment are concatenated. Every field must match bit for bit: float fields are
compared as integers, so NaN positions and signed zeros count. Both run on the same forwards (one context inside
the other), so sampling in ``generate()`` cannot make them differ.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from moestab.models import build_embedded_policy
from moestab.routing import Routes, RoutingRecorder, find_routers
from moestab.routing.adapters import adapter_for
from moestab.routing.forward_call import read_forward_call
from tests.support.routing import batch, make_model

FLOATS = ("margin", "entropy", "confidence", "router_logprobs", "slot_scores", "gates")
EVERYTHING = {"margin": True, "entropy": True, "router_logprobs": True, "slot_scores": True, "gates": True}


class ReferenceRecording:
    """Every router output of every top-level forward of ``model``, kept by plain hooks."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.sites = model, find_routers(model)
        self.forwards: list[dict[str, Any]] = []  # {"call": ForwardCall, "outputs": {layer ordinal: (args, output)}}
        self._open = False

    def __enter__(self) -> ReferenceRecording:
        def begin(module, args, kwargs):
            self.forwards.append({"call": read_forward_call(args, kwargs), "outputs": {}})
            self._open = True

        def end(module, args, output):
            self._open = False

        def keep(ordinal):
            def hook(module, args, output):
                if self._open:
                    self.forwards[-1]["outputs"][ordinal] = (args, output)
            return hook

        self.handles = [self.model.register_forward_pre_hook(begin, with_kwargs=True),
                        self.model.register_forward_hook(end)]
        self.handles += [s.module.register_forward_hook(keep(i)) for i, s in enumerate(self.sites)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()

    def routes(self, **options: Any) -> Routes:
        segments = self.segments(**options)
        return segments[0] if len(segments) == 1 else Routes.cat(segments)

    def segments(self, sequence_fraction: float = 1.0, seed: int = 0, **fields: bool) -> list[Routes]:
        """A new segment unless the forward continues a KV cache over the same batch (a decode step)."""
        segments: list[dict[str, Any]] = []
        for forward in self.forwards:
            call = forward["call"]
            if not (call.continuation and segments and segments[-1]["batch"] == call.batch):
                rows = None
                if sequence_fraction < 1.0:
                    keep = max(1, round(sequence_fraction * call.batch))
                    generator = torch.Generator().manual_seed(seed + len(segments))
                    rows = torch.randperm(call.batch, generator=generator)[:keep].sort().values
                offset = sum(s["batch"] for s in segments)
                segments.append({"batch": call.batch, "rows": rows, "offset": offset, "parts": []})
            segments[-1]["parts"].append(self._fields(forward, segments[-1]["rows"], **fields))
        stitched = []
        for segment in segments:
            parts = segment["parts"]
            joined = {name: None if parts[0][name] is None else torch.cat([p[name] for p in parts], dim=1)
                      for name in ("indices", *FLOATS)}
            rows = None if segment["rows"] is None else segment["rows"] + segment["offset"]
            stitched.append(Routes(layers=tuple(s.layer for s in self.sites), num_experts=self.sites[0].num_experts,
                                   rows=rows, **joined))
        return stitched

    def _fields(self, forward: dict[str, Any], rows: torch.Tensor | None, margin: bool = True, entropy: bool = True,
                router_logprobs: bool = False, slot_scores: bool = False, gates: bool = False) -> dict[str, Any]:
        """One forward's fields, each layer on its own and then stacked, padding marked (HEAD's recipe)."""
        call, k = forward["call"], self.sites[0].top_k

        def per_layer(t: torch.Tensor) -> torch.Tensor:
            t = t.view(call.batch, call.seq, -1)  # [batch, seq, d]
            return t if rows is None else t[rows]

        read = [s.adapter.read(forward["outputs"][i][1], k) for i, s in enumerate(self.sites)]

        def scores(i: int) -> torch.Tensor:  # [N, E] what layer i's family ranked
            site, (logits, _, _) = self.sites[i], read[i]
            return site.adapter.selection_scores(site.module, logits.detach(), forward["outputs"][i][0])

        indices = torch.stack([per_layer(c) for _, _, c in read], dim=2).to(torch.int16)  # [kept, seq, L, k]
        pad = None
        if call.attention_mask is not None:
            pad = ~(call.attention_mask if rows is None else call.attention_mask[rows])  # [kept, seq]
            indices = indices.masked_fill(pad[:, :, None, None], -1)
        out: dict[str, Any] = dict.fromkeys(FLOATS)
        out["indices"] = indices
        with torch.no_grad():
            logits = torch.stack([per_layer(x.detach()) for x, _, _ in read], dim=2).float()  # [kept, seq, L, E]
            if margin:
                ranked = torch.stack([per_layer(scores(i)) for i in range(len(read))], dim=2)  # [kept, seq, L, E]
                if k >= ranked.shape[-1]:
                    out["margin"] = ranked.new_full(ranked.shape[:-1], float("nan"), dtype=torch.float)
                else:
                    top = ranked.float().topk(k + 1, dim=-1).values  # [kept, seq, L, k+1]
                    out["margin"] = top[..., k - 1] - top[..., k]
            logp = torch.log_softmax(logits, dim=-1)  # [kept, seq, L, E]
            if entropy:
                probs = logp.exp()
                out["entropy"] = -(probs * logp).sum(-1)
                out["confidence"] = probs.gather(-1, indices.long().clamp_min(0)).sum(-1)
            if router_logprobs:
                out["router_logprobs"] = logp
            if slot_scores:
                out["slot_scores"] = torch.stack([per_layer(scores(i).gather(-1, c).float())
                                                  for i, (_, _, c) in enumerate(read)], dim=2)  # [kept, seq, L, k]
            if gates:
                out["gates"] = torch.stack([per_layer(w.detach().float()) for _, w, _ in read], dim=2)
        if pad is not None:
            for name in FLOATS:
                if out[name] is not None:
                    out[name] = out[name].masked_fill(pad.view(*pad.shape, *[1] * (out[name].dim() - 2)), float("nan"))
        return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}.get(t.dtype, t.dtype))


def assert_same(got: Routes | list[Routes], want: Routes | list[Routes]) -> None:
    if isinstance(got, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
        return
    assert (got.layers, got.num_experts) == (want.layers, want.num_experts)
    for name in ("indices", *FLOATS, "rows"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert (a.dtype, a.shape) == (b.dtype, b.shape), name
            assert torch.equal(bits(a), bits(b)), f"{name} differs from the reference"


def recorded_both(model: nn.Module, run, **options) -> tuple[RoutingRecorder, ReferenceRecording]:
    with RoutingRecorder(model, **options) as recorder, ReferenceRecording(model) as reference:
        run()
    return recorder, reference


@pytest.mark.parametrize("family,dtype", [("qwen3_moe", torch.float32), ("qwen3_moe", torch.bfloat16),
                                          ("deepseek_v3", torch.float32), ("gpt_oss", torch.float64),
                                          ("minimax_m2", torch.float32), ("llama4_text", torch.float32)])
@pytest.mark.parametrize("padding", ["left", "right", "none"])
def test_every_field_equals_the_reference_over_two_forwards(family, dtype, padding):
    model = make_model(family, dtype=dtype)
    ids, mask = batch(padding=padding)

    def run():
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
            model(input_ids=ids[:2, :7], attention_mask=mask[:2, :7])  # a second segment, shorter: Routes.cat

    recorder, reference = recorded_both(model, run, **EVERYTHING)
    assert_same(recorder.routes, reference.routes(**EVERYTHING))
    assert_same(recorder.segments, reference.segments(**EVERYTHING))
    assert len(recorder.segments) == 2
    if padding != "none":  # the reference marks padding: guard against a batch with none to mark
        assert bool((recorder.routes.indices == -1).any()) and bool(recorder.routes.entropy.isnan().any())


@pytest.mark.parametrize("options", [{}, {"margin": False, "entropy": False}, {"gates": True, "entropy": False},
                                     {"slot_scores": True, "margin": False}, {"router_logprobs": True}],
                         ids=["default", "routes-only", "gates", "slot-scores", "logprobs"])
@pytest.mark.families("deepseek_v3")
def test_each_combination_of_fields_equals_the_reference(options):
    model = make_model("deepseek_v3", dtype=torch.float32)  # selection scores are not the logits: both are kept
    ids, mask = batch()
    recorder, reference = recorded_both(model, lambda: model(input_ids=ids, attention_mask=mask), **options)
    assert_same(recorder.routes, reference.routes(**options))  # a forward with grad: logits are detached


def test_a_selection_bias_with_grad_equals_the_reference():
    model = make_model("minimax_m2", dtype=torch.float32)  # the MoE block passes its bias to the router's forward
    for layer in model.model.layers:
        bias = layer.mlp.e_score_correction_bias
        del layer.mlp.e_score_correction_bias
        layer.mlp.e_score_correction_bias = nn.Parameter(torch.randn_like(bias) * 0.01)  # trainable: scores get a graph
    ids, mask = batch()
    options = {"slot_scores": True, **EVERYTHING}

    def run():
        model(input_ids=ids, attention_mask=mask).logits.sum().backward()

    recorder, reference = recorded_both(model, run, **options)
    assert_same(recorder.routes, reference.routes(**options))
    assert recorder.routes.margin.grad_fn is None and recorder.routes.slot_scores.grad_fn is None


def test_without_attention_mask_equals_the_reference():
    model = make_model("mixtral", dtype=torch.float32)
    ids, _ = batch()
    recorder, reference = recorded_both(model, lambda: model(input_ids=ids), **EVERYTHING)
    assert_same(recorder.routes, reference.routes(**EVERYTHING))


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_generate_equals_the_reference(fraction):
    model, tokenizer = build_embedded_policy()
    model.eval()
    enc = tokenizer(["12+34=", "5+6=", "100-7=", "9-8="], return_tensors="pt", padding=True)  # left-padded
    options = {"sequence_fraction": fraction, "seed": 5, **EVERYTHING}

    def run():
        torch.manual_seed(0)
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=True)  # prefill + 5 decode steps
            model.generate(**enc, max_new_tokens=3, min_new_tokens=3, do_sample=True)

    recorder, reference = recorded_both(model, run, **options)
    assert len(reference.forwards) == 6 + 3  # two prefills, 5 + 2 decode steps
    kept = int(4 * fraction)
    assert [(r.batch_size, r.seq_len) for r in recorder.segments] == [(kept, 6 + 5), (kept, 6 + 2)]
    assert_same(recorder.segments, reference.segments(**options))
    assert_same(recorder.routes, reference.routes(**options))


def test_routes_read_between_forwards_are_rebuilt():
    model, tokenizer = build_embedded_policy()
    model.eval()
    enc = tokenizer(["12+34=", "5+6="], return_tensors="pt", padding=True)  # left-padded
    step = torch.tensor([[5], [6]])
    keyword = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    with RoutingRecorder(model) as recorder, ReferenceRecording(model) as reference, torch.no_grad():
        cache = DynamicCache()
        model(**enc, use_cache=True, **{keyword: cache})
        prefill = recorder.routes
        mask = torch.cat([enc.attention_mask, torch.ones_like(step)], dim=1)
        model(input_ids=step, attention_mask=mask, use_cache=True, **{keyword: cache})  # a decode step: same segment
        decoded = recorder.routes
        model(**enc)  # a new segment
    assert prefill.seq_len == enc.input_ids.shape[1] and decoded.seq_len == prefill.seq_len + 1
    assert recorder.routes.batch_size == 4
    assert_same(recorder.routes, reference.routes())
    assert_same(decoded, reference.segments()[0])


def test_a_router_class_derived_from_a_family_gets_that_familys_adapter():
    model = make_model("qwen3_moe")
    router = find_routers(model)[0].module
    derived = type("DerivedRouter", (type(router),), {})(model.config)  # e.g. a wrapper subclass made by a library
    assert adapter_for(derived) is adapter_for(router) is not None
    assert adapter_for(nn.Linear(2, 2)) is None
