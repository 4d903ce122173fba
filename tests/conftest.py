"""Suite-wide: a test of one MoE family runs only where the installed transformers holds that family as moestab
adapts it.

The oldest CI tiers install transformers releases below some families' floors (``RouterAdapter.min_transformers``):
there a family's tests first check that moestab refuses the family at load, naming the release it needs, and are
then skipped; a family the installed transformers does not have at all is skipped. A test names its families by a
``family`` parameter (its own or a fixture's) or by ``@pytest.mark.families(...)``.
"""

from __future__ import annotations

from functools import cache

import pytest


def _families(item: pytest.Item) -> list[str]:
    callspec = getattr(item, "callspec", None)
    named = [callspec.params["family"]] if callspec is not None and "family" in callspec.params else []
    marker = item.get_closest_marker("families")
    return named + list(marker.args if marker else ())


@cache
def _not_here(family: str) -> str | None:
    """Why ``family`` cannot be tested on the installed transformers (after checking its refusal), or None."""
    import transformers
    from transformers import CONFIG_MAPPING

    from moestab.models.conformance import tiny_model
    from moestab.routing import ADAPTERS, TransformersTooOldError, find_routers

    version = transformers.__version__
    if family not in CONFIG_MAPPING:
        return f"transformers {version} has no {family} models"
    adapter = next((a for a in ADAPTERS if a.family == family), None)
    if adapter is None or not adapter.too_old(version):
        return None
    with pytest.raises(TransformersTooOldError, match=f"from transformers {adapter.min_transformers} on"):
        find_routers(tiny_model(family))
    return f"{family} needs transformers >= {adapter.min_transformers}: refused at load on {version} (checked)"


@pytest.fixture(autouse=True)
def _family_on_this_release(request: pytest.FixtureRequest) -> None:
    for family in _families(request.node):
        reason = _not_here(family)
        if reason is not None:
            pytest.skip(reason)
