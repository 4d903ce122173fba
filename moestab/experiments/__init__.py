"""Experiments: the grid runner, figures and notebook executor shared by notebooks/ and scripts/.

- ``grid``: a list of ``moestab train`` configs over axes x seeds, run (finished runs reused) and read back;
- ``figures``: mean +- sd curves over seeds;
- ``notebooks``: execute a jupytext notebook at a named size (``smoke`` / ``full``), papermill-style.
"""
