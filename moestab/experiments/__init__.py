"""Experiments: the grid runner, figures and notebook executor shared by notebooks/ and scripts/.

- ``grid``: a list of ``moestab train`` configs over axes x seeds, run (finished runs reused) and read back;
- ``stability``: one run's instability measures (collapse, gradient spikes, reward gain);
- ``controlled``: issue 26's pre-registered controlled experiment (scan, choose, evaluate, report;
  docs/controlled.md); ``paired``: paired differences and their t-interval;
- ``collapse_study``: issue 57's registered study of the collapse warning (onsets, hits, false alarms, the
  candidates' calibration and choice on development runs, the held-out report; docs/collapse.md);
- ``figures``: mean +- sd curves over seeds (one axes, or one small panel per group), paired intervals, a warning
  rule's per-run timelines and recall curves;
- ``notebooks``: execute a jupytext notebook at a named size (``smoke`` / ``full``), papermill-style, and find
  the output lines a committed notebook must not show (machine paths, progress bars, warnings).
"""
