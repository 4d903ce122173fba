"""Does recording under ``generate()`` work with the installed transformers? Checked, not assumed.

Recording a generation stitches a prefill and its KV-cached decode steps into one row per sequence; that depends on
how transformers hands the cache to the model (its keyword changed in 5.24). Two guards, so an incompatible release
is named instead of surfacing as an IndexError deep in a metric:

- ``expect_coverage(routes, attention_mask, ...)``: recorded routes must be ``[batch, seq, layers, top_k]`` with a
  route at exactly the real positions of the sequences they were recorded for;
- ``check_generate_recording(model)``: a tiny greedy ``generate()`` under the recorder must route as one full forward
  over the same tokens. ``moestab train``, ``moestab probe`` and the TRL integration run it once at start-up.
"""

from __future__ import annotations

import torch
from torch import nn

from moestab.routing.errors import IncompatibleTransformersError, RecordingError
from moestab.routing.routes import Routes

TESTED_TRANSFORMERS = ("5.6.0", "5.24.0")
"""The oldest and newest transformers CI runs (pyproject's lower bound and constraints.txt's pin; tested in
tests/test_project.py)."""

GENERATE_CHECK_MAX_MISMATCH = 0.2
"""Largest share of router decisions allowed to differ between ``generate()`` and a full forward in the start-up
check. A cached decode step computes attention in another order than the full forward, so in bf16 a near-tie may
flip; a decode step recorded at the wrong position or row instead differs in most decisions (two random top-2 picks
out of 8 experts share both experts 1 time in 28)."""


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def install_hint() -> str:
    oldest, newest = TESTED_TRANSFORMERS
    return (f"moestab is tested with transformers {oldest} to {newest}: pip install 'transformers=={newest}' "
            "(or set up with scripts/setup.sh, which installs the tested versions of constraints.txt)")


def expect_coverage(routes: Routes, attention_mask: torch.Tensor, *, family: str, where: str,
                    exact: bool = True) -> None:
    """Raise ``IncompatibleTransformersError`` unless ``routes`` has the shape of ``attention_mask`` (``[batch, seq]``,
    1 = real token) and a route at every real position; with ``exact``, at no other position either (without it,
    positions a caller masks afterwards, e.g. those ``generate()`` fed after an EOS, may hold routes). ``where``
    names what recorded them."""
    batch, seq = attention_mask.shape
    indices = routes.indices  # [batch', seq', layers, top_k]
    saw = f"routes of shape {list(indices.shape)} for sequences [batch, seq] = [{batch}, {seq}]"
    problem = None
    if tuple(indices.shape[:2]) != (batch, seq):
        problem = "the shape does not match"
    else:
        routed = (indices >= 0).all(-1).all(-1)  # [batch, seq]
        real = attention_mask.to(routed.device).bool()  # [batch, seq]
        missing = int((real & ~routed).sum())
        extra = int((routed & ~real).sum()) if exact else 0
        if missing or extra:
            problem = f"{missing} real position(s) have no route and {extra} padding position(s) have one"
    if problem is not None:
        raise IncompatibleTransformersError(
            f"{where}: recording under transformers {transformers_version()} (family {family}) gave {saw}: "
            f"{problem}. {install_hint()}"
        )


def check_generate_recording(model: nn.Module, *, prompt_len: int = 5, new_tokens: int = 3, seed: int = 0) -> None:
    """Record a tiny greedy ``generate()`` (two prompts, one left-padded) and one full forward over the tokens it
    produced; raise ``IncompatibleTransformersError`` (naming the transformers version, the family and what was seen)
    unless the two agree in shape, padding and, to ``GENERATE_CHECK_MAX_MISMATCH``, in the experts chosen.

    The model's mode and weights are left as they were; it must be unsharded (run this before FSDP).
    """
    from moestab.routing.recorder import RoutingRecorder

    family = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    device = next(model.parameters()).device
    vocab = int(model.get_input_embeddings().num_embeddings)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(3, vocab - 1), min(vocab, 64), (2, prompt_len), generator=generator).to(device)
    prompt_mask = torch.ones_like(ids)  # [2, P]
    prompt_mask[1, :2] = 0  # row 1 is left-padded
    pad = int(ids[1, 0])
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            with RoutingRecorder(model, margin=False, entropy=False, verify=False) as generated:
                out = model.generate(input_ids=ids, attention_mask=prompt_mask, do_sample=False,
                                     max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None,
                                     pad_token_id=pad)
            sequences = out if isinstance(out, torch.Tensor) else out.sequences  # [2, P + new]
            inputs = sequences[:, :-1]  # [2, L]: the last sampled token is never fed
            mask = torch.cat([prompt_mask, torch.ones_like(inputs[:, prompt_len:])], dim=1)  # [2, L]
            with RoutingRecorder(model, margin=False, entropy=False, verify=False) as forward:
                model(input_ids=inputs, attention_mask=mask)
    except RecordingError as exc:
        raise IncompatibleTransformersError(
            f"start-up check of recording under generate() failed on transformers {transformers_version()} "
            f"(family {family}): {exc}. {install_hint()}"
        ) from exc
    finally:
        model.train(was_training)
    where = "start-up check of recording under generate()"
    expect_coverage(generated.routes, mask, family=family, where=where)
    real = mask.bool().to(generated.routes.indices.device)  # [2, L]
    a = generated.routes.indices[real].sort(-1).values  # [real, layers, top_k]
    b = forward.routes.indices.to(a.device)[real].sort(-1).values  # [real, layers, top_k]
    mismatch = float((a != b).any(-1).float().mean())
    if mismatch > GENERATE_CHECK_MAX_MISMATCH:
        raise IncompatibleTransformersError(
            f"{where}: under transformers {transformers_version()} (family {family}) {mismatch:.0%} of router "
            f"decisions recorded during generate() differ from one full forward over the same tokens (allowed: "
            f"{GENERATE_CHECK_MAX_MISMATCH:.0%}); the decode steps are not recorded where they ran. {install_hint()}"
        )
