"""One unit per quantity on every surface (issue 54.4): a share reads the same in `moestab analyze`'s table and
`moestab compare`'s text (percent, from moestab.analysis.labels), while JSON keeps the fraction."""

from __future__ import annotations

import json

from moestab.analysis.labels import format_value
from moestab.metrics import keys
from tests.support.runs import write_run

KEY = keys.ROUTING_CHANGED.format(pair="old_new")


def test_a_share_reads_the_same_in_analyze_and_compare(tmp_path, cli_main, capsys):
    run = write_run(tmp_path, "a")
    assert cli_main(["analyze", str(run.path), "--json"]) == 0
    fraction = json.loads(capsys.readouterr().out)[0]["old_new_changed"]
    shown = format_value(fraction, True)
    assert shown.endswith("%") and 0 < fraction < 1
    assert cli_main(["analyze", str(run.path)]) == 0
    table = capsys.readouterr().out
    line = next(x for x in table.splitlines() if x.startswith("old_new_changed "))
    assert line.split()[-1] == shown
    assert next(x for x in table.splitlines() if x.startswith("rollout_old_k3 ")).split()[-1][-1].isdigit()  # nats
    assert cli_main(["compare", str(run.path), "--metric", KEY]) == 0
    assert f"all runs: {shown}  (1 runs)" in capsys.readouterr().out
