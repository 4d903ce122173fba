"""Placement of an engine's per-sequence routes on the trainer's layout, worked by hand."""

import numpy as np
import pytest

from moestab.routes_in.placement import RouteLayoutError, expert_ids, place_rows, vllm_rows


def test_place_rows_left_pads_starts_late_and_drops_the_last_token():
    # One layer, top-1. Sequence 0: prompt 2, response 2, rows from position 1 (its first prompt token unrecorded):
    #   input positions 0..2 (2 + 2 - 1 = 3), rows cover 1..3 of which 1..2 are kept (need 3 - 1 = 2).
    # Sequence 1: prompt 1, response 3, rows from 0: input positions 0..2, need 3 rows, a 4th (last token) dropped.
    # prompt_width 3 (wider than both prompts, as a batch padded elsewhere) and length 3 + 3 - 1 = 5.
    rows = [np.array([[[4]], [[5]], [[6]]]), np.array([[[1]], [[2]], [[3]], [[9]]])]
    out, scoring = place_rows(rows, [2, 1], [2, 3], starts=[1, 0], prompt_width=3, length=5, field="f")
    assert out.dtype == np.int16 and out.shape == (2, 5, 1, 1)
    # seq 0: offset 3 - 2 = 1; positions 1+1..1+2 = 2, 3 get 4, 5; column 1 (its position 0) stays -1.
    # seq 1: offset 2; positions 2..4 get 1, 2, 3.
    assert out[..., 0, 0].tolist() == [[-1, -1, 4, 5, -1], [-1, -1, 1, 2, 3]]
    # Response token t is scored at column prompt_width - 1 + t: 2..3 for r = 2, 2..4 for r = 3.
    assert scoring.tolist() == [[False, False, True, True, False], [False, False, True, True, True]]


def test_place_rows_refuses_what_does_not_fit_naming_the_field():
    one = [np.zeros((3, 1, 1), np.int16)]
    with pytest.raises(RouteLayoutError, match=r"f of sequence 0 has 3 route rows from position 0; its 2 prompt \+ 3 "
                                               r"response tokens need 4"):
        place_rows(one, [2], [3], starts=[0], prompt_width=2, length=4, field="f")
    with pytest.raises(RouteLayoutError, match="a 3-token prompt and 1-token response do not fit a prompt width of 2"):
        place_rows(one, [3], [1], starts=[0], prompt_width=2, length=4, field="f")
    with pytest.raises(RouteLayoutError, match=r"f of sequence 1 has shape \[3, 2, 1\]; expected \[tokens, 1, 1\]"):
        place_rows([one[0], np.zeros((3, 2, 1))], [1, 1], [1, 1], starts=[0, 0], prompt_width=1, length=1, field="f")
    with pytest.raises(RouteLayoutError, match="f: 1 sequences but 2 prompt lengths"):
        place_rows(one, [1, 1], [1], starts=[0], prompt_width=1, length=1, field="f")


def test_vllm_rows_joins_the_split_layout_and_passes_the_one_array_through():
    routed = np.array([[[7, 1]], [[2, 3]]])  # [2 response rows, 1 layer, top-2]
    prompt = np.array([[[0, 4]], [[5, 6]], [[9, 9]]])  # 3 rows for a 2-token prompt: the extra one is dropped
    rows, start = vllm_rows(routed, prompt, 2, start=5, field="r", prompt_field="p")
    assert start == 0 and rows[..., 0, :].tolist() == [[0, 4], [5, 6], [7, 1], [2, 3]]
    rows, start = vllm_rows(routed, None, 2, start=1, field="r", prompt_field="p")
    assert start == 1 and rows is routed
    with pytest.raises(RouteLayoutError, match=r"p has shape \[1, 1, 2\]; expected \[2, 1, 2\]"):
        vllm_rows(routed, prompt[:1], 2, start=0, field="r", prompt_field="p")


def test_expert_ids_keep_the_unrouted_sentinel_and_refuse_what_is_not_an_expert():
    ids = expert_ids(np.array([[[0, 7]], [[-1, -1]]]), "f", 8)  # [2 tokens, 1 layer, top-2]
    assert ids.dtype == np.int16 and ids[..., 0, :].tolist() == [[0, 7], [-1, -1]]
    with pytest.raises(RouteLayoutError, match=r"f \(1, 1, 2\) holds expert ids 3\.\.8; valid ids are 0\.\.7"):
        expert_ids(np.array([[[3, 8]]]), "f", 8)
    with pytest.raises(RouteLayoutError, match=r"f \(1, 1, 2\) holds expert ids -2\.\.1"):
        expert_ids(np.array([[[-2, 1]]]), "f", 8)
    # uint8 names at most 256 experts: a 300-expert model's uint8 ids have wrapped, even when they look valid.
    assert expert_ids(np.array([[[255, 1]]], np.uint8), "f", 256).tolist() == [[[255, 1]]]
    with pytest.raises(RouteLayoutError, match="f is uint8, which cannot hold the ids of 300 experts"):
        expert_ids(np.array([[[5, 1]]], np.uint8), "f", 300)
