"""Every supported MoE family (44 in transformers 5.23): exact record / replay, gradients, generate(), refusals.

The measurements come from ``moestab.models.conformance``, which also writes docs/families.md
(scripts/families_table.py), so the table and these tests cannot disagree.
"""

import dataclasses

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from moestab.models.conformance import family_report, tiny_model
from moestab.models.families import CORE_FAMILIES, TINY_CONFIGS
from moestab.routing import SUPPORTED_FAMILIES, RoutingRecorder, RoutingReplay, find_routers
from moestab.routing import adapters as adapters_module
from moestab.routing.errors import (
    AdapterMismatchError,
    NotAnMoEModelError,
    RouterClassMissingError,
    RoutesMismatchError,
    TransformersTooOldError,
    UnsupportedRoutingError,
)
from moestab.routing.gating import Gating

ALL = sorted(SUPPORTED_FAMILIES)


def test_every_supported_family_has_a_tiny_config_and_there_are_at_least_25():
    assert sorted(TINY_CONFIGS) == ALL
    assert set(CORE_FAMILIES) <= set(ALL)
    assert len(ALL) >= 25


@pytest.mark.parametrize("family", ALL)
def test_family_records_and_replays_exactly(family):
    report = family_report(family)
    # Replaying a free forward's own routes gives the free logits: bitwise in float64 for every family here.
    assert report.replay_max_diff <= 1e-6
    assert report.replay_bitwise, f"{family}: replay differs by {report.replay_max_diff:.3g}"
    # Other routes change the output: replay forces something.
    assert report.replay_other_diff > 1e-6
    # The router keeps its gradient under replay, equal to the free forward's when the routes are the same.
    assert report.grad_norm > 0
    assert report.grad_max_diff <= 1e-9 * max(1.0, report.grad_norm)
    # generate() with a KV cache records what one full forward over the same tokens routes.
    assert report.generate_mismatch == 0.0
    assert report.moe_layers and report.num_layers >= len(report.moe_layers)


@pytest.mark.families("glm4_moe", "jamba", "nemotron_h")
def test_dense_first_layers_and_hybrid_stacks_map_to_decoder_layers():
    # DeepSeek-V3 style: one dense first layer; Jamba: experts in every layer of an attention / Mamba stack;
    # Nemotron-H: MoE only in the "E" layers of a Mamba / MoE / attention pattern.
    assert [s.layer for s in find_routers(tiny_model("glm4_moe"))] == [1, 2]
    assert [s.layer for s in find_routers(tiny_model("jamba"))] == [0, 1]
    assert [s.layer for s in find_routers(tiny_model("nemotron_h"))] == [1, 3]


@pytest.mark.parametrize("family, router, reason", [
    ("deepseek_v4", "DeepseekV4HashRouter", "hash of the token id"),
    ("jetmoe", "JetMoeTopKGating", "routes twice per layer"),
])
def test_families_that_cannot_be_forced_exactly_are_refused_with_the_reason(family, router, reason):
    base = AutoConfig.for_model(family)
    small = {k: v for k, v in {"vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 64, "num_local_experts": 4,
                               "num_experts_per_tok": 2}.items() if k in base.to_dict()}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **small))
    with pytest.raises(UnsupportedRoutingError, match=f"is a {family} model.*{reason}"):
        find_routers(model)


@pytest.fixture
def replace_adapter(monkeypatch):
    """Swap one family's adapter for another in the table (the lookup cache cleared before and after)."""

    def replace(adapter: adapters_module.RouterAdapter) -> None:
        table = tuple(adapter if a.family == adapter.family else a for a in adapters_module.ADAPTERS)
        monkeypatch.setattr(adapters_module, "ADAPTERS", table)
        adapters_module._adapters_by_type.cache_clear()

    yield replace
    monkeypatch.undo()
    adapters_module._adapters_by_type.cache_clear()


@pytest.mark.families("mellum")
def test_a_renamed_router_class_is_named_not_reported_as_not_moe(replace_adapter):
    model = tiny_model("mellum")
    replace_adapter(adapters_module.RouterAdapter(
        "mellum", "transformers.models.mellum.modeling_mellum.MellumRouterRenamed",
        adapters_module.SOFTMAX_NORM_TOPK, adapters_module.BY_LOGIT))
    with pytest.raises(RouterClassMissingError, match=r"mellum model.*no router class "
                                                      r"transformers\.models\.mellum\.modeling_mellum\."
                                                      r"MellumRouterRenamed \(renamed or removed\?\)"):
        find_routers(model)
    assert issubclass(RouterClassMissingError, NotAnMoEModelError)


def test_a_family_is_refused_on_a_transformers_older_than_its_adapter_needs(replace_adapter):
    model = tiny_model("qwen3_moe")
    qwen3 = adapters_module.ADAPTERS[0]
    assert [s.adapter.family for s in find_routers(model)] == ["qwen3_moe"] * 2  # accepted as installed
    replace_adapter(dataclasses.replace(qwen3, min_transformers="99.0"))
    with pytest.raises(TransformersTooOldError) as caught:
        find_routers(model)
    assert str(caught.value) == (
        f"Qwen3MoeForCausalLM is a qwen3_moe model: moestab's qwen3_moe adapter matches its router from transformers "
        f"99.0 on, and transformers {transformers.__version__} is installed; pip install 'transformers>=99.0'")
    assert isinstance(caught.value, NotAnMoEModelError)  # the probes and the trainer report it as they report those


def test_family_floors_name_supported_families_above_the_declared_floor():
    from packaging.version import Version

    from moestab.routing.compat import TESTED_TRANSFORMERS

    assert set(adapters_module.TRANSFORMERS_FLOORS) <= set(ALL)
    for family, floor in adapters_module.TRANSFORMERS_FLOORS.items():
        assert Version(floor) > Version(TESTED_TRANSFORMERS[0]), family  # else the declared floor already says it
        assert next(a for a in adapters_module.ADAPTERS if a.family == family).min_transformers == floor


def test_too_old_compares_releases_not_strings():
    adapter = dataclasses.replace(adapters_module.ADAPTERS[0], min_transformers="5.10.0")
    assert adapter.too_old("5.9.0") and adapter.too_old("5.10.0rc1")
    assert not adapter.too_old("5.10.0") and not adapter.too_old("5.24.0")
    assert not adapters_module.ADAPTERS[0].too_old("0.1")  # no floor: every release moestab installs with


def test_an_adapter_that_does_not_reproduce_its_router_is_refused(replace_adapter):
    model = tiny_model("qwen3_moe")
    qwen3 = adapters_module.ADAPTERS[0]
    replace_adapter(adapters_module.RouterAdapter("qwen3_moe", qwen3.router_class, Gating("softmax_topk"),
                                                  adapters_module.BY_LOGIT))
    with pytest.raises(AdapterMismatchError, match=r"qwen3_moe router model\.layers\.0\.mlp\.gate "
                                                   r"\(Qwen3MoeTopKRouter\): moestab's gating \(softmax over the "
                                                   r"top-k logits\) differs from the router's own gates by"):
        find_routers(model)


@pytest.mark.families("phimoe")
def test_verification_leaves_the_global_rng_and_training_mode_alone():
    model = tiny_model("phimoe").train()  # PhiMoE samples with Gumbel noise in training mode
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    find_routers(model)
    assert torch.equal(torch.rand(3), expected)
    assert all(m.training for m in model.modules())


@pytest.mark.families("phimoe")
def test_phimoe_replay_is_refused_in_training_mode_and_exact_in_eval_mode():
    model = tiny_model("phimoe")
    ids = torch.randint(3, 100, (2, 6))
    with RoutingRecorder(model) as rec, torch.no_grad():
        free = model(input_ids=ids).logits
    with RoutingReplay(model, rec.routes), torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, free)
    model.train()
    with pytest.raises(RoutesMismatchError, match="cannot replay phimoe in training mode: PhiMoE's SparseMixer"):
        RoutingReplay(model, rec.routes)


def test_docs_families_lists_every_family():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "families_table.py"
    spec = importlib.util.spec_from_file_location("families_table", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "run scripts/families_table.py"


@pytest.mark.parametrize("family", ALL)
def test_every_family_builds_as_the_embedded_policy(family):
    # `--model embedded:family=NAME` accepts every family: its default shape (4 layers, hidden 128) builds and runs.
    from moestab.models import EmbeddedModelSpec, build_embedded_policy

    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(family=family))
    ids = tokenizer(["12+34="], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all(), family


@pytest.mark.parametrize("family", ALL)
def test_family_replays_exactly_in_bfloat16_with_selection_biases(family):
    # Production dtype, and non-zero correction biases (zero at initialisation, so float64 tests barely use them).
    from tests.support.models import randomise_selection_biases

    model = tiny_model(family, dtype=torch.bfloat16)
    randomise_selection_biases(model)
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    with RoutingRecorder(model) as rec, torch.no_grad():
        free = model(input_ids=ids).logits
    with RoutingReplay(model, rec.routes), torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, free), family


@pytest.mark.families("lfm2_moe")
def test_lfm2_moe_without_expert_bias_ranks_by_sigmoid_alone():
    model = tiny_model("lfm2_moe", use_expert_bias=False)
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    with RoutingRecorder(model) as rec, torch.no_grad():
        free = model(input_ids=ids).logits
    with RoutingReplay(model, rec.routes), torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, free)


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])  # transformers >= 5.24, then <= 5.23
def test_a_fresh_cache_with_offset_positions_is_a_prefill_not_a_decode_step(keyword):
    import inspect

    from transformers import DynamicCache

    from moestab.routing.forward_call import read_forward_call

    ids = torch.randint(3, 100, (1, 6))
    positions = torch.arange(10, 16)[None]  # [1, 6]
    call = read_forward_call((), {"input_ids": ids, keyword: DynamicCache(), "position_ids": positions})
    assert call.cached and not call.continuation
    model = tiny_model("qwen3_moe")
    accepted = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    with RoutingRecorder(model) as rec, torch.no_grad():
        for _ in range(2):
            model(input_ids=ids, position_ids=torch.arange(10, 16)[None], **{accepted: DynamicCache()})
    assert len(rec.segments) == 2 and rec.routes.indices.shape[:2] == (2, 6)
