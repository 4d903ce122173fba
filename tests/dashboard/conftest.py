"""Fixtures of the dashboard tests: real runs from a short ``moestab.train.train``, and AppTest apps."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.dashboard import APP


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder per test (``$MOESTAB_CACHE``): the dashboard keeps its run index there, never in the user's
    cache; servers the test starts inherit it."""
    monkeypatch.setenv("MOESTAB_CACHE", str(tmp_path_factory.mktemp("moestab-cache")))


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory) -> Path:
    """A runs folder with two finished 6-step runs of the tiny task: replay off and R2 (``old``, with
    ``routing_share``)."""
    from moestab.train import train
    from tests.support.train import tiny_config

    cache = tmp_path_factory.mktemp("moestab-cache")
    root = tmp_path_factory.mktemp("runs")
    for name, replay in (("gspo-off", "off"), ("gspo-r2", "old")):
        result = train(tiny_config(root / name, cache, steps=6, save_every=6, eval_every=2, routing_replay=replay,
                                   routing_share=replay == "old"))
        assert result.status == "finished", result
    return root


ALGO_SEED_STEPS = {"grpo": 4, "gspo": 5}
"""Steps of each objective's runs in :func:`algo_seed_runs`: GSPO runs on past GRPO's last step (the issue's 1-17
against 1-57, shrunk), so the steps every run has are 1-4."""


@pytest.fixture(scope="session")
def algo_seed_runs(tmp_path_factory) -> Path:
    """A runs folder with GRPO and GSPO (replay off) on seeds 0 and 1 of the tiny task (``grpo-s0`` ... ``gspo-s1``),
    GRPO for 4 steps and GSPO for 5, every step measured: the runs a "GRPO against GSPO, by how much" question
    compares (about 3 s each)."""
    from moestab.train import train
    from tests.support.train import tiny_config

    cache = tmp_path_factory.mktemp("moestab-cache")
    root = tmp_path_factory.mktemp("algo-seed-runs")
    for algo, steps in ALGO_SEED_STEPS.items():
        for seed in (0, 1):
            last = max(ALGO_SEED_STEPS.values())  # one schedule for all (the last step saves and evaluates anyway)
            result = train(tiny_config(root / f"{algo}-s{seed}", cache, algo=algo, seed=seed, steps=steps,
                                       save_every=last, eval_every=last))
            assert result.status == "finished", result
    return root


@pytest.fixture
def runs_copy(trained_runs: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`trained_runs` (without checkpoints) that a test may damage."""
    root = tmp_path / "runs"
    shutil.copytree(trained_runs, root, ignore=shutil.ignore_patterns("checkpoints", "state"))
    return root


@pytest.fixture
def make_app(monkeypatch: pytest.MonkeyPatch):
    """``make_app(runs_dir)``: an AppTest of dashboard/app.py started as ``streamlit run app.py -- runs_dir``.

    AppTest runs the script in this process, so ``sys.argv`` (what the app reads the folder from) is
    set here, and ``$MOESTAB_RUNS`` removed so that it cannot interfere.
    """
    from streamlit.testing.v1 import AppTest

    for name in [n for n in os.environ if n.upper().replace("-", "_").startswith("MOESTAB_RUN")]:
        monkeypatch.delenv(name, raising=False)  # the variable and its look-alikes the sidebar warns about

    def make(runs_dir: Path | None):
        monkeypatch.setattr(sys, "argv", [str(APP), *([str(runs_dir)] if runs_dir is not None else [])])
        return AppTest.from_file(str(APP), default_timeout=120)

    return make


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str | None, bytes]]:
    """Files served by ``st.download_button`` in this test's AppTest runs: URL -> (file name, bytes).

    AppTest keeps them in a media store it makes per run and drops afterwards; this records what goes in.
    """
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
    from streamlit.testing.v1 import app_test

    served: dict[str, tuple[str | None, bytes]] = {}

    class Recording(MemoryMediaFileStorage):
        def load_and_get_id(self, path_or_data, mimetype, kind, filename=None):
            file_id = super().load_and_get_id(path_or_data, mimetype, kind, filename)
            served[self.get_url(file_id)] = (filename, self.get_file(file_id).content)
            return file_id

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", Recording)
    return served
