import pytest

from moestab.models.families import CORE_FAMILIES
from tests.support.routing import make_model


@pytest.fixture(params=sorted(CORE_FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture
def model(family):
    return make_model(family)
