"""The definition of every metric moestab reports, once: pure numpy functions over arrays.

The trainer's step metrics (``moestab.recording.step_metrics``), the analyzers (``moestab.analysis``)
and the dashboard all call these, so a number in metrics.jsonl and the same number recomputed from
the per-token tables are one computation (docs/metrics.md lists every key and its function):

- ``routes``    comparing two route sets: the intersection kernel and ``change_rates``
                (changed, router_flip, token_flip, ...)
- ``kl``        per-token k1 / k3 estimators and the extreme-token threshold (F(2))
- ``mismatch``  rollout -> trainer log-prob mismatch (k1, k3, f2, chi2)
- ``ratios``    step ratio statistics (``w``, ``s``; the owner of ``log s``) and clip fractions (all minibatches
                and 2..n)
- ``clipping``  the one definition of a clip fraction, shared with the loss's diagnostics (numpy or torch)
- ``routing_share`` routing's share of the token log-ratio: free vs replayed routes on the update's weights
                (variance share, clip fractions, mean |log w|)
- ``experts``   expert load, load entropy, co-activation
- ``sampling``  sampling error of a budget's sampled rates and of their step mean
- ``paired``    paired differences over seeds and their t-interval (the controlled experiment, the dashboard)
- ``collapse_warning`` the collapse warning's rule over a run's per-step signals (z-scores against the run's
                own first steps), live and offline
- ``keys``      every metrics.jsonl key, declared once: type and shape, computing function, definition (the table
                docs/metrics.md's key reference is generated from)
"""
