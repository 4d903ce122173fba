import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One warm-start cache for the session: the untrained base is built once."""
    return tmp_path_factory.mktemp("moestab-cache")
