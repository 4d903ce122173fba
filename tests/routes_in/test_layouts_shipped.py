"""Route layouts RL frameworks ship today (docs/integrations.md, "Layouts people ship today"): known routes are
encoded here by each layout's own rules (written from the framework's source, with numpy and loops, not moestab's
code), imported, and compared with what moestab's layout must hold, -1 positions included; a payload with a wrong
field, shape or dtype is refused with a message that names it.

The running example (hand-worked): 2 sequences, 2 MoE layers, top-2.
- sequence 0: 3 prompt + 2 response tokens -> input positions 0..3 (the last response token is never an input);
- sequence 1: 2 prompt + 3 response tokens -> input positions 0..3.
moestab's layout with P prompt and R response columns: sequence i's position ``pos`` sits at column ``P - p_i + pos``
and response token ``t`` is scored at column ``P - 1 + t``; everything else is -1.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from moestab.routes_in import PayloadError, import_routes

PROMPTS, RESPONSES, LAYERS, TOP_K = (3, 2), (2, 3), 2, 2


def known_rows(num_experts: int, seed: int, unrouted: tuple[tuple[int, int, int], ...] = ()) -> list[np.ndarray]:
    """Each sequence's routes at its input positions, ``[p + r - 1, LAYERS, TOP_K]``: distinct experts per decision,
    the highest ids of the model among them; decisions ``(sequence, position, layer)`` in ``unrouted`` are all -1."""
    gen = np.random.default_rng(seed)
    rows = []
    for p, r in zip(PROMPTS, RESPONSES, strict=True):
        seq = np.stack([[gen.permutation(num_experts)[:TOP_K] for _ in range(LAYERS)] for _ in range(p + r - 1)])
        seq[0, 0] = [num_experts - 1, num_experts - 2]  # the widest ids the payload must carry
        rows.append(seq.astype(np.int64))
    for i, pos, layer in unrouted:
        rows[i][pos, layer] = -1
    return rows


def expected(rows: list[np.ndarray], width_p: int = 3, width_r: int = 3,
             trained: list[list[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """moestab's layout, one position at a time."""
    out = -np.ones((len(rows), width_p + width_r - 1, LAYERS, TOP_K), np.int16)
    scoring = np.zeros(out.shape[:2], bool)
    for i, (seq, p, r) in enumerate(zip(rows, PROMPTS, RESPONSES, strict=True)):
        for pos in range(p + r - 1):
            out[i, width_p - p + pos] = seq[pos]
        for t in range(r):
            scoring[i, width_p - 1 + t] = trained is None or bool(trained[i][t])
    return out, scoring


def assert_routes(imported, rows: list[np.ndarray], **layout) -> None:
    out, scoring = expected(rows, **layout)
    assert imported.routes.indices.dtype == torch.int16
    assert imported.routes.indices.numpy().tolist() == out.tolist()
    assert imported.scoring.numpy().tolist() == scoring.tolist()
    assert imported.response_routes().numpy().tolist() == out[scoring].tolist()


def b64(arr: np.ndarray, dtype: str) -> str:
    """C-order little-endian bytes of ``arr`` as ``dtype``, base64."""
    return base64.b64encode(np.ascontiguousarray(arr).astype(np.dtype(dtype).newbyteorder("<")).tobytes()).decode()


# ---- verl: int16 routed_experts (PR #7407), its uint8 transport view, R2's jagged record -----------------------------
VERL_EXPERTS = 300  # ids above 255: both bytes of an int16 id matter


def verl_batch(rows: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """The agent loop's DataProto tensors: ``routed_experts`` int16 ``[batch, P + R, layers, top_k]``, prompts
    left-padded, responses right-padded, zero where nothing was routed (padding and the last token's row)."""
    width_p, width_r = max(PROMPTS), max(RESPONSES)
    routed = torch.zeros(len(rows), width_p + width_r, LAYERS, TOP_K, dtype=torch.int16)
    attention = torch.zeros(len(rows), width_p + width_r, dtype=torch.long)
    response_mask = torch.zeros(len(rows), width_r, dtype=torch.long)
    for i, (seq, p, r) in enumerate(zip(rows, PROMPTS, RESPONSES, strict=True)):
        for pos in range(p + r - 1):
            routed[i, width_p - p + pos] = torch.tensor(seq[pos], dtype=torch.int16)
        attention[i, width_p - p : width_p + r] = 1
        response_mask[i, :r] = 1
    return {"routed_experts": routed, "responses": torch.zeros(len(rows), width_r, dtype=torch.long),
            "attention_mask": attention, "response_mask": response_mask}


def test_verl_int16_routes_and_their_uint8_transport_view():
    rows = known_rows(VERL_EXPERTS, seed=0)
    batch = verl_batch(rows)
    assert (batch["routed_experts"] > 255).any()  # the high byte carries information
    assert_routes(import_routes("verl", batch, num_experts=VERL_EXPERTS), rows)
    ids = batch["routed_experts"].numpy().astype(np.int64)  # [B, P + R, layers, k]
    low, high = ids & 0xFF, (ids >> 8) & 0xFF  # int16 little-endian: low byte first, per slot
    view = np.stack([low, high], axis=-1).reshape(*ids.shape[:-1], 2 * TOP_K).astype(np.uint8)  # [..., 2 * top_k]
    batch["routed_experts"] = torch.from_numpy(view)
    assert_routes(import_routes("verl", batch, num_experts=VERL_EXPERTS, top_k=TOP_K), rows)
    with pytest.raises(PayloadError, match=r"is uint8: either expert ids .* pass top_k to say which"):
        import_routes("verl", batch, num_experts=VERL_EXPERTS)  # the byte view read as ids: top_k not given


def test_verl_r2_jagged_record_sits_on_the_real_tokens():
    rows = known_rows(VERL_EXPERTS, seed=1)
    batch = verl_batch(rows)
    gen = np.random.default_rng(9)
    samples = []  # the new engines' R2 record: every real token of a sample, the last one's route included
    for seq in rows:
        last = np.stack([gen.permutation(VERL_EXPERTS)[:TOP_K] for _ in range(LAYERS)])[None]
        samples.append(np.concatenate([seq, last]).astype(np.int16))
    offsets = torch.tensor([0, *np.cumsum([len(s) for s in samples])])
    batch["routed_experts"] = torch.nested.nested_tensor_from_jagged(torch.from_numpy(np.concatenate(samples)),
                                                                     offsets=offsets)
    assert_routes(import_routes("verl", batch, num_experts=VERL_EXPERTS), rows)
    batch["routed_experts"] = [torch.from_numpy(samples[0]), torch.from_numpy(samples[1][:-1])]
    with pytest.raises(PayloadError, match=r"batch\['routed_experts'\]\[1\] has shape \[4, 2, 2\] \(int16\); valid: "
                                           r"\[5 real tokens of batch\['attention_mask'\]\[1\]"):
        import_routes("verl", batch, num_experts=VERL_EXPERTS)
    batch["routed_experts"] = verl_batch(rows)["routed_experts"][0]
    with pytest.raises(PayloadError, match=r"must be \[batch, prompt_len \+ response_len, layers, top_k\], got shape "
                                           r"\[6, 2, 2\] \(int16\)"):
        import_routes("verl", batch, num_experts=VERL_EXPERTS)


# ---- NeMo-RL: nrlre1:<dtype>:<S>x<L>x<K>:<base64>, -1 = not routed -----------------------------------------------
def nrlre1(arr: np.ndarray, dtype: str) -> str:
    return f"nrlre1:{dtype}:{arr.shape[0]}x{arr.shape[1]}x{arr.shape[2]}:{b64(arr, dtype)}"


def nemo_rl_full(seq: np.ndarray) -> np.ndarray:
    """NeMo-RL's whole-sequence array ``[p + r, layers, top_k]``: the routes (-1 rows where vLLM returned none), then
    the final token's placeholder row ``0 .. K - 1``."""
    return np.concatenate([seq, np.broadcast_to(np.arange(TOP_K), (1, LAYERS, TOP_K))])


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32"])
def test_nemo_rl_envelope_on_chat_choices(dtype):
    rows = known_rows(100, seed=2)
    rows[1][-1] = -1  # sequence 1's last input position: vLLM returned no route
    choices = [{"index": 0, "message": {"role": "assistant", "routed_experts": nrlre1(nemo_rl_full(seq), dtype),
                                        "prompt_token_ids": list(range(p)), "generation_token_ids": list(range(r))}}
               for seq, p, r in zip(rows, PROMPTS, RESPONSES, strict=True)]
    assert choices[1]["message"]["routed_experts"].startswith(f"nrlre1:{dtype}:5x2x2:")
    assert_routes(import_routes("nemo-rl", choices, num_experts=100), rows)


def test_nemo_rl_gym_items_and_legacy_lists():
    rows = known_rows(100, seed=3)
    items = [SimpleNamespace(routed_experts=nemo_rl_full(seq).tolist(), prompt_token_ids=[7] * p,
                             generation_token_ids=[8] * r) for seq, p, r in zip(rows, PROMPTS, RESPONSES, strict=True)]
    assert_routes(import_routes("nemo-rl", items, num_experts=100), rows)


def test_nemo_rl_bad_envelopes_name_what_is_wrong():
    seq = nemo_rl_full(known_rows(100, seed=4)[0])

    def one(routed_experts, num_experts=100):
        item = {"routed_experts": routed_experts, "prompt_token_ids": [0] * 3, "generation_token_ids": [0] * 2}
        return import_routes("nemo-rl", [item], num_experts=num_experts)

    with pytest.raises(PayloadError, match=r"outputs\[0\]\.routed_experts is not an 'nrlre1:<dtype>:<S>x<L>x<K>"):
        one("nrlre2" + nrlre1(seq, "int16")[6:])
    with pytest.raises(PayloadError, match=r"dtype 'int64' is not one this sender writes; valid: int8, int16, int32"):
        one(nrlre1(seq, "int16").replace(":int16:", ":int64:"))
    with pytest.raises(PayloadError, match=r"shape \[6, 2, 2\] \(expected \[tokens, layers, top_k\]\) does not match "
                                           r"its data, 20 int16 ids"):
        one(nrlre1(seq, "int16").replace(":5x2x2:", ":6x2x2:"))
    partial = seq.copy()
    partial[1, 0, 1] = -1
    with pytest.raises(PayloadError, match=r"has a decision at \[1, 0\] that is partly -1"):
        one(nrlre1(partial, "int16"))
    with pytest.raises(PayloadError, match=r"is int8, which cannot hold the ids of 200 experts"):
        one(nrlre1(seq, "int8"), num_experts=200)
    with pytest.raises(PayloadError, match=r"sequence 0 has 3 route rows from position 0; its 3 prompt \+ 2 response "
                                           r"tokens need 4"):
        one(nrlre1(seq[:3], "int16"))
    # issue 55.7: 100 rows for a 5-token sequence (another sequence's routes) were read with 95 rows dropped
    with pytest.raises(PayloadError, match=r"outputs\[0\]\.routed_experts has 100 rows from position 0, past the "
                                           r"sequence's 5 tokens \(3 prompt \+ 2 response\)"):
        one(nrlre1(np.concatenate([seq] * 20), "int16"))
    # a shape whose product wraps around int64 to 0 matched an empty payload, then failed in numpy's reshape
    with pytest.raises(PayloadError, match=r"shape \[4294967296, 4294967296, 1\] \(expected \[tokens, layers, "
                                           r"top_k\]\) does not match its data, 0 int16 ids"):
        one("nrlre1:int16:4294967296x4294967296x1:")


# ---- SkyRL: compact payload {data, shape, dtype} -----------------------------------------------------------------
def skyrl_packed(arr: np.ndarray) -> dict:
    """SkyRL's ``pack_routed_experts``: the narrowest of uint8 / int16 / int32 that holds the largest id."""
    dtype = "uint8" if arr.max() < 2**8 else "int16" if arr.max() < 2**15 else "int32"
    return {"data": b64(arr, dtype), "shape": list(arr.shape), "dtype": dtype}


def skyrl_output(rows: list[np.ndarray], packed: bool = True) -> dict:
    """A ``GeneratorOutput``: sequence 0 keeps vLLM's ``p + r - 1`` rows, sequence 1 one more (SkyRL trims to at
    most ``p + r``); sequence 1's last response token has loss mask 0."""
    arrays = [rows[0], np.concatenate([rows[1], rows[1][:1]])]
    return {"prompt_token_ids": [[1] * p for p in PROMPTS], "response_ids": [[2] * r for r in RESPONSES],
            "loss_masks": [[1, 1], [1, 1, 0]],
            "rollout_expert_indices": [skyrl_packed(a) if packed else a for a in arrays]}


@pytest.mark.parametrize(("experts", "dtype"), [(8, "uint8"), (300, "int16")])
def test_skyrl_compact_payload_and_generator_arrays(experts, dtype):
    rows = known_rows(experts, seed=5)
    output = skyrl_output(rows)
    assert {p["dtype"] for p in output["rollout_expert_indices"]} == {dtype}
    assert_routes(import_routes("skyrl", output, num_experts=experts), rows, trained=output["loss_masks"])
    assert_routes(import_routes("skyrl", skyrl_output(rows, packed=False), num_experts=experts), rows,
                  trained=output["loss_masks"])


def test_skyrl_payloads_its_decoder_refuses_are_refused():
    rows = known_rows(8, seed=6)
    output = skyrl_output(rows)
    wide = dict(output["rollout_expert_indices"][0], dtype="int16", data=b64(rows[0], "int16"))
    with pytest.raises(PayloadError, match=r"rollout_expert_indices\[0\]\.dtype is int16 for a largest id of 7; "
                                           r"SkyRL's compact payload sends uint8"):
        import_routes("skyrl", dict(output, rollout_expert_indices=[wide, wide]), num_experts=8)
    other = dict(output["rollout_expert_indices"][0], dtype="uint16")
    with pytest.raises(PayloadError, match=r"\[0\]\.dtype: dtype 'uint16' is not one this sender writes; valid: "
                                           r"uint8, int16, int32"):
        import_routes("skyrl", dict(output, rollout_expert_indices=[other, other]), num_experts=8)
    negative = [r.copy() for r in rows]
    negative[1][0, 0, 0] = -1
    with pytest.raises(PayloadError, match=r"rollout_expert_indices\[1\] \[4, 2, 2\] \(int64\) holds id -1; SkyRL "
                                           r"sends ids >= 0 only"):
        import_routes("skyrl", dict(output, rollout_expert_indices=negative), num_experts=8)
    with pytest.raises(PayloadError, match=r"generator_output\.loss_masks\[1\] must be \[3\], got shape \[2\]"):
        import_routes("skyrl", dict(output, loss_masks=[[1, 1], [1, 1]]), num_experts=8)
    huge = [skyrl_packed(np.full((4, LAYERS, TOP_K), 40_000))] * 2  # int32: ids past moestab's int16 routes
    assert huge[0]["dtype"] == "int32"
    with pytest.raises(PayloadError, match=r"num_experts=40001, but moestab's int16 routes hold ids 0\.\.32767"):
        import_routes("skyrl", dict(output, rollout_expert_indices=huge), num_experts=40_001)


# ---- tunix / MaxText: [batch, prompt_width + completion_width, layers, top_k], -1 = UNSET_ROUTED_EXPERT ----------
TUNIX_WIDTHS = (4, 4)  # padded prompt and completion widths, wider than any sequence here


def tunix_stream(rows: list[np.ndarray]) -> np.ndarray:
    """tunix's ``align_routed_experts``: each rollout's ``[p + c, layers, top_k]`` (vLLM's ``p + c - 1`` rows plus
    the -1 row tunix pads short captures with) split at ``p``; the prompt part right-aligned before
    ``prompt_width``, the completion part from ``prompt_width`` on; -1 everywhere else."""
    width_p, width_c = TUNIX_WIDTHS
    stream = np.full((len(rows), width_p + width_c, LAYERS, TOP_K), -1, np.int32)
    for i, (seq, p, c) in enumerate(zip(rows, PROMPTS, RESPONSES, strict=True)):
        rollout = np.concatenate([seq, np.full((1, LAYERS, TOP_K), -1)])  # [p + c, layers, k]
        for token in range(p):
            stream[i, width_p - p + token] = rollout[token]
        for token in range(c):
            stream[i, width_p + token] = rollout[p + token]
    return stream


def test_tunix_and_maxtext_padded_stream():
    rows = known_rows(16, seed=7, unrouted=((0, 1, 1),))  # one decision the trainer routes itself
    stream = tunix_stream(rows)
    mask = [[1, 1, 0, 0], [1, 0, 1, 0]]  # sequence 1's token 1 came from the environment; zeros past each end
    layout = {"width_p": TUNIX_WIDTHS[0], "width_r": TUNIX_WIDTHS[1], "trained": mask}
    imported = import_routes("tunix", stream, num_experts=16, completion_mask=np.array(mask))
    assert_routes(imported, rows, **layout)
    assert imported.routes.indices[0, 2, 1].tolist() == [-1, -1]  # the unrouted decision: position 1 at column 2
    layers_first = np.ascontiguousarray(stream.swapaxes(1, 2))  # [batch, layers, length, top_k]
    assert_routes(import_routes("tunix", torch.from_numpy(layers_first), num_experts=16, layers_first=True,
                                completion_mask=torch.tensor(mask)), rows, **layout)
    maxtext = import_routes("maxtext", stream, num_experts=16, completion_mask=np.array(mask))
    assert_routes(maxtext, rows, **layout)
    assert maxtext.source == "maxtext"


def test_tunix_bad_arrays_name_the_shape():
    stream = tunix_stream(known_rows(16, seed=8))
    mask = np.ones((2, 4))
    with pytest.raises(PayloadError, match=r"tunix routed_experts must be \[batch, length, layers, top_k\], got shape "
                                           r"\[8, 2, 2\] \(int32\)"):
        import_routes("tunix", stream[0], num_experts=16, completion_mask=mask)
    with pytest.raises(PayloadError, match=r"completion_mask must be \[batch, completion_width\] = \[2, C\] with 1 <= "
                                           r"C < 8 .* got shape \[2, 8\]"):
        import_routes("tunix", stream, num_experts=16, completion_mask=np.ones((2, 8)))
    stream[1, 3, 0, 1] = -1
    with pytest.raises(PayloadError, match=r"tunix routed_experts \[2, 7, 2, 2\] \(int32\) has a decision at "
                                           r"\[1, 3, 0\] that is partly -1"):
        import_routes("tunix", stream, num_experts=16, completion_mask=mask)


# ---- slime: Sample.rollout_routed_experts [len(tokens) - 1, num_layers, top_k] int32 ------------------------------
def slime_samples(rows: list[np.ndarray], dense_first: int = 1) -> list[dict]:
    """``Sample`` fields: SGLang's int32 routes from the first token through the penultimate one, one row per decoder
    layer (``dense_first`` dense layers, zero)."""
    out = []
    for seq, p, r in zip(rows, PROMPTS, RESPONSES, strict=True):
        routes = np.concatenate([np.zeros((len(seq), dense_first, TOP_K), np.int64), seq], axis=1)
        out.append({"tokens": list(range(p + r)), "response_length": r, "loss_mask": [1] * (r - 1) + [0],
                    "rollout_routed_experts": torch.from_numpy(routes.astype(np.int32))})
    return out


def test_slime_samples_objects_and_train_data():
    rows = known_rows(32, seed=10)
    samples = slime_samples(rows)
    trained = [s["loss_mask"] for s in samples]
    assert_routes(import_routes("slime", samples, num_experts=32, moe_layers=[1, 2]), rows, trained=trained)
    objects = [SimpleNamespace(**s) for s in samples]
    assert_routes(import_routes("slime", objects, num_experts=32, moe_layers=[1, 2]), rows, trained=trained)
    train_data = {"tokens": [s["tokens"] for s in samples], "response_lengths": list(RESPONSES),
                  "loss_masks": trained, "rollout_routed_experts": [s["rollout_routed_experts"] for s in samples]}
    imported = import_routes("slime", train_data, num_experts=32, moe_layers=[1, 2])
    assert_routes(imported, rows, trained=trained)
    assert imported.routes.layers == (1, 2)


def test_slime_bad_samples_name_the_field():
    samples = slime_samples(known_rows(32, seed=11))
    short = [samples[0], dict(samples[1], rollout_routed_experts=samples[1]["rollout_routed_experts"][:3])]
    with pytest.raises(PayloadError, match=r"slime routed_experts of sequence 1 has 3 route rows from position 0; its "
                                           r"2 prompt \+ 3 response tokens need 4"):
        import_routes("slime", short, num_experts=32, moe_layers=[1, 2])
    with pytest.raises(PayloadError, match=r"samples\[0\]\.loss_mask must be \[2\], got shape \[3\]"):
        import_routes("slime", [dict(samples[0], loss_mask=[1, 1, 1]), samples[1]], num_experts=32)
    with pytest.raises(PayloadError, match=r"samples\[1\]\.rollout_routed_experts is None"):
        import_routes("slime", [samples[0], dict(samples[1], rollout_routed_experts=None)], num_experts=32)
    flat = [dict(s, rollout_routed_experts=s["rollout_routed_experts"].reshape(len(s["tokens"]) - 1, -1))
            for s in samples]
    with pytest.raises(PayloadError, match=r"samples\[0\]\.rollout_routed_experts must be \[tokens, layers, top_k\] "
                                           r"with top_k >= 1, got shape \[4, 6\] \(int32\)"):
        import_routes("slime", flat, num_experts=32)
    with pytest.raises(PayloadError, match=r"train_data's tokens, response_lengths, rollout_routed_experts"):
        import_routes("slime", {"tokens": [[0] * 5], "response_lengths": [2, 3], "rollout_routed_experts": [None]},
                      num_experts=32)


# ---- SGLang: meta_info["routed_experts_dtype"] int32 / uint16 / uint8 --------------------------------------------
def sglang_responses(rows: list[np.ndarray], dtype: str | None) -> list[dict]:
    """``/generate`` responses: base64 of the flat ``[positions, num_layers * top_k]`` array in ``dtype`` (int32 with
    no ``routed_experts_dtype`` field, SGLang's legacy form)."""
    out = []
    for seq, p, r in zip(rows, PROMPTS, RESPONSES, strict=True):
        wire = "int32" if dtype is None else dtype.strip().lower()  # SGLang normalizes the name it reads
        meta = {"routed_experts": b64(seq.reshape(len(seq), LAYERS * TOP_K), wire), "prompt_tokens": p,
                "completion_tokens": r, "routed_experts_start_len": 0}
        if dtype is not None:
            meta["routed_experts_dtype"] = dtype
        out.append({"text": "", "meta_info": meta})
    return out


@pytest.mark.parametrize(("dtype", "experts"), [(None, 300), ("int32", 300), ("uint16", 300), ("uint8", 256),
                                                (" UINT8 ", 256)])
def test_sglang_routed_experts_dtype_variants(dtype, experts):
    rows = known_rows(experts, seed=12, unrouted=((1, 2, 0),) if dtype in (None, "int32") else ())
    imported = import_routes("sglang", sglang_responses(rows, dtype), num_experts=experts, num_layers=LAYERS,
                             top_k=TOP_K)
    assert_routes(imported, rows)


def test_sglang_dtype_it_does_not_send_is_refused():
    rows = known_rows(300, seed=13)
    with pytest.raises(PayloadError, match=r"responses\[0\]\.meta_info\.routed_experts_dtype: dtype 'int16' is not "
                                           r"one this sender writes; valid: int32, uint16, uint8"):
        import_routes("sglang", sglang_responses(rows, "int16"), num_experts=300, num_layers=LAYERS, top_k=TOP_K)
    wrapped = sglang_responses([r % 256 for r in rows], "uint8")
    with pytest.raises(PayloadError, match=r"is uint8, which cannot hold the ids of 300 experts"):
        import_routes("sglang", wrapped, num_experts=300, num_layers=LAYERS, top_k=TOP_K)
