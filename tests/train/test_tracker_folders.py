"""A tracker's folder in a run folder that is a planted link or a file (issue 55.5 / 55.6): refused before anything
is written, run.json left as it was; nothing lands outside the run folder."""

from __future__ import annotations

import json

import pytest

from moestab.run_folder import schema
from moestab.train import train
from moestab.train.run_lifetime import TrainingError
from tests.support.train import tiny_config

pytest.importorskip("torch.utils.tensorboard")


@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_planted_tracker_folder_is_refused_before_the_resume_touches_run_json(tmp_path, planted):
    run, outside = tmp_path / "run", tmp_path / "outside"
    train(tiny_config(run, tmp_path / "cache", steps=1), log=lambda s: None)
    before = (run / schema.RUN_JSON).read_text()
    if planted == "link":
        outside.mkdir()
        (run / schema.TENSORBOARD_DIR).symlink_to(outside, target_is_directory=True)
    else:
        (run / schema.TENSORBOARD_DIR).write_text("someone's notes")
    with pytest.raises(TrainingError, match=r"tensorboard.*(is a link|is a file)"):
        train(tiny_config(run, tmp_path / "cache", resume=str(run), steps=2, report_to=("tensorboard",)),
              log=lambda s: None)
    assert (run / schema.RUN_JSON).read_text() == before  # still finished at step 1
    assert json.loads(before)["status"] == "finished"
    if planted == "link":
        assert list(outside.iterdir()) == []  # no event file written through the link
