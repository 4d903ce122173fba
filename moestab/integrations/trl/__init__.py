"""moestab's routing records inside TRL's ``GRPOTrainer`` (GRPO and GSPO): ``pip install trl`` (tested: trl 1.16).

    from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings

    args = GRPOConfig(importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4, ...)
    trainer = MoestabGRPOTrainer(model=model, args=args, reward_funcs=reward, train_dataset=data,
                                 moestab=RecordSettings("runs/trl-gspo"))
    trainer.train()  # runs/trl-gspo: run.json, metrics.jsonl, tokens/ (docs/run-format.md)

GSPO is ``importance_sampling_level="sequence"`` *with* ``loss_type="grpo"`` and GRPO ``"token"`` with it (TRL's
default loss, ``"dapo"``, sums tokens and is neither): run.json's ``algo`` is then ``gspo (trl-grpo-sequence)`` or
``grpo (trl-grpo-token)``, otherwise ``trl-<loss_type>-<importance_sampling_level>``
(:func:`~moestab.integrations.trl.settings.algo_label`; README, "Inside TRL's GRPOTrainer", has both papers' settings).

``RoutingRecords`` is the same as a mixin for a ``GRPOTrainer`` subclass of your own. The run folder is written by
``moestab.run_folder`` with the step metrics and token tables of ``moestab train`` (the recording layer,
``moestab.recording``, that both call), so ``moestab analyze`` and the dashboard read it unchanged.

**Why a subclass hook, not a ``TrainerCallback``.** Callbacks receive the model but never the batch: the
advantages (hence which ratios the loss clipped) and TRL's pi_old log-probs are only in the micro-batch that
``Trainer.compute_loss`` receives. ``RoutingRecords`` overrides ``train``, ``training_step``, ``compute_loss`` and
``log`` (methods ``transformers.Trainer`` documents for overriding), each calling TRL's own, and adds a callback for
the end of each optimizer step. TRL's classes are not patched.

**Trackers.** Each written step's numbers also go through TRL's own ``log``, so to whatever ``report_to`` TRL has
(TensorBoard, W&B, trackio, ...) and to ``trainer.state.log_history``: under ``moestab/<key>`` (metrics.jsonl's keys,
per-layer lists as ``<key>/<index>``; :func:`moestab.recording.trackers.scalars`, the rule ``moestab train --report-to``
follows), with TRL's log of the step's last optimizer step (``global_step`` = moestab step x optimizer steps per
generation batch; transformers' TensorBoard, W&B and trackio callbacks show ``train/moestab/...``). ``experts/load``
goes as its summary (max and mean load violation, dead experts) unless
``RecordSettings(report_expert_load_matrix=True)``. With ``logging_steps`` longer than a step, each key is the mean over
the steps written since TRL's last log, as TRL merges its own; with ``logging_strategy="no"`` nothing is sent
(metrics.jsonl is written either way).

**A step** is one TRL generation batch and the optimizer steps made from it (``steps_per_generation *
num_iterations / gradient_accumulation_steps`` of them: moestab's minibatches,
:class:`~moestab.integrations.trl.settings.CycleLayout`). TRL's ``max_steps`` counts optimizer steps, so a run has
``max_steps // (steps_per_generation * num_iterations / gradient_accumulation_steps)`` moestab steps: ``max_steps=2``
with ``steps_per_generation=2`` (and the defaults ``num_iterations=1``, ``gradient_accumulation_steps=1``) is ONE
moestab step of two minibatches. The run folder has no ``checkpoints/`` or ``state/`` (TRL saves its own). Hooks
(``RoutingRecorder`` and :class:`~moestab.integrations.trl.capture.ForwardCapture`) are installed around each
``training_step`` and removed on exit. Per step:

- *rollout*: the routes of TRL's ``model.generate()`` (prefill and KV-cached decode steps) and each sampled token's
  log-prob under ``softmax(logits / T)`` of the step that sampled it, ``T`` the temperature of TRL's generation
  config. Exact for TRL's default sampling; with ``top_k``, ``top_p < 1``, ``min_p``, ``repetition_penalty != 1``
  or ``do_sample=False`` the engine sampled from another distribution, and ``logp_rollout`` is still the
  untruncated one at ``T`` (the distribution TRL's trainer side scores).
- *pi_old*: when TRL computes it (``steps_per_generation * num_iterations > gradient_accumulation_steps``: more
  than one optimizer step per generation batch), its no-grad forward, checked equal to the
  ``old_per_token_logps`` TRL's ratio used. Otherwise TRL's ratio is exactly 1 (it uses the loss forward's own
  log-probs, detached) and pi_old is the loss forward itself, so ``log_w`` and update->old drift are exactly 0.
- *update*: TRL's loss forward of each micro-batch; with ``num_iterations > 1`` each sequence is trained on
  several times and the last pass is kept (its ``minibatch`` is the optimizer step of that pass).
- *pi_new*: one more no-grad forward after the step's last optimizer step, on exactly pi_old's inputs and chunks
  (TRL's own kwargs, under its autocast), so with no update in between old->new volatility is exactly 0 (a step
  whose old->new change is 0 because nothing moved, or because the updates were too small to change a route, is
  warned about once, logged and in run.json's ``warnings``: :mod:`~moestab.integrations.trl.stillness`). This is
  the recorder's main cost (docs/benchmarks.md): ``RecordSettings(budget=MeasureBudget(fraction=f, every=N))``
  re-runs a seeded share ``f`` of pi_old's chunks (old->new is then measured on those sequences, with its sampling
  error) and records every N-th step only, as ``moestab train --measure-fraction f --measure-every N`` does.
- *routing's share of the ratio* (``RecordSettings(routing_share=True)``, off by default; ``routing_share/*``
  keys): after each loss forward of the last pass, before its optimizer step, the same call again without grad on
  the same weights with pi_old's routes replayed (``RoutingReplay``, outside the capture, random generators as the
  loss forward found them and restored after): TRL's update routes freely, so this is the replayed side and the
  loss forward the free side, as ``moestab train --routing-share`` under ``off``. When TRL computes no pi_old, pi_old
  is the loss forward itself and its replayed side is that forward (no extra forward runs).
- *clipped*: ``moestab.rl.compute_clipped_mask`` with TRL's ``epsilon``/``epsilon_high``,
  ``importance_sampling_level`` and advantages (``ppo-clip`` for grpo/bnpo/dr_grpo/dapo/luspo, ``cispo`` for
  cispo; cross-checked against TRL's loss in tests/rl/test_trl_crosscheck.py). TRL's ``delta``, entropy mask and
  off-policy mask change the loss, not which ratios are clipped, and are not reflected.

**Not available, never made up:** the per-sequence *reward* (TRL keeps only the advantages in the micro-batch), so
the token tables' ``reward`` column is NaN and ``reward/mean``, ``accuracy`` and ``eval/accuracy`` are not
written; TRL's loss terms, grad norm and KL (``loss``, ``grad_norm``, ``loss/*``: TRL logs them itself). Not
supported (refused with the reason before training): vLLM and continuous-batching generation (generation outside
the policy module's forward), several processes, tools / environments / ``rollout_func`` (completions hold tokens
the policy did not sample), loss types ``sapo`` and ``vespo`` (no clipped ratio), resuming from a checkpoint. A
generation batch cut off by the end of training is not written.

**Differences from ``moestab train`` that are TRL's.** TRL runs pi_old in its own chunks of the unshuffled batch
and the updates on shuffled micro-batches, so the first update's ``log_w`` is 0 only up to batch-composition
rounding (not bit for bit). With ``bf16=True`` (``GRPOConfig``'s default) TRL's ``generate()`` and its scoring
forwards disagree more (on the test's tiny model on CPU, max |d logp| 7e-3 against 1e-6 with ``bf16=False``): the
recorded rollout->trainer mismatch includes that gap, as it should. Tested on CPU with
Qwen3-MoE, DeepSeek-V3, GPT-OSS and Mixtral; PEFT models and reference models (``beta > 0``) are untested.
"""

try:
    import trl  # noqa: F401  (the integration's dependency, checked here so the error says what to install)
except ModuleNotFoundError as exc:
    if exc.name != "trl":
        raise
    from moestab.extras import install_line

    raise ImportError(f"moestab.integrations.trl needs TRL: {install_line('trl')} (tested with trl 1.16)") from exc

from moestab.integrations.trl.settings import RecordSettings
from moestab.integrations.trl.trainer import MoestabGRPOTrainer, RoutingRecords, TrlRecords

__all__ = ["MoestabGRPOTrainer", "RecordSettings", "RoutingRecords", "TrlRecords"]
