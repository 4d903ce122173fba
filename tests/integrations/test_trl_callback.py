"""TRL's GRPOTrainer with moestab's records (``moestab.integrations.trl``) on a tiny MoE built in code, on CPU.

The run folders are checked as ``moestab train``'s are; their numbers are recomputed from the raw token tables with
Python sets, and their clip flags against TRL's own logged clip ratio, which TRL computes from its advantages.
"""

from __future__ import annotations

import ast
import gc
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # TRL's own dependency
from transformers import AutoModelForCausalLM

from moestab.cli import main as cli_main
from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
from moestab.integrations.trl.capture import ForwardCapture
from moestab.integrations.trl.settings import check_supported, cycle_layout
from moestab.integrations.trl.stillness import NO_ROUTE_CHANGED, UNCHANGED, Stillness, stillness
from moestab.metrics import keys
from moestab.models import EmbeddedModelSpec, build_char_tokenizer, build_embedded_policy, tiny_config
from moestab.models.embedded import save_policy
from moestab.recording.measure_budget import MeasureBudget
from moestab.recording.step_records import write_step_tokens
from moestab.recording.trackers import PREFIX, scalars
from moestab.routing import RecordingError, RoutingRecorder
from moestab.run_folder import schema
from moestab.run_folder.reader import list_token_files, load_metrics, read_routes, read_run_info
from tests.support.tables import TOKEN_COLUMNS, token_frame
from tests.support.trl import (
    LAYERS,
    PROMPTS,
    TOP_K,
    grpo_args,
    match_rows,
    moestab_hooks,
    readme_blocks,
    reward,
    run_snippet,
)

ROOT = Path(__file__).resolve().parents[2]
ROUTE_METRICS = ["routing/old_new/changed", "routing/old_new/router_flip", "routing/old_new/token_flip",
                 "routing/old_new/changed_by_layer", "routing/update_old/changed_by_minibatch",
                 "routing/rollout_old_free/router_flip", "mismatch/rollout_old_free/k3", "ratio/token_log_var",
                 "clip/token_frac", "clip/seq_frac_later", "experts/load", "experts/load_entropy",
                 "experts/routing_confidence", "entropy", "minibatches", "response/length_mean", "time/step_s"]


def readme_configs() -> dict[str, dict[str, object]]:
    """The keyword arguments of each ``name = GRPOConfig(...)`` of the section's second block, as written (the block
    itself needs a GPU for GRPOConfig's default bf16)."""
    tree = ast.parse(readme_blocks()[1])
    return {node.targets[0].id: {kw.arg: ast.literal_eval(kw.value) for kw in node.value.keywords}
            for node in tree.body if isinstance(node, ast.Assign)}


def train_with_records(root: Path, **overrides: object) -> tuple[Path, object]:
    """README's snippet on the embedded policy (2 layers); returns the run folder and the trainer."""
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    return root / "run", run_snippet(root, model, tokenizer, **overrides)


@pytest.fixture(scope="module", params=["token", "sequence"])
def recorded(request, tmp_path_factory):
    """GRPO (token) and GSPO (sequence): 2 optimizer steps per generation batch, so TRL computes pi_old."""
    run_dir, trainer = train_with_records(tmp_path_factory.mktemp(request.param),
                                          importance_sampling_level=request.param)
    tokens = pd.concat(token_frame(p) for p in list_token_files(run_dir).path)
    return SimpleNamespace(level=request.param, dir=run_dir, trainer=trainer, tokens=tokens,
                           metrics=[json.loads(x) for x in (run_dir / schema.METRICS_JSONL).read_text().splitlines()])


def sets_changed(a_rows: pd.Series, b_rows: pd.Series, top_k: int = TOP_K) -> float:
    """1 - mean |E_a ∩ E_b| / k over every (token, layer), with Python sets."""
    overlaps = [len(set(a[i : i + top_k]) & set(b[i : i + top_k])) / top_k
                for a, b in zip(a_rows, b_rows, strict=True) for i in range(0, len(a), top_k)]
    return 1 - sum(overlaps) / len(overlaps)


def test_the_run_folder_passes_the_checks_of_a_moestab_run(recorded, capsys):
    info = read_run_info(recorded.dir)
    assert info.status == "finished" and info.last_step == 3 and info.planned_steps == 3
    name = {"token": "grpo", "sequence": "gspo"}[recorded.level]
    assert info.algo == f"{name} (trl-grpo-{recorded.level})" and info.replay_label == "off"
    assert info.warnings == ()  # lr 1e-2 moves routes every step: nothing to warn about
    # No checkpoints/ or state/ (TRL saves its own checkpoints), and the lock is gone
    assert sorted(p.name for p in recorded.dir.iterdir()) == sorted(
        [schema.RUN_JSON, schema.CONFIG_YAML, schema.METRICS_JSONL, schema.TOKENS_DIR])
    assert info.model.family == "qwen3_moe" and info.model.moe_layers == (0, 1) and info.top_k == TOP_K
    assert list(load_metrics(recorded.dir).step) == [1, 2, 3]
    for m in recorded.metrics:
        assert not [k for k in ROUTE_METRICS if k not in m]
        assert m["minibatches"] == 2 and len(m["routing/old_new/changed_by_layer"]) == LAYERS
        assert np.allclose([sum(row) for row in m["experts/load"]], 1.0, atol=1e-4)
    for path in list_token_files(recorded.dir).path:
        table = pq.read_table(path)
        assert table.column_names == TOKEN_COLUMNS and table.num_rows > 0
        routes = read_routes(path, schema.COL_ROUTES_OLD, TOP_K)  # [tokens, layers, top_k]
        assert routes.min() >= 0 and routes.max() < 8  # every response token routed, in every layer
    assert recorded.tokens.groupby("step").seq.nunique().eq(16).all()  # every sequence of each generation batch
    assert cli_main(["analyze", str(recorded.dir), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "finished" and row["steps"] == 3
    assert row["old_new_changed"] == pytest.approx(np.mean([m["routing/old_new/changed"] for m in recorded.metrics]))


DASHBOARD_PAGES = ["app_pages/runs.py", "app_pages/training.py", "app_pages/volatility.py", "app_pages/ratios.py",
                   "app_pages/attribution.py", "app_pages/experts.py"]


@pytest.mark.parametrize("recorded", ["sequence"], indirect=True)  # one run is enough: the pages read the same
def test_each_line_holds_exactly_the_key_tables_keys_for_trl(recorded):
    # No reward/*, accuracy, loss or grad norm: TRL's micro-batches hold no rewards and TRL logs its own updates.
    for m in recorded.metrics:
        assert list(m) == keys.written_keys(keys.TRL)
    assert all(np.isnan(recorded.tokens[schema.COL_REWARD]))  # unknown, not made up


def test_the_dashboard_draws_every_page_of_a_trl_run(recorded, monkeypatch):
    pytest.importorskip("streamlit", reason="the dashboard extra is not installed (a trainer-only environment)")
    from streamlit.testing.v1 import AppTest

    app = ROOT / "moestab" / "dashboard" / "app.py"
    monkeypatch.setattr(sys, "argv", [str(app), str(recorded.dir.parent)])  # how the app is given its runs folder
    for page in DASHBOARD_PAGES:
        at = AppTest.from_file(str(app), default_timeout=120)
        at.run()
        if page != DASHBOARD_PAGES[0]:
            at.switch_page(page).run()
        problems = [str(e.value) for e in (*at.exception, *at.error, *at.warning)]
        assert not problems, (page, problems)
        assert page == DASHBOARD_PAGES[0] or len(at.get("vega_lite_chart")) > 0, page


def test_volatility_matches_an_independent_recomputation_from_the_routes(recorded):
    tokens = recorded.tokens
    for m in recorded.metrics:
        step = tokens[tokens.step == m["step"]]
        assert m["routing/old_new/changed"] == pytest.approx(sets_changed(step.routes_old_free, step.routes_new),
                                                             abs=1e-12)
        assert m["routing/rollout_old_free/changed"] == pytest.approx(
            sets_changed(step.routes_rollout, step.routes_old_free), abs=1e-12)
        by_layer = [sets_changed(step.routes_old_free.map(lambda r, i=i: r[i * TOP_K : (i + 1) * TOP_K]),
                                 step.routes_new.map(lambda r, i=i: r[i * TOP_K : (i + 1) * TOP_K]))
                    for i in range(LAYERS)]
        assert m["routing/old_new/changed_by_layer"] == pytest.approx(by_layer, abs=1e-12)
        by_minibatch = [sets_changed(part.routes_update, part.routes_old) for _, part in step.groupby("minibatch")]
        assert m["routing/update_old/changed_by_minibatch"] == pytest.approx(by_minibatch, abs=1e-12)
    # lr 1e-2 on a random tiny MoE: the updates move routes, so these checks are not all 0 == 0
    assert all(m["routing/old_new/changed"] > 0.01 for m in recorded.metrics)
    assert any(m["routing/update_old/changed_by_minibatch"][1] > 0 for m in recorded.metrics)


def test_the_rollout_is_aligned_with_the_trainer(recorded):
    tokens = recorded.tokens
    d = tokens.logp_old.to_numpy(np.float64) - tokens.logp_rollout.to_numpy(np.float64)
    # The same weights score the same tokens (KV-cached generate vs TRL's full forward): float-rounding apart.
    # A token or route off by one position would give differences of order 1 and flip most routers.
    assert np.mean(np.exp(d) - 1 - d) < 1e-9 and np.abs(d).max() < 1e-4
    assert sets_changed(tokens.routes_rollout, tokens.routes_old_free) < 0.01
    assert (tokens.response_length >= 1).all() and (tokens.position < tokens.response_length).all()


def test_clip_flags_match_trls_own_clip_ratio(recorded):
    """TRL logs, per optimizer step (= one micro-batch here), the share of its ratios that its clip cut, from
    its advantages: tokens at token level, sequences at sequence level. The token tables say the same."""
    logged = [h["clip_ratio/region_mean"] for h in recorded.trainer.state.log_history if "clip_ratio/region_mean" in h]
    ours = []
    for _, part in recorded.tokens.groupby(["step", "minibatch"]):  # = TRL's optimizer steps, in order
        clipped = part.clipped if recorded.level == "token" else part.groupby("seq").clipped.any()
        ours.append(float(clipped.mean()))
    assert ours == pytest.approx(logged, abs=1e-6)
    later = recorded.tokens[recorded.tokens.minibatch > 0].clipped
    assert 0 < later.mean() < 1  # both branches occur: the comparison can fail
    first = recorded.tokens[recorded.tokens.minibatch == 0]  # updated at pi_old's weights, by TRL's ratio ~ 1
    assert np.abs(first.log_w).max() < 1e-4


def test_each_step_reaches_trls_log_with_its_last_optimizer_step(recorded):
    """What TRL's report_to trackers receive (its on_log, recorded in log_history): each line of metrics.jsonl as
    moestab/<key> scalars, in the log of the generation batch's last optimizer step (2 per batch here), beside TRL's
    own numbers; the optimizer steps between carry none."""
    logs = [h for h in recorded.trainer.state.log_history if any(k.startswith(PREFIX) for k in h)]
    assert [h["step"] for h in logs] == [2, 4, 6]
    for h, line in zip(logs, recorded.metrics, strict=True):
        assert "loss" in h and "clip_ratio/region_mean" in h  # TRL's own numbers of that optimizer step, same log
        values = {k: v for k, v in h.items() if k.startswith(PREFIX)}
        assert values == scalars(line), h["step"]  # the line as written, read back from metrics.jsonl
        assert values[f"{PREFIX}routing/old_new/changed_by_layer/{LAYERS - 1}"] == line[
            "routing/old_new/changed_by_layer"][-1]
        assert f"{PREFIX}experts/load/max_vio_max" in values and not any("experts/load/0" in k for k in values)


@pytest.mark.parametrize(("accumulation", "bf16"), [(1, False), (2, False), (1, True)])
def test_without_an_update_pi_new_is_pi_old_bit_for_bit(tmp_path, caplog, accumulation, bf16):
    """lr 0: pi_new replays pi_old's exact inputs and chunks (under TRL's autocast: bf16 on a CPU too), so nothing
    differs. With 2 accumulation steps the generation batch feeds one optimizer step: TRL computes no pi_old, its
    ratio is 1 and so is the record. The run says, once, that its zeros come from a policy that did not change."""
    with caplog.at_level(logging.WARNING, logger="moestab"):
        run_dir, _ = train_with_records(tmp_path, learning_rate=0.0, gradient_accumulation_steps=accumulation,
                                        max_steps=4 // accumulation, bf16=bf16)
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("moestab")]
    (warning,) = read_run_info(run_dir).warnings  # two steps, both still: one warning
    assert warning.startswith("step 1: the policy did not change") and "learning_rate=0 " in warning
    assert warned == [f"moestab: {warning}"]
    tokens = pd.concat(token_frame(p) for p in list_token_files(run_dir).path)
    metrics = [json.loads(x) for x in (run_dir / schema.METRICS_JSONL).read_text().splitlines()]
    assert len(metrics) == 2 and all(m["routing/old_new/changed"] == 0.0 for m in metrics)
    assert (tokens.logp_new == tokens.logp_old).all()
    assert np.array_equal(np.stack(tokens.routes_new), np.stack(tokens.routes_old_free))
    if accumulation == 2:
        assert all(m["minibatches"] == 1 for m in metrics) and (tokens.log_w == 0.0).all()
        assert np.array_equal(np.stack(tokens.routes_update), np.stack(tokens.routes_old))


def test_stillness_tells_no_update_from_updates_too_small_to_move_a_route():
    """The cause of a 0 old->new change, on two sequences of two response tokens (the second not measured)."""
    old = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]])
    step = SimpleNamespace(batch=SimpleNamespace(response_mask=torch.tensor([[True, True], [True, False]])),
                           measured=torch.tensor([True, False]), logp_old_free=old)
    unmeasured_moved = torch.tensor([[-1.0, -2.0], [float("nan"), float("nan")]])  # only measured tokens count
    assert stillness(SimpleNamespace(**vars(step), logp_new=unmeasured_moved), 0.0).kind == UNCHANGED
    moved = torch.tensor([[-1.0, -2.0 + 2**-20], [float("nan"), float("nan")]])  # one bit of one token
    assert stillness(SimpleNamespace(**vars(step), logp_new=moved), 0.0) == Stillness(NO_ROUTE_CHANGED, 2**-20)
    assert stillness(SimpleNamespace(**vars(step), logp_new=moved), 0.01) is None  # a route changed: not still


README_ALGOS = [("gspo", {}, "gspo (trl-grpo-sequence)"), ("grpo", {}, "grpo (trl-grpo-token)"),
                ("gspo", {"loss_type": "dapo"}, "trl-dapo-sequence")]
"""README's GRPOConfig, a change to it, and run.json's ``algo``. The last is TRL's default loss with a sequence ratio:
TRL warns that it is not GSPO, which shows that the others' silence is heard."""


@pytest.mark.parametrize(("name", "change", "label"), README_ALGOS)
def test_readmes_gspo_and_grpo_settings_are_named_so_and_trl_does_not_object(tmp_path, caplog, name, change, label):
    """README's settings for one moestab step, on CPU with the test's batch (4 prompts x 4, micro-batches of 8). The
    policy is loaded from a folder: TRL loads grpo's reference model (beta 0.04) from the policy's path."""
    settings = {**readme_configs()[name], **change}
    policy, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    model = AutoModelForCausalLM.from_pretrained(save_policy(policy, tokenizer, tmp_path / "policy"))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    layout = cycle_layout(SimpleNamespace(num_iterations=1, **settings))
    with caplog.at_level(logging.WARNING):
        run_snippet(tmp_path, model, tokenizer, **settings, max_steps=layout.optimizer_steps)
    info = read_run_info(tmp_path / "run")
    assert info.algo == label and info.last_step == 1
    assert {key: info.config["trl"][key] for key in settings} == settings
    trl_warnings = [r.getMessage() for r in caplog.records if r.name.startswith("trl") and r.levelno >= logging.WARNING]
    if change:
        assert any("To reproduce the GSPO paper's setup, set `loss_type='grpo'`" in m for m in trl_warnings)
    else:
        assert trl_warnings == []


def test_a_moestab_step_is_one_generation_batch(tmp_path):
    """README's example: TRL's max_steps=2 with steps_per_generation=2 is ONE moestab step of two minibatches."""
    run_dir, trainer = train_with_records(tmp_path, max_steps=2, steps_per_generation=2)
    info = read_run_info(run_dir)
    assert trainer.state.global_step == 2 and info.planned_steps == info.last_step == 1
    assert [m["minibatches"] for m in load_metrics(run_dir).to_dict("records")] == [2]


def test_a_cycles_recorded_parts_are_freed_before_its_table_is_built(tmp_path, monkeypatch):
    """The step's table is built beside its tensors; the forwards' parts they were gathered from are gone by then
    (released by reference count, not left to the garbage collector)."""
    from moestab.integrations.trl import trainer as trl_trainer
    from moestab.integrations.trl.cycle import CycleRecord

    alive_at_write = []

    def write(*args, **kwargs):
        alive_at_write.append(sum(isinstance(o, CycleRecord) for o in gc.get_objects()))
        return write_step_tokens(*args, **kwargs)

    monkeypatch.setattr(trl_trainer, "write_step_tokens", write)
    gc.disable()  # a cycle freed only by a collection would still count
    try:
        run_dir, _ = train_with_records(tmp_path, max_steps=4, steps_per_generation=2)
    finally:
        gc.enable()
    assert alive_at_write == [0, 0] and read_run_info(run_dir).last_step == 2


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss", "mixtral"])
def test_other_families(tmp_path, family):
    """Sigmoid + bias (DeepSeek-V3), softmax after top-k (GPT-OSS), softmax before it (Mixtral): same records."""
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size=len(tokenizer), num_moe_layers=2))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    run_snippet(tmp_path, model, tokenizer, max_steps=4)
    info = read_run_info(tmp_path / "run")
    assert info.status == "finished" and info.model.family == family and info.last_step == 2
    tokens = pd.concat(token_frame(p) for p in list_token_files(tmp_path / "run").path)
    d = tokens.logp_old.to_numpy(np.float64) - tokens.logp_rollout.to_numpy(np.float64)
    assert np.mean(np.exp(d) - 1 - d) < 1e-9  # the rollout is aligned with the trainer
    for m in load_metrics(tmp_path / "run").to_dict("records"):
        step = tokens[tokens.step == m["step"]]
        expected = sets_changed(step.routes_old_free, step.routes_new, info.top_k)
        assert m["routing/old_new/changed"] == pytest.approx(expected, abs=1e-12) and expected > 0


def test_pi_new_on_part_of_the_batch(tmp_path):
    """Budget fraction 0.5: pi_new re-runs one of pi_old's two chunks (8 sequences of 16), drawn by the budget's
    seeded rule; the table holds those sequences, and old->new volatility is over them, with its sampling error."""
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward, args=grpo_args(tmp_path / "trl"),
                       train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                       moestab=RecordSettings(tmp_path / "run", budget=MeasureBudget(fraction=0.5))).train()
    tokens = pd.concat(token_frame(p) for p in list_token_files(tmp_path / "run").path)
    assert (np.stack(tokens.routes_new).min(axis=1) >= 0).all() and tokens.logp_new.notna().all()
    info = read_run_info(tmp_path / "run")
    assert info.config["measure_fraction"] == 0.5 and "randperm" in info.environment["measure_rule"]
    for m in load_metrics(tmp_path / "run").to_dict("records"):
        step = tokens[tokens.step == m["step"]]
        chunk = set(step.seq.unique().tolist())
        assert chunk in ({*range(8)}, {*range(8, 16)})  # one whole chunk of pi_old's forward
        expected = sets_changed(step.routes_old_free, step.routes_new)
        assert m["routing/old_new/changed"] == pytest.approx(expected, abs=1e-12) and expected > 0
        assert m["measure/fraction"] == 0.5 and m["routing/old_new/changed_se"] >= 0


def test_volume_controls_thin_the_tables_not_the_metrics(tmp_path):
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward, args=grpo_args(tmp_path / "trl"),
                       train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                       moestab=RecordSettings(tmp_path / "run", record_fraction=0.5, record_layers=(1,))).train()
    assert read_run_info(tmp_path / "run").recorded_layers == (1,)
    for path in list_token_files(tmp_path / "run").path:
        table = pq.read_table(path)
        assert len(set(table.column("seq").to_pylist())) == 8  # of 16
        assert read_routes(path, schema.COL_ROUTES_NEW, TOP_K).shape[1] == 1  # one layer of top-k
    for m in load_metrics(tmp_path / "run").to_dict("records"):
        assert len(m["routing/old_new/changed_by_layer"]) == LAYERS  # the step's metrics use every layer and token


def test_hooks_are_removed_after_training(recorded):
    model = recorded.trainer.model
    with ForwardCapture(model, RoutingRecorder(model), temperature=1.0):
        assert moestab_hooks(model) > 0  # the count sees moestab's hooks
    assert moestab_hooks(model) == 0


def test_a_failure_marks_the_run_failed_and_removes_the_hooks(tmp_path):
    calls = []

    def failing(completions: list[str], **_: object) -> list[float]:
        calls.append(1)
        if len(calls) == 2:  # the second generation batch: inside a recorded training step
            raise RuntimeError("reward server down")
        return reward(completions)

    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    with pytest.raises(RuntimeError, match="reward server down"):
        run_snippet(tmp_path, model, tokenizer, reward_funcs=failing)
    info = read_run_info(tmp_path / "run")
    assert info.status == "failed" and "reward server down" in info.error and info.last_step == 1
    assert moestab_hooks(model) == 0


def test_trained_rows_are_matched_to_generated_ones_by_their_tokens():
    pool = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 6, 7], [9, 9, 9]])  # rows 0 and 2 are the same sequence
    rows = match_rows(pool, [torch.tensor([[9, 9, 9], [5, 6, 7]]), torch.tensor([[5, 6, 7], [5, 6, 8]])])
    assert [r.tolist() for r in rows] == [[3, 0], [2, 1]]  # duplicates in order, each pool row once
    with pytest.raises(RecordingError, match="matches no generated one"):
        match_rows(pool, [torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7]])])  # a third copy was never generated


def test_settings_it_cannot_record_are_refused_with_the_reason():
    good = SimpleNamespace(use_vllm=False, use_transformers_continuous_batching=False, world_size=1,
                           loss_type="grpo", importance_sampling_level="sequence", steps_per_generation=4,
                           num_iterations=1, gradient_accumulation_steps=2)
    check_supported(good)
    assert (cycle_layout(good).optimizer_steps, cycle_layout(good).old_forward) == (2, True)
    aligned = SimpleNamespace(**{**vars(good), "steps_per_generation": 2})
    assert (cycle_layout(aligned).optimizer_steps, cycle_layout(aligned).old_forward) == (1, False)
    for change, reason in [({"use_vllm": True}, "vLLM"), ({"world_size": 2}, "one process only"),
                           ({"loss_type": "sapo"}, "no clipped ratio"),
                           ({"steps_per_generation": 3}, "not a multiple of gradient_accumulation_steps")]:
        with pytest.raises(ValueError, match=reason):
            check_supported(SimpleNamespace(**{**vars(good), **change}))


def test_trl_stays_optional():
    def run(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)

    out = run("import sys, moestab, moestab.integrations\nprint('trl' in sys.modules)")
    assert out.returncode == 0 and out.stdout.split() == ["False"]
    out = run("import sys\nsys.modules['trl'] = None\nimport moestab.integrations.trl")
    assert out.returncode != 0
    assert "ImportError: moestab.integrations.trl needs TRL: pip install 'moestab[trl]'" in out.stderr


def test_an_incompatible_transformers_is_refused_before_the_run_folder_is_written(tmp_path, monkeypatch):
    from moestab.routing import IncompatibleTransformersError
    from moestab.routing import forward_call as forward_call_module

    monkeypatch.setattr(forward_call_module, "find_cache", lambda kwargs: None)  # decode steps go unrecognised
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    with pytest.raises(IncompatibleTransformersError, match="start-up check of recording under generate"):
        run_snippet(tmp_path, model, tokenizer)
    assert not (tmp_path / "run").exists()


def test_the_trl_writer_holds_the_run_folders_lock_and_a_second_writer_is_refused(tmp_path):
    import os

    from moestab.run_folder.lock import RunLockedError, run_lock

    lock = tmp_path / "run" / schema.LOCK_FILE
    holders = []

    def watching(completions: list[str], **_: object) -> list[float]:  # called while TRL trains
        holders.append(json.loads(lock.read_text())["pid"])
        return reward(completions)

    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    run_snippet(tmp_path, model, tokenizer, reward_funcs=watching, max_steps=2)
    assert holders and set(holders) == {os.getpid()}
    assert read_run_info(tmp_path / "run").status == "finished" and not lock.exists()  # released at the end

    other = tmp_path / "other"
    with run_lock(other / "run", note=pytest.fail):  # another writer (flock is per open file, even in one process)
        with pytest.raises(RunLockedError, match=f"being written by process {os.getpid()} on host"):
            run_snippet(other, model, tokenizer, max_steps=2)
        assert [p.name for p in (other / "run").iterdir()] == [schema.LOCK_FILE]  # nothing written
    assert not (other / "run").exists()


def test_a_run_in_the_folder_is_kept_unless_overwritten_by_moestab_trains_own_rules(tmp_path):
    from moestab.run_folder import RunFolderError

    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    run_snippet(tmp_path, model, tokenizer, max_steps=2)
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    refusal = (f"{run} already holds a run (finished, last step 1); choose another run_dir or start over with "
               "RecordSettings(..., overwrite=True)")
    with pytest.raises(RunFolderError, match=re.escape(refusal)):
        run_snippet(tmp_path, model, tokenizer, max_steps=2)
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before  # nothing changed
    (run / "notes.txt").write_text("the user's, beside the old run")
    MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                       train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                       args=grpo_args(tmp_path / "trl", max_steps=2),
                       moestab=RecordSettings(run, overwrite=True)).train()
    assert read_run_info(run).status == "finished"  # the old run deleted, then rewritten
    assert (run / "notes.txt").read_text() == "the user's, beside the old run"  # not moestab's: kept
