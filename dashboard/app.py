"""``streamlit run dashboard/app.py -- [RUNS_DIR]`` from a source checkout: the packaged dashboard.

The app lives in ``moestab/dashboard/`` (so it ships in the wheel; ``moestab dashboard`` runs it there); this file
is kept so that the documented ``streamlit run`` keeps working. ``.streamlit/config.toml`` at the repository root
makes that command headless (no first-run e-mail prompt) with usage statistics off.
"""

from moestab.dashboard.app import main

main()
