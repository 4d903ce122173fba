"""run.json's ``environment`` names the CPU (moestab.recording.environment): its model and vector flags read from
/proc/cpuinfo texts of an x86 and an Arm machine, nothing when the file is absent, and torch's kernel capability."""

from __future__ import annotations

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
