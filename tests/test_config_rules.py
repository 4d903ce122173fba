"""The validation rules `moestab train` and `moestab probe` share (moestab.configs): a value is refused by both
settings or by neither, at the bounds and just inside them, so a bound cannot drift apart between the two."""

from __future__ import annotations

import pytest

from moestab.configs import MAX_NEW_TOKENS, MAX_THREADS, SEED_LIMIT, ConfigError
from moestab.probes.errors import ProbeError
from moestab.probes.runner import ProbeSettings
from moestab.train.config import TrainConfig

# (TrainConfig fields, the same values as ProbeSettings fields, refused?)
CASES = [
    ({"seed": SEED_LIMIT - 1}, {"seed": SEED_LIMIT - 1}, False),
    ({"seed": SEED_LIMIT}, {"seed": SEED_LIMIT}, True),
    ({"seed": -1}, {"seed": -1}, True),
    ({"threads": MAX_THREADS}, {"threads": MAX_THREADS}, False),
    ({"threads": MAX_THREADS + 1}, {"threads": MAX_THREADS + 1}, True),
    ({"threads": 0}, {"threads": 0}, True),
    ({"max_new_tokens": MAX_NEW_TOKENS}, {"max_new_tokens": MAX_NEW_TOKENS}, False),
    ({"max_new_tokens": MAX_NEW_TOKENS + 1}, {"max_new_tokens": MAX_NEW_TOKENS + 1}, True),
    ({"max_new_tokens": 0}, {"max_new_tokens": 0}, True),
    ({"max_new_tokens": True}, {"max_new_tokens": True}, True),  # YAML's true is no length
    ({"group_size": 2}, {"group_size": 2}, False),
    ({"group_size": 1}, {"group_size": 1}, True),
    # 4 prompts x 4 samples = 16 sequences: 8 minibatches of 2, but 3 would be unequal
    ({"prompts_per_step": 4, "group_size": 4, "minibatches": 8}, {"prompts": 4, "group_size": 4,
                                                                  "minibatch_counts": (8,)}, False),
    ({"prompts_per_step": 4, "group_size": 4, "minibatches": 3}, {"prompts": 4, "group_size": 4,
                                                                  "minibatch_counts": (3,)}, True),
]


def _refusal(make) -> str | None:
    try:
        make()
    except (ConfigError, ProbeError) as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(("train", "probe", "refused"), CASES)
def test_train_and_probe_settings_refuse_the_same_values(train, probe, refused):
    said_by_train = _refusal(lambda: TrainConfig(**train))
    said_by_probe = _refusal(lambda: ProbeSettings(**probe).check())
    assert (said_by_train is not None, said_by_probe is not None) == (refused, refused), (said_by_train, said_by_probe)


def test_a_cache_dir_that_is_a_file_is_refused_by_both_in_the_same_words(tmp_path):
    file = tmp_path / "cache"
    file.write_text("not a folder")
    said_by_train = _refusal(lambda: TrainConfig(cache_dir=str(file)))
    said_by_probe = _refusal(lambda: ProbeSettings(cache_dir=str(file)).check())
    assert said_by_train == said_by_probe == f"cache_dir: '{file}' is a file, not a folder; give a folder (it is " \
                                             "created if missing)"


def test_both_list_the_same_valid_minibatch_counts():
    said_by_train = _refusal(lambda: TrainConfig(prompts_per_step=5, group_size=2, minibatches=4))
    said_by_probe = _refusal(lambda: ProbeSettings(prompts=5, group_size=2, minibatch_counts=(4,)).check())
    assert said_by_train.endswith("(prompts_per_step*group_size = 5*2); valid: 1, 2, 5, 10"), said_by_train
    assert said_by_probe.endswith("(prompts x group_size = 5 x 2); valid: 1, 2, 5, 10"), said_by_probe
