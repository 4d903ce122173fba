"""The step's record declared once (issue 56.1, 56.2): the declaration matches ``StepTensors``, every declared field
(a measurement's own too) survives the merge of two processes' records as one process holds it, and the check
catches a field the merge leaves out."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from moestab.recording import measurements
from moestab.recording.step_fields import (
    BATCH,
    COLUMNS,
    EXAMPLES,
    POSITIONS,
    ROUTES,
    SEQUENCE,
    STEP_FIELDS,
    TOKEN,
    StepField,
)
from moestab.recording.step_tensors import StepTensors, cat_step_tensors, step_fields
from moestab.routing import Routes
from tests.support.measurements import LogpNewAgain
from tests.support.step_records import RESPONSE, B, P, T, step_tensors

A_ROWS, B_ROWS = [1, 2], [0, 3]  # rows 1 and 2 answer in at most 2 tokens: that process's record is narrower
NARROW = 2


def test_the_declaration_lists_step_tensors_fields_in_order() -> None:
    assert [f.name for f in STEP_FIELDS] == [f.name for f in fields(StepTensors) if f.name != "extra"]
    assert RESPONSE[A_ROWS].sum(-1).max() == NARROW < T


def test_a_field_is_declared_with_a_kind_that_can_hold_it() -> None:
    with pytest.raises(ValueError, match="kind 'matrix' is not one of"):
        StepField("x", "matrix")
    with pytest.raises(ValueError, match="a batch field has no token-table column"):
        StepField("x", BATCH, column="x")
    with pytest.raises(ValueError, match=r"\['nothing'\]: no step field of that name is declared"):
        StepTensors.of({"nothing": 1})


@pytest.fixture
def added(monkeypatch):
    monkeypatch.setattr(measurements, "MEASUREMENTS", (*measurements.MEASUREMENTS, LogpNewAgain))


def whole_step() -> StepTensors:
    """A step with every declared field filled (the optional ones too), a measurement's own field included."""
    t = step_tensors(8, seed=3)
    gen = torch.Generator().manual_seed(4)
    values = {f.name: t.get(f.name) for f in step_fields()}
    values.update(
        correct=torch.tensor([True, False, True, True]), entropy=torch.rand(B, T, generator=gen),
        logp_update_counterfactual=-torch.rand(B, T, generator=gen),
        clipped_counterfactual=torch.rand(B, T, generator=gen) < 0.5, measured=torch.tensor([True, True, False, True]),
        sampled=frozenset({"logp_new"}), logp_new_again=-torch.rand(B, T, generator=gen))
    whole = StepTensors.of(values)
    assert all(whole.get(f.name) is not None for f in step_fields()), "a declared field is left empty"
    return whole


def process_part(whole: StepTensors, rows: list[int], width: int) -> StepTensors:
    """The record one process holds of ``rows``: its own responses, ``width`` tokens wide."""
    index = torch.tensor(rows)
    span = P + width - 1  # input positions

    def part(field: StepField, value):
        if field.kind == BATCH:
            b = value
            return replace(b, input_ids=b.input_ids[index, :span], attention_mask=b.attention_mask[index, :span],
                           targets=b.targets[index, :width], response_mask=b.response_mask[index, :width],
                           logp_rollout=b.logp_rollout[index, :width],
                           routes=part(StepField("r", ROUTES), b.routes), completions=[b.completions[i] for i in rows])
        if field.kind == EXAMPLES:
            return [value[i // 2] for i in rows[::2]]  # 2 sequences a prompt
        if field.kind == SEQUENCE:
            return value[index]
        if field.kind == TOKEN:
            return value[index, :width]
        if field.kind == POSITIONS:
            return value[index, :span]
        if field.kind == ROUTES:
            cut = {name: getattr(value, name)[index, :span] for name in ("margin", "confidence")
                   if getattr(value, name) is not None}
            return replace(value, indices=value.indices[index, :span], **cut)
        return value  # COLUMNS

    return StepTensors.of({f.name: part(f, whole.get(f.name)) for f in step_fields()})


def problems(whole: StepTensors, merged: StepTensors, order: list[int]) -> list[str]:
    """What the merged record holds differently from the one process's ``whole`` (rows in ``order``)."""
    index, out = torch.tensor(order), []
    mask = whole.batch.response_mask[index]  # [B, T]
    for f in step_fields():
        got, want = merged.get(f.name), whole.get(f.name)
        if got is None:
            out.append(f"{f.name}: lost")
        elif f.kind == SEQUENCE and not torch.equal(got, want[index]):
            out.append(f"{f.name}: {got} != {want[index]}")
        elif f.kind == TOKEN and not (torch.equal(got[mask], want[index][mask])
                                      and bool((got[: len(A_ROWS), NARROW:] == f.fill).all())):  # padded
            out.append(f"{f.name}: response tokens or padding differ")
        elif f.kind in (POSITIONS, ROUTES):
            pairs = [(got.indices, want.indices[index], -1)] if f.kind == ROUTES else [(got, want[index], -1)]
            if f.kind == ROUTES and want.margin is not None:
                pairs.append((got.margin.nan_to_num(-9), want.margin[index].nan_to_num(-9), -9))
            span, a = P + NARROW - 1, len(A_ROWS)  # the narrow process's positions, its rows first
            for g, w, pad in pairs:
                if not (torch.equal(g[:a, :span], w[:a, :span]) and torch.equal(g[a:], w[a:])
                        and bool((g[:a, span:] == pad).all())):
                    out.append(f"{f.name}: routes differ")
                    break
        elif f.kind == EXAMPLES and len(got) != len(want):
            out.append(f"{f.name}: {len(got)} examples, not {len(want)}")
        elif f.kind in (COLUMNS,) and got != want:
            out.append(f"{f.name}: {got} != {want}")
    return out


def test_every_declared_field_survives_two_processes(added) -> None:
    whole = whole_step()
    parts = [process_part(whole, A_ROWS, NARROW), process_part(whole, B_ROWS, T)]
    assert parts[0].logp_old.shape == (2, NARROW)  # the narrower process's record
    merged = cat_step_tensors(parts, pad_token_id=0)
    assert problems(whole, merged, A_ROWS + B_ROWS) == []
    assert merged.extra is not None and "logp_new_again" in merged.extra


def test_the_check_catches_a_field_the_merge_leaves_out(added) -> None:
    whole = whole_step()
    merged = cat_step_tensors([process_part(whole, A_ROWS, NARROW), process_part(whole, B_ROWS, T)], 0)
    for name in ("entropy", "logp_new_again", "clipped_counterfactual"):  # a planted omission, one field at a time
        values = {f.name: merged.get(f.name) for f in step_fields()}
        values[name] = None
        assert problems(whole, StepTensors.of(values), A_ROWS + B_ROWS) == [f"{name}: lost"]


def test_moving_a_record_keeps_every_field(added) -> None:
    whole = whole_step()
    moved = whole.to("cpu")
    assert all((moved.get(f.name) is None) == (whole.get(f.name) is None) for f in step_fields())
    assert torch.equal(moved.get("logp_new_again"), whole.get("logp_new_again"))
    assert isinstance(moved.routes_new, Routes) and moved.examples == whole.examples


def test_a_measurement_s_columns_follow_from_its_fields() -> None:
    assert measurements.NewPolicy.columns() == {"logp_new", "routes_new"}
    assert measurements.FreeOldPolicy.columns() == {"logp_old_free", "routes_old_free"}  # entropy: no column
    assert measurements.RoutingShare.columns() == frozenset()
    assert LogpNewAgain.columns() == {"logp_new_again"}
    setup = measurements.MeasureSetup(replay="off")
    measures = [cls(setup, (B, T), torch.float32, torch.device("cpu"))
                for cls in (measurements.NewPolicy, LogpNewAgain)]
    assert measurements.sampled_columns(measures, torch.tensor([True, False, True, True])) == {
        "logp_new", "routes_new", "logp_new_again"}  # sampled with the rows a budget measures
    assert measurements.sampled_columns(measures, None) == frozenset()

    class Undeclared(LogpNewAgain):
        fills = ("nowhere",)

    with pytest.raises(ValueError, match=r"Undeclared fills \['nowhere'\], which no step field declares"):
        Undeclared.columns()
