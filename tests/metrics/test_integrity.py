"""Route integrity (moestab.metrics.integrity): each check against a loop-by-loop second implementation, each
planted fault of a known capture caught by the check meant for it, and a right capture passing."""

from __future__ import annotations

import numpy as np
import pytest

from moestab.metrics import keys
from moestab.metrics.integrity import MIN_ROWS, Thresholds, failures, route_integrity, with_model
from moestab.metrics.routes import intersection_sizes, route_change

E, K, LAYERS, TOKENS = 16, 2, 3, 200


def _capture(seed: int = 0) -> np.ndarray:
    """Distinct experts per decision, every token routed."""
    gen = np.random.default_rng(seed)
    return np.stack([[gen.permutation(E)[:K] for _ in range(LAYERS)] for _ in range(TOKENS)]).astype(np.int16)


def _by_loops(captured: np.ndarray, reference: np.ndarray) -> dict[str, list[float]]:
    coverage, invalid, agreement = [], [], []
    for j in range(LAYERS):
        rows = [captured[t, j] for t in range(TOKENS)]
        recorded = [r for r in rows if all(x >= 0 for x in r)]
        coverage.append(len(recorded) / TOKENS)
        invalid.append(sum(1 for r in recorded if len(set(r.tolist())) < K or max(r) >= E) / len(recorded))
        shared = [len(set(captured[t, j].tolist()) & set(reference[t, j].tolist())) / K for t in range(TOKENS)
                  if all(x >= 0 for x in captured[t, j]) and all(x >= 0 for x in reference[t, j])]
        agreement.append(sum(shared) / len(shared))
    return {"coverage": coverage, "invalid": invalid, "agreement": agreement}


def test_each_check_matches_a_loop_by_loop_count():
    captured, reference = _capture(0), _capture(0)
    gen = np.random.default_rng(1)
    swap = gen.random((TOKENS, LAYERS)) < 0.3  # a third of the decisions differ in one slot
    reference[swap, 0] = (reference[swap, 0] + 7) % E
    reference[swap & (reference[:, :, 0] == reference[:, :, 1]), 0] = -1  # keep each reference decision distinct
    captured[:10, 1] = -1  # not recorded
    captured[10, 2] = [3, 3]  # repeated
    captured[11, 2] = [3, E + 1]  # outside the model
    out = route_integrity(captured, reference, num_experts=E)
    loops = _by_loops(captured, reference)
    assert out[keys.INTEGRITY_COVERAGE_BY_LAYER] == pytest.approx(loops["coverage"], abs=1e-12)
    assert out[keys.INTEGRITY_INVALID_BY_LAYER] == pytest.approx(loops["invalid"], abs=1e-12)
    assert out[keys.INTEGRITY_AGREEMENT_BY_LAYER] == pytest.approx(loops["agreement"], abs=1e-12)
    assert out[keys.INTEGRITY_CHANCE] == K / E
    lift = [(a - K / E) / (1 - K / E) for a in loops["agreement"]]
    assert out[keys.INTEGRITY_LIFT] == pytest.approx(min(lift), abs=1e-12)
    token_lifts = []  # each token's agreement over the layers recorded on both sides, rescaled from chance
    for t in range(TOKENS):
        shared = [len(set(captured[t, j].tolist()) & set(reference[t, j].tolist())) / K for j in range(LAYERS)
                  if min(captured[t, j]) >= 0 and min(reference[t, j]) >= 0]
        if shared:
            token_lifts.append((sum(shared) / len(shared) - K / E) / (1 - K / E))
    want = sum(v < Thresholds().lift for v in token_lifts) / len(token_lifts)
    assert out[keys.INTEGRITY_DISAGREEING] == pytest.approx(want, abs=1e-12) and want > 0
    handed = route_change(intersection_sizes(captured, reference), K, by_token=True)
    assert route_integrity(captured, reference, num_experts=E, changes=handed) == out  # what a caller passes in


def test_a_right_capture_passes_and_each_fault_is_caught_by_its_check():
    captured = _capture(0)
    reference = captured.copy()
    reference[::20, 0, 0] = (reference[::20, 0, 0] + 1) % E  # a few rollout -> trainer flips
    reference[::20, 0] = np.where(reference[::20, 0, :1] == reference[::20, 0, 1:], [[0, 1]], reference[::20, 0])
    ok = route_integrity(captured, reference, num_experts=E)
    assert ok[keys.INTEGRITY_FAILED] == 0 and failures(ok) == []
    zeroed = captured.copy()
    zeroed[:, 1] = 0
    assert any(f.startswith("layer 1: invalid") for f in failures(route_integrity(zeroed, reference, num_experts=E)))
    assert any("layer 1: constant" in f for f in failures(route_integrity(zeroed, reference, num_experts=E)))
    dropped = captured.copy()
    dropped[: TOKENS // 8] = -1
    assert any("coverage 0.875" in f for f in failures(route_integrity(dropped, reference, num_experts=E)))
    shifted = np.roll(captured, 1, axis=0)
    caught = failures(route_integrity(shifted, reference, num_experts=E))
    assert any("lift" in f for f in caught) and any("of tokens disagree" in f for f in caught)
    half = captured.copy()
    half[TOKENS // 2 :] = np.roll(captured[TOKENS // 2 :], 2, axis=0)  # one turn of two misaligned
    assert any("of tokens disagree" in f for f in failures(route_integrity(half, reference, num_experts=E)))
    out = route_integrity(captured[:, ::-1], reference, num_experts=E)
    assert out[keys.INTEGRITY_FAILED] >= 1  # layers in another order


def test_a_constant_layer_needs_enough_rows_and_wraparound_needs_a_wide_model():
    one = np.tile(np.array([[[1, 2]]], np.int16), (MIN_ROWS - 1, 1, 1))
    assert route_integrity(one, num_experts=E)[keys.INTEGRITY_CONSTANT_BY_LAYER] == [0.0]
    more = np.tile(np.array([[[2, 1]]], np.int16), (MIN_ROWS, 1, 1))  # the same set, in another slot order
    assert route_integrity(more, num_experts=E)[keys.INTEGRITY_CONSTANT_BY_LAYER] == [1.0]
    masked = np.concatenate([np.full((4 * MIN_ROWS, 1, 2), -1, np.int16), more])  # unrecorded rows above it
    assert route_integrity(masked, num_experts=E)[keys.INTEGRITY_CONSTANT_BY_LAYER] == [1.0]
    masked[-1, 0] = [1, 3]  # one row apart, past the rows read first
    assert route_integrity(masked, num_experts=E)[keys.INTEGRITY_CONSTANT_BY_LAYER] == [0.0]
    late = np.tile(np.array([[[1, 2]]], np.int16), (8 * MIN_ROWS, 1, 1))
    late[-1, 0] = [1, 3]
    assert route_integrity(late, num_experts=E)[keys.INTEGRITY_CONSTANT_BY_LAYER] == [0.0]
    gen = np.random.default_rng(0)
    wide = np.stack([[gen.permutation(320)[:2]] for _ in range(200)]).astype(np.int16)
    assert route_integrity(wide, num_experts=320)[keys.INTEGRITY_WRAPPED] == 0
    wrapped = route_integrity(wide % 256, num_experts=320)
    assert wrapped[keys.INTEGRITY_WRAPPED] == 1 and any("wrapped" in f for f in failures(wrapped))
    assert route_integrity(wide[:10] % 256, num_experts=320)[keys.INTEGRITY_WRAPPED] == 0  # too few slots to tell


def test_the_chance_level_comes_from_the_model_when_the_call_had_none():
    captured = _capture(0)
    shifted = np.roll(captured, 1, axis=0)
    bare = route_integrity(shifted, captured)  # no num_experts: agreement without chance, nothing judged on it
    assert keys.INTEGRITY_CHANCE not in bare and bare[keys.INTEGRITY_FAILED] == 0
    full = with_model(bare, K, E)
    assert full[keys.INTEGRITY_CHANCE] == K / E and full[keys.INTEGRITY_FAILED] >= 1


def test_agreement_is_reported_but_not_judged_when_asked_and_thresholds_are_settings():
    captured = _capture(0)
    shifted = np.roll(captured, 1, axis=0)
    out = route_integrity(shifted, captured, num_experts=E, agreement=False)
    assert out[keys.INTEGRITY_FAILED] == 0 and out[keys.INTEGRITY_LIFT] < 0.5
    dropped = captured.copy()
    dropped[:2] = -1  # coverage 0.99
    assert failures(route_integrity(dropped, num_experts=E)) == []
    assert failures(route_integrity(dropped, num_experts=E), Thresholds(coverage=0.995))


def test_every_importer_hands_its_routes_to_the_checks():
    """An ImportedRoutes (what every importer returns) checks itself: from the payload alone, and against the
    trainer's routes."""
    from moestab.experiments.integrity_faults import _imported, plant
    from tests.support.route_payloads import EXPERTS, PROMPTS, RESPONSES, known_rows

    rows = known_rows(0)
    imported = _imported("verl", rows, PROMPTS, RESPONSES, EXPERTS)
    alone = imported.integrity()
    assert alone[keys.INTEGRITY_COVERAGE] == 1.0 and keys.INTEGRITY_AGREEMENT_BY_LAYER not in alone
    reference = imported.response_routes()
    assert imported.integrity(reference)[keys.INTEGRITY_LIFT] == 1.0
    capture = type("C", (), {"rows": rows, "prompts": PROMPTS})()
    dropped = _imported("verl", plant("rows_dropped", capture), PROMPTS, RESPONSES, EXPERTS)
    assert dropped.integrity()[keys.INTEGRITY_COVERAGE] < 1.0
