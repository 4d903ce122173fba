"""Routing's share of the ratio inside TRL's GRPOTrainer (``RecordSettings(routing_share=True)``), on CPU.

The extra forward must change nothing TRL or moestab computes (weights, TRL's logs, every other metric, the token
tables), and its log-probs must be those of an independent computation: the update's weights, snapshotted when TRL
called ``compute_loss``, scoring the micro-batch with the experts that pi_old's weights chose for it forced by
``RoutingReplay``, and the log-softmax of the plain HF logits (not TRL's fused head).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # TRL's own dependency
from transformers import AutoModelForCausalLM

from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
from moestab.integrations.trl import trainer as trl_trainer
from moestab.metrics import keys
from moestab.metrics.routing_share import routing_share
from moestab.models import EmbeddedModelSpec, build_char_tokenizer, build_embedded_policy, tiny_config
from moestab.recording.trackers import PREFIX
from moestab.routing import RoutingRecorder, RoutingReplay
from moestab.run_folder import schema
from moestab.run_folder.reader import list_token_files
from tests.support.trl import LAYERS, PROMPTS, grpo_args, match_rows, moestab_hooks, reward

SPEC = EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64)
NEW = "routing_share/"
TOL = 1e-5
"""float32 log-probs of the same forward through TRL's fused LM head and through HF's logits in another batch: at
most 4.8e-7 apart here. Routing freely instead moves them by 3e-2 to 7e-2 (the guard below checks it would show)."""


class Spy(MoestabGRPOTrainer):
    """Keeps each micro-batch and the weights TRL's loss forward ran on (read only: TRL's training is unchanged)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        names = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
        self.seen.append(({k: inputs[k].detach().clone() for k in names},
                          {k: v.detach().clone() for k, v in model.state_dict().items()}))
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


def _train(root, *, routing_share: bool, dropout: float = 0.0, **overrides):
    """One TRL run of ``grpo_args``; returns the trainer, its run folder, its lines and each step's ``StepTensors``.
    ``dropout``: attention dropout in training mode, so every training forward draws random numbers."""
    model, tokenizer = build_embedded_policy(SPEC)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = dropout
    steps = []
    real_assemble = trl_trainer.assemble

    def keep(*args, **kwargs):
        steps.append(real_assemble(*args, **kwargs))
        return steps[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trl_trainer, "assemble", keep)
        trainer = Spy(model=model, processing_class=tokenizer, reward_funcs=reward,
                      train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=grpo_args(root / "trl", **overrides),
                      moestab=RecordSettings(root / "run", routing_share=routing_share))
        trainer.seen = []
        trainer.train()
    run = root / "run"
    lines = [json.loads(x) for x in (run / schema.METRICS_JSONL).read_text().splitlines()]
    return SimpleNamespace(trainer=trainer, dir=run, lines=lines, steps=steps)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same GRPO run (2 optimizer steps per generation batch: TRL computes pi_old) without and with the option."""
    return {on: _train(tmp_path_factory.mktemp(f"share-{on}"), routing_share=on) for on in (False, True)}


def _others(line: dict) -> dict:
    return {k: v for k, v in line.items() if not k.startswith((NEW, "time/"))}


def _trl_logs(trainer) -> list[dict]:
    """TRL's own log lines without its clocks and moestab's numbers (``moestab/*``, the metrics lines')."""
    return [{k: v for k, v in h.items() if not any(w in k for w in ("time", "runtime", "per_second"))
             and not k.startswith(PREFIX)} for h in trainer.state.log_history]


def test_the_option_changes_nothing_else_bit_for_bit(runs):
    off, on = runs[False], runs[True]
    for (name, p_on), p_off in zip(on.trainer.model.named_parameters(), off.trainer.model.parameters(), strict=True):
        assert torch.equal(p_on, p_off), name
    assert _trl_logs(on.trainer) == _trl_logs(off.trainer)  # TRL's loss, grad norm, clip ratios, rewards
    assert len(on.lines) == 3 and not any(k.startswith(NEW) for line in off.lines for k in line)
    assert json.dumps([_others(x) for x in on.lines]) == json.dumps([_others(x) for x in off.lines])  # NaNs too
    tables = {o: [p.read_bytes() for p in list_token_files(r.dir).path] for o, r in runs.items()}
    assert len(tables[True]) == 3 and tables[True] == tables[False]
    for t_on, t_off in zip(on.steps, off.steps, strict=True):
        for field in ("logp_old", "logp_update", "logp_new", "clipped", "routes_old", "routes_update", "minibatch"):
            assert torch.equal(getattr(t_on, field), getattr(t_off, field)), field
        assert t_off.logp_update_counterfactual is None and t_off.clipped_counterfactual is None
    assert moestab_hooks(on.trainer.model) == 0  # the replay's hooks are gone too


def test_the_extra_forward_leaves_trls_random_draws_as_they_were(tmp_path):
    """With dropout every training forward draws random numbers: had the extra forward kept its draws, the next
    micro-step's dropout masks, hence its gradient and the weights, would differ."""
    off, on = (_train(tmp_path / str(o), routing_share=o, dropout=0.2, max_steps=2) for o in (False, True))
    assert on.steps[0].logp_update_counterfactual is not None
    assert _trl_logs(on.trainer) == _trl_logs(off.trainer)
    for (name, p_on), p_off in zip(on.trainer.model.named_parameters(), off.trainer.model.parameters(), strict=True):
        assert torch.equal(p_on, p_off), name


def test_each_line_holds_the_key_tables_keys_with_the_routing_share(runs):
    for line in runs[True].lines:
        assert list(line) == keys.written_keys(keys.TRL | {keys.ROUTING_SHARE})
    config = json.loads((runs[True].dir / schema.RUN_JSON).read_text())["config"]
    assert config["routing_share"] is True


def _independent(inputs: dict, old_state: dict, update_state: dict, temperature: float) -> torch.Tensor:
    """``[b, C]`` the micro-batch's completion log-probs under ``update_state`` with the experts ``old_state``
    chooses for it forced: two plain HF forwards, no moestab trainer code."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)  # [b, P + C]
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)  # [b, P + C]
    old, update = build_embedded_policy(SPEC)[0].eval(), build_embedded_policy(SPEC)[0].eval()
    old.load_state_dict(old_state)
    update.load_state_dict(update_state)
    with torch.no_grad():
        with RoutingRecorder(old) as rec:
            old(input_ids=ids, attention_mask=mask)
        with RoutingReplay(update, rec.routes):
            logits = update(input_ids=ids, attention_mask=mask).logits.float()  # [b, P + C, V]
    prompt_len = inputs["prompt_ids"].shape[1]
    logp = torch.log_softmax(logits[:, prompt_len - 1 : -1] / temperature, -1)  # [b, C, V]
    return logp.gather(-1, inputs["completion_ids"][..., None])[..., 0]  # [b, C]


def test_the_replayed_side_is_an_independent_forward_with_pi_olds_experts(runs):
    on = runs[True]
    micro = on.trainer.args.steps_per_generation  # micro-steps per cycle (one pass)
    replay_mattered = 0.0
    for cycle, t in enumerate(on.steps):
        seen = on.trainer.seen[cycle * micro : (cycle + 1) * micro]
        old_state = seen[0][1]  # the cycle's first loss forward runs on pi_old's weights
        expected = torch.full_like(t.logp_old, float("nan"))  # [N, C]
        for inputs, state in seen:
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)[:, : t.batch.input_ids.shape[1]]
            (rows,) = match_rows(t.batch.input_ids, [ids])
            expected[rows] = _independent(inputs, old_state, state, float(on.trainer.args.temperature))
        mask = t.batch.response_mask  # [N, C]
        assert expected[mask].isfinite().all()  # every sequence of the cycle was trained on once
        diff = (t.logp_update_counterfactual - expected)[mask].abs()
        assert diff.max() < TOL, (cycle, diff.max())
        replay_mattered = max(replay_mattered, (t.logp_update - expected)[mask].abs().max().item())
        # and the step's keys are the metric owner's on these numbers
        free = (t.logp_update - t.logp_old)[mask].double().numpy()
        replayed = (expected - t.logp_old)[mask].double().numpy()
        flags = t.clipped[mask].numpy()
        stats = routing_share(free, replayed, flags, t.clipped_counterfactual[mask].numpy())
        line = on.lines[cycle]
        assert line[keys.ROUTING_SHARE_LOG_VAR_REPLAYED] == pytest.approx(stats["log_var_replayed"], rel=1e-3)
        assert line[keys.ROUTING_SHARE_ABS_REPLAYED] == pytest.approx(stats["abs_log_w_replayed"], rel=1e-3)
        assert line[keys.ROUTING_SHARE_LOG_VAR_FREE] == line[keys.RATIO_TOKEN_LOG_VAR] > 0  # the logged ratio
        assert line[keys.ROUTING_SHARE_CLIP_FREE] == line[keys.CLIP_TOKEN_FRAC]
    # Routes moved between pi_old and the second update, so forcing pi_old's changed log-probs by far more than TOL:
    # a counterfactual that routed freely (or replayed the wrong rows) would fail the comparison above.
    assert replay_mattered > 100 * TOL
    assert any(line[keys.ROUTING_SHARE_BY_MINIBATCH.format(stat="var_share")][1] != 0 for line in on.lines)


def test_without_trls_pi_old_the_replayed_side_is_the_update_itself(tmp_path):
    """One optimizer step per generation batch: TRL's pi_old is its loss forward, whose own routes replaying would
    reproduce it; no extra forward runs and both sides are the update's (log w = 0 exactly)."""
    run = _train(tmp_path, routing_share=True, gradient_accumulation_steps=2, max_steps=2)
    assert len(run.lines) == 2
    for line, t in zip(run.lines, run.steps, strict=True):
        assert torch.equal(t.logp_update_counterfactual, t.logp_update)
        assert line[keys.ROUTING_SHARE_VAR] == 0.0 and line[keys.ROUTING_SHARE_LOG_VAR_REPLAYED] == 0.0


@pytest.mark.families("phimoe")
def test_a_family_that_cannot_replay_in_training_mode_is_refused(tmp_path):
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("phimoe", vocab_size=len(tokenizer), num_moe_layers=2))
    with pytest.raises(ValueError, match="routing_share replays pi_old's routes in training mode, which phimoe"):
        MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                           train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=grpo_args(tmp_path / "trl"),
                           moestab=RecordSettings(tmp_path / "run", routing_share=True))
    assert not (tmp_path / "run").exists()  # refused before anything is written
