import pytest

from moestab.models.families import TINY_CONFIGS

from .helpers import make_model


@pytest.fixture(params=sorted(TINY_CONFIGS))
def family(request) -> str:
    return request.param


@pytest.fixture
def model(family):
    return make_model(family)
