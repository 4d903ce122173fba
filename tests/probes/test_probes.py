"""moestab probe on plain Hugging Face folders of several families: invariants, the bf16 gap, and bad input."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from moestab.cli import main
from moestab.models.tokenizer import build_char_tokenizer
from moestab.probes import load_suite, read_probe_folder
from moestab.probes.collect import collect
from moestab.probes.compare import compare_records
from tests.support.probes import FAMILIES, probe, save_family


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_against_itself_changes_nothing(tmp_path, family):
    a = save_family(tmp_path / "a", family)
    summary = probe("compare", [a, a]).tables["summary"].iloc[0]
    assert summary.tokens > 500
    assert summary.changed == 0 and summary.router_flip == 0 and summary.token_flip == 0
    assert summary.k1 == 0 and summary.k3 == 0  # the same forward twice is bit-identical on CPU
    sat = probe("saturation", [a, a]).tables["saturation"]
    assert (sat.saturation == 1).all() and (sat.saturation_top1 == 1).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_against_fp32_numerics_has_no_flips(tmp_path, family):
    a = save_family(tmp_path / "a", family)
    summary = probe("numerics", [a], dtype="float32", other_dtype="float32").tables["summary"]
    same_dtype = summary[summary.comparison.str.startswith("float32 vs")].iloc[0]
    assert same_dtype.router_flip == 0 and same_dtype.k3 == 0


def test_two_different_checkpoints_differ_and_tables_are_consistent(tmp_path):
    a, b = save_family(tmp_path / "a", "mixtral", seed=0), save_family(tmp_path / "b", "mixtral", seed=1)
    result = probe("compare", [a, b])
    summary, by_layer, by_position = (result.tables[k] for k in ("summary", "by_layer", "by_position"))
    assert 0 < summary.router_flip.iloc[0] <= 1 and summary.k3.iloc[0] > 0
    # The whole is the routers-weighted mean of its parts (every layer records every token here).
    assert by_layer.router_flip.mean() == pytest.approx(summary.router_flip.iloc[0], rel=1e-12)
    assert by_position.tokens.sum() == summary.tokens.iloc[0]
    # router flip <= changed * k / 1 and >= changed (k = 2: one swapped expert of two is changed 1/2, a flip)
    assert summary.changed.iloc[0] <= summary.router_flip.iloc[0] <= 2 * summary.changed.iloc[0] + 1e-12


def test_bf16_flips_concentrate_at_small_router_margin():
    # The embedded policy's weights in bf16 vs fp32 on the general suite: a router flips only where its k-th and
    # (k+1)-th scores are close. Measured: most flips fall in the lowest margin decile.
    from moestab.models import build_embedded_policy

    model, tokenizer = build_embedded_policy()
    texts = load_suite("general", 64).texts
    fp32 = collect(model, tokenizer, texts, batch_size=16)
    bf16 = collect(model.to(torch.bfloat16), tokenizer, texts, batch_size=16)
    by_margin = compare_records(fp32, bf16).by_margin
    assert by_margin.flipped.sum() > 20  # enough flips to say where they are
    lowest, rest = by_margin.iloc[0], by_margin.iloc[1:]
    assert lowest.flipped > 0.5 * by_margin.flipped.sum()
    assert lowest.flip_rate > 10 * rest.flip_rate.max()


def test_cli_writes_a_probe_folder_json_csv_and_plots(tmp_path, capsys):
    a, b = save_family(tmp_path / "a", "olmoe", seed=0), save_family(tmp_path / "b", "olmoe", seed=1)
    out, csv, plots, js = tmp_path / "probe", tmp_path / "tables.csv", tmp_path / "plots", tmp_path / "p.json"
    code = main(["probe", "compare", a, b, "--count", "8", "--out", str(out), "--csv", str(csv), "--plots", str(plots),
                 "--json", str(js), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "summary:" in printed and "by_margin:" in printed
    saved = read_probe_folder(out)
    assert saved.probe == "compare" and saved.suite["count"] == 8 and len(saved.suite["sha256"]) == 64
    assert set(saved.tables) == {"summary", "by_layer", "by_position", "by_margin"}
    stacked = pd.read_csv(csv)  # every table, a first column naming each row's
    assert stacked.columns[0] == "table" and list(stacked.table.unique()) == list(saved.tables)
    by_layer = stacked[stacked.table == "by_layer"][saved.tables["by_layer"].columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(saved.tables["by_layer"], by_layer, check_dtype=False)
    assert json.loads(js.read_text())["tables"]["summary"][0]["tokens"] == saved.tables["summary"].tokens.iloc[0]
    assert (plots / "compare_flips.png").stat().st_size > 0



def test_cli_json_and_csv_go_to_stdout_without_a_file(tmp_path, capsys):
    # The convention of `moestab analyze` too: FILE given -> written there; none (or '-') -> stdout, which then
    # carries that output only.
    a = save_family(tmp_path / "a", "qwen3_moe")
    args = ["probe", "compare", a, a, "--count", "4", "--max-tokens", "16", "--no-progress"]
    assert main([*args, "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["probe"] == "compare" and result["tables"]["summary"][0]["router_flip"] == 0
    assert main([*args, "--csv", "-", "--json", str(tmp_path / "r.json"), "--out", str(tmp_path / "p")]) == 0
    captured = capsys.readouterr()
    stacked = pd.read_csv(io.StringIO(captured.out))
    assert stacked.columns[0] == "table" and list(stacked.table.unique()) == list(result["tables"])
    assert json.loads((tmp_path / "r.json").read_text())["tables"] == result["tables"]
    assert "probe folder: " in captured.err  # what was written is said on stderr, not in the CSV
    assert main(args) == 0  # neither: the text tables
    assert "summary:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--json", "--csv"], "--json and --csv both go to stdout; give one of them a FILE"),
        (["--csv", "{tmp}"], "--csv {tmp} is a folder; give a file, or no FILE for stdout"),
        (["--json", "{tmp}"], "--json {tmp} is a folder"),
        (["--csv", ""], "argument --csv: the value is empty"),
    ],
)
def test_cli_json_and_csv_targets_that_cannot_be_written_are_refused(tmp_path, capsys, args, expected):
    a = save_family(tmp_path / "a", "qwen3_moe")
    out = tmp_path / "out"
    argv = ["probe", "compare", a, a, "--count", "4", "--out", str(out), *(x.format(tmp=tmp_path) for x in args)]
    if args[-1] == "":
        with pytest.raises(SystemExit) as refused:  # argparse's own refusal
            main(argv)
        code = refused.value.code
    else:
        code = main(argv)
    assert code == 2
    captured = capsys.readouterr()
    assert expected.format(tmp=tmp_path) in captured.err and captured.out == ""
    assert not out.exists()  # refused before the probe ran

def test_suites_are_deterministic_and_user_jsonl_is_read(tmp_path):
    assert load_suite("general", 32).sha256 == load_suite("general", 32).sha256
    assert load_suite("task:arithmetic", 4).texts == load_suite("task:arithmetic", 4).texts
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "hello world"}\n\n{"text": "2+2=4", "other": 1}\n')
    suite = load_suite(str(path))
    assert suite.texts == ("hello world", "2+2=4") and suite.manifest()["count"] == 2


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "does not exist"),
        ("dense", "has no Mixture-of-Experts router"),
        ("mismatch", "different architectures (moe_layers"),
        ("empty_suite", "the suite is empty"),
        ("bad_json", "not valid JSON"),
        ("no_text", "non-empty string 'text'"),
        ("not_a_model", "neither a moestab run folder"),
        ("unknown_probe", "unknown probe 'comapre'; valid probes: compare, numerics, saturation"),
        ("bad_dtype", "dtype 'fp8' is not valid; valid: float32, bfloat16, float16"),
        ("one_for_compare", "compare takes 2 checkpoints"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, capsys, setup, expected):
    a = save_family(tmp_path / "a", "qwen3_moe")
    args, suite = ["compare", a, a], "general"
    if setup == "missing":
        args = ["compare", a, str(tmp_path / "nope")]
    elif setup == "dense":
        dense = tmp_path / "dense"
        LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=4)).save_pretrained(dense)
        build_char_tokenizer().save_pretrained(dense)
        args = ["compare", a, str(dense)]
    elif setup == "mismatch":
        args = ["compare", a, save_family(tmp_path / "b", "qwen3_moe", num_moe_layers=3)]
    elif setup in ("empty_suite", "bad_json", "no_text"):
        suite = str(tmp_path / "suite.jsonl")
        content = {"empty_suite": "\n\n", "bad_json": '{"text": "a"\n', "no_text": '{"prompt": "a"}\n'}[setup]
        (tmp_path / "suite.jsonl").write_text(content)
    elif setup == "not_a_model":
        (tmp_path / "empty").mkdir()
        args = ["compare", a, str(tmp_path / "empty")]
    elif setup == "unknown_probe":
        args = ["comapre", a, a]
    elif setup == "bad_dtype":
        args = ["compare", a, a, "--dtype", "fp8"]
    elif setup == "one_for_compare":
        args = ["compare", a]
    out = tmp_path / "out"
    code = main(["probe", *args, "--suite", suite, "--count", "4", "--out", str(out), "--no-progress"])
    assert code == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_collect_streams_in_bounded_batches_and_cuts_to_max_tokens():
    from moestab.models import build_embedded_policy

    model, tokenizer = build_embedded_policy()
    texts = load_suite("general", 10).texts
    whole = collect(model, tokenizer, texts, batch_size=3)
    cut = collect(model, tokenizer, texts, batch_size=3, max_tokens=20)
    assert cut.tokens == 10 * 20 and cut.position.max() == 19
    # The same tokens through the same weights route identically whatever the batch split (fp32 may round
    # log-probs differently with padding, routes are checked exactly).
    first20 = whole.position < 20
    np.testing.assert_array_equal(whole.routes[first20], cut.routes)


def test_shipped_suite_files_are_what_the_code_generates():
    import sys
    from pathlib import Path

    from moestab.probes.suites import general_suite, task_suite

    folder = Path(__file__).resolve().parents[2] / "probes" / "suites"
    entries = json.loads((folder / "manifest.json").read_text())
    assert [e["name"] for e in entries] == ["general", "task:arithmetic", "task:sort:length=32"]
    for entry in entries:
        from_file = load_suite(str(folder / entry["file"]))
        assert from_file.sha256 == entry["sha256"] and len(from_file.texts) == entry["count"] == 256
    for entry, spec in zip(entries[1:], ["arithmetic", "sort:length=32"], strict=True):
        assert task_suite(spec).sha256 == entry["sha256"]  # task suites do not depend on the Python version
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the general suite's docstrings are those of the Python that wrote the file (3.11)")
    assert general_suite().sha256 == entries[0]["sha256"]


def test_cli_threads_flag_is_validated_and_applied(tmp_path, capsys, monkeypatch):
    a = save_family(tmp_path / "a", "qwen3_moe")
    assert main(["probe", "compare", a, a, "--threads", "0", "--no-progress"]) == 2
    assert "--threads must be >= 1, got 0" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    assert main(["probe", "compare", a, a, "--threads", "1", "--count", "2", "--no-progress"]) == 0
    assert seen == [1]


def test_an_incompatible_transformers_is_refused_before_the_probe_folder_is_written(tmp_path, capsys, monkeypatch):
    import transformers

    from moestab.routing import forward_call as forward_call_module

    a = save_family(tmp_path / "a", "olmoe")
    monkeypatch.setattr(forward_call_module, "find_cache", lambda kwargs: None)  # decode steps go unrecognised
    code = main(["probe", "compare", a, a, "--count", "4", "--out", str(tmp_path / "probe"), "--no-progress"])
    assert code != 0
    err = capsys.readouterr().err
    assert f"transformers {transformers.__version__} (family olmoe)" in err and "pip install 'transformers==" in err
    assert not (tmp_path / "probe").exists()
