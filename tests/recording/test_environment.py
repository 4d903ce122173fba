"""run.json's ``environment`` names the CPU (moestab.recording.environment): its model and vector flags read from
/proc/cpuinfo texts of an x86 and an Arm machine, nothing when the file is absent, and torch's kernel capability."""

from __future__ import annotations

import subprocess

import torch

from moestab.recording import environment as env

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2 avx512f smep avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: something else
flags\t\t: fpu sse
"""

ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes sve sve2 asimddp
CPU implementer\t: 0x41
"""


def test_the_first_processors_model_and_vector_flags():
    assert env.parse_cpuinfo(X86) == {
        "model": "Intel(R) Xeon(R) Platinum 8480+",
        "flags": ["amx_bf16", "amx_int8", "amx_tile", "avx", "avx2", "avx512_bf16", "avx512f", "fma"],
    }  # smep and the sse family are not vector-kernel choices
    assert env.parse_cpuinfo(ARM) == {"model": None, "flags": ["asimd", "asimddp", "sve", "sve2"]}
    assert env.parse_cpuinfo("") == {"model": None, "flags": []}


def test_an_absent_cpuinfo_leaves_torch_and_platform(tmp_path, monkeypatch):
    monkeypatch.setattr(env, "CPUINFO", tmp_path / "absent")
    found = env.cpu()
    assert (found["model"], found["flags"]) == (None, [])
    assert found["capability"] == torch.backends.cpu.get_cpu_capability()


def test_the_environment_holds_the_cpu_and_the_trainers_own(tmp_path, monkeypatch):
    (tmp_path / "cpuinfo").write_text(X86)
    monkeypatch.setattr(env, "CPUINFO", tmp_path / "cpuinfo")
    out = env.environment(world_size=2)
    assert out["cpu"]["model"] == "Intel(R) Xeon(R) Platinum 8480+" and out["world_size"] == 2
    assert (out["torch"], out["torch_threads"]) == (torch.__version__, torch.get_num_threads())


def _git(where, *args):
    subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True)


def test_the_code_is_its_checkouts_commit_and_whether_a_tracked_file_changed(tmp_path):
    checkout = tmp_path / "repo"
    (checkout / "moestab").mkdir(parents=True)
    (checkout / "moestab" / "__init__.py").write_text("")
    _git(checkout, "init", "-q")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert env.code(checkout / "moestab") == {"commit": head, "dirty": False}
    (checkout / "notes.txt").write_text("untracked")  # an untracked file is not the code
    assert env.code(checkout / "moestab") == {"commit": head, "dirty": False}
    (checkout / "moestab" / "__init__.py").write_text("x = 1\n")
    assert env.code(checkout / "moestab") == {"commit": head, "dirty": True}


def test_a_package_that_is_not_its_checkouts_moestab_folder_has_no_commit(tmp_path):
    """A wheel inside a virtual environment inside someone else's repository: that repository's commit is not
    moestab's."""
    project = tmp_path / "project"
    site = project / ".venv" / "lib" / "site-packages" / "moestab"
    site.mkdir(parents=True)
    _git(project, "init", "-q")
    assert env.code(site) == {"commit": None, "dirty": None}
    assert env.code(tmp_path / "nowhere") == {"commit": None, "dirty": None}  # no checkout at all


def test_this_checkouts_runs_record_its_commit():
    """The environment every run writes carries the code's provenance (this test runs from a checkout)."""
    out = env.environment()
    assert set(out["code"]) == {"commit", "dirty"}
    if (env.PACKAGE_DIR.parent / ".git").exists():
        assert len(out["code"]["commit"]) == 40 and isinstance(out["code"]["dirty"], bool)
