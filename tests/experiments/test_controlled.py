"""The controlled experiment's pipeline (moestab.experiments.controlled): choosing the lr, the pre-registration's
refusals, and scan -> choose -> evaluate -> report end to end at a tiny size."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from moestab.experiments import controlled
from moestab.experiments.controlled import Plan, PreregistrationError
from tests.support.train import REWARD

# Every reward 0: advantages are 0, the policy barely moves (weight decay only), so every run is stable and the
# scan's choice is known in advance: the largest lr.
TINY = (("prompts_per_step", 4), ("group_size", 4), ("minibatches", 2), ("eval_size", 8), ("save_every", 1),
        ("warm_start_max_steps", 0), ("progress", False))


def _plan(tmp_path, **overrides) -> Plan:
    values = {"layers": 1, "hidden": 32, "task": f"arithmetic:reward={REWARD}:always_zero", "scan_lrs": (1e-3,),
              "scan_seeds": (900,), "scan_steps": 2, "scan_eval_every": 1, "eval_seeds": (1000,), "eval_steps": 2,
              "eval_every": 1, "extra": TINY, "threads": 1, "cache_dir": str(tmp_path / "cache"), **overrides}
    return Plan(**values)


def _row(lr, stable, arm="dense_grpo_off"):
    return {"arm": arm, "lr": lr, "seed": 900, "stable": stable}


def test_choose_lr_takes_the_largest_lr_stable_for_every_control_and_seed():
    table = pd.DataFrame([_row(1e-4, True), _row(5e-4, True), _row(5e-4, True, "frozen_grpo_off"),
                          _row(1e-3, True), _row(1e-3, False, "frozen_grpo_off"), _row(2e-3, False)])
    assert controlled.choose_lr(table) == 5e-4
    with pytest.raises(RuntimeError, match="no lr of the scan"):
        controlled.choose_lr(pd.DataFrame([_row(1e-3, False)]))


@pytest.mark.parametrize(("measures", "stable"), [
    ({"start_acc": 0.5, "final_acc": 0.41, "reward_gain": 0.0, "collapse": 0.0}, True),
    ({"start_acc": 0.5, "final_acc": 0.39, "reward_gain": 0.1, "collapse": 1.0}, False),  # fell > COLLAPSE_DROP
    ({"start_acc": 0.5, "final_acc": 0.5, "reward_gain": -0.01, "collapse": 0.0}, False),  # reward went down
    ({"start_acc": None, "final_acc": 0.5, "reward_gain": 0.1, "collapse": 0.0}, False),  # unknown start
])
def test_stability_rule(measures, stable):
    assert controlled.is_stable(measures) is stable


def test_plan_keeps_the_scan_seeds_reserved_and_every_arm_on_one_depth():
    with pytest.raises(ValueError, match="overlap"):
        Plan(scan_seeds=(900, 1000))
    plan = Plan()
    models = {controlled.ARMS[a].fields(plan.model_keys)["model"] for a in controlled.EVAL_ARMS}
    assert models == {"embedded:layers=8", "embedded:dense,layers=8"}
    assert plan.base()["rollout_dtype"] == "bfloat16" and plan.base()["routing_share"] is True


def test_evaluate_refuses_without_a_preregistration(tmp_path):
    with pytest.raises(PreregistrationError, match="no pre-registration"):
        controlled.run_evaluation(_plan(tmp_path), tmp_path / "runs", tmp_path / "prereg.md")
    (tmp_path / "other.md").write_text("# not a pre-registration\n")
    with pytest.raises(PreregistrationError, match="no ```json registration block"):
        controlled.run_evaluation(_plan(tmp_path), tmp_path / "runs", tmp_path / "other.md")


@pytest.mark.slow
def test_scan_choose_evaluate_report_end_to_end(tmp_path):
    plan, out, prereg = _plan(tmp_path), tmp_path / "runs", tmp_path / "prereg.md"
    controlled.run_scan(plan, out, log=lambda s: None)
    table = controlled.scan_table(plan, out)
    assert sorted(table["arm"]) == ["dense_grpo_off", "frozen_grpo_off"] and table["stable"].all()
    prereg.write_text(controlled.preregistration_markdown(plan, table, "2026-11-30"))
    assert controlled.read_registration(prereg)["lr"] == 1e-3 and "2026-11-30" in prereg.read_text()

    # A plan other than the registered one, or an edited file, is refused before anything runs.
    with pytest.raises(PreregistrationError, match="steps: registered 2, would run 3"):
        controlled.run_evaluation(_plan(tmp_path, eval_steps=3), out, prereg)
    edited = tmp_path / "edited.md"
    edited.write_text(prereg.read_text().replace('"lr": 0.001', '"lr": 0.002'))
    with pytest.raises(PreregistrationError, match=r"lr: registered 0\.002, would run 0\.001"):
        controlled.run_evaluation(plan, out, edited)
    assert not (out / "evaluate").exists()

    runs = controlled.run_evaluation(plan, out, prereg, log=lambda s: None)
    assert len(runs) == len(controlled.EVAL_ARMS)
    assert controlled.run_evaluation(plan, out, prereg, log=pytest.fail) == runs  # finished runs are reused
    paths = controlled.write_report(plan, out, prereg, tmp_path / "report")
    outcomes = pd.read_csv(paths[0])
    assert sorted(outcomes["arm"]) == sorted(controlled.EVAL_ARMS)
    assert outcomes["routing_share"].notna().any()  # routing_share on in every run
    paired = pd.read_csv(paths[1])
    assert set(paired["arm"]) == set(controlled.EVAL_ARMS) - {controlled.BASELINE}
    assert (paired["n"] == 1).all()  # one seed: a mean difference, no interval
    assert "Paired differences" in paths[2].read_text()


def test_shards_partition_a_grid_and_bad_shards_are_refused(tmp_path):
    from moestab.experiments.grid import shard

    runs = controlled.evaluation_runs(_plan(tmp_path, eval_seeds=(1000, 1001)), 1e-3, tmp_path / "runs")
    assert len(runs) == 12  # 6 arms x 2 seeds
    parts = [shard(runs, i, 3) for i in range(3)]
    assert sorted((r.run_dir for p in parts for r in p), key=str) == sorted((r.run_dir for r in runs), key=str)
    assert [len(p) for p in parts] == [4, 4, 4] and parts[1][0].run_dir == runs[1].run_dir  # every 3rd from 1
    assert shard(runs, 0, 1) == runs
    for index, count in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match=f"shard {index}/{count} is not valid"):
            shard(runs, index, count)


def test_a_grid_skips_a_run_another_process_is_training(tmp_path):
    from moestab.experiments.grid import is_finished, run_grid
    from moestab.run_folder.lock import run_lock

    run = controlled.evaluation_runs(_plan(tmp_path), 1e-3, tmp_path / "runs")[0]
    lines = []
    with run_lock(run.run_dir, note=lines.append):  # as the process training it would hold it
        assert run_grid([run], log=lines.append) == [run.run_dir]  # no error: the run is someone else's
    assert "skipped, another process is training it" in lines[-1] and str(run.run_dir) in lines[-1]
    assert not is_finished(run) and not run.run_dir.exists()  # nothing written, the lock's folder removed


def test_a_grid_stops_when_a_run_is_interrupted(tmp_path, monkeypatch):
    import signal

    from moestab.experiments import grid
    from moestab.train.loop import RunResult

    runs = controlled.evaluation_runs(_plan(tmp_path), 1e-3, tmp_path / "runs")[:3]
    trained = []

    def interrupted_train(config, log):  # what train() returns after a SIGTERM: the step saved, the run interrupted
        trained.append(config.run_dir)
        return RunResult(Path(config.run_dir), "interrupted", 1, 0.5, None, stop_signal=signal.SIGTERM)

    monkeypatch.setattr(grid, "train", interrupted_train)
    lines = []
    grid.run_grid(runs, log=lines.append)
    assert trained == [runs[0].config.run_dir]  # the second and third never start
    assert "interrupted (signal 15); the grid stops" in lines[-1]
