"""`taurl demo` pins the CPU kernels' ISA (taurl.cpu_isa): defaults only, before torch loads."""

import platform
import subprocess
import sys

import pytest

from taurl.cpu_isa import PINNED_ISA, pin_cpu_isa

x86 = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 only"
)


def run_child(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@x86
def test_pin_sets_every_variable_before_torch_loads():
    # in a child: this worker has torch loaded already, where pinning must do nothing
    got = run_child(
        "import os; from taurl.cpu_isa import pin_cpu_isa; env = {}; "
        "print(sorted(pin_cpu_isa(env).items()) == sorted(env.items()), sorted(env))"
    )
    assert got == f"True {sorted(PINNED_ISA)}"


@x86
def test_the_users_own_values_win_and_native_turns_it_off():
    got = run_child(
        "from taurl.cpu_isa import pin_cpu_isa; env = {'MKL_CBWR': 'AUTO'}; pin_cpu_isa(env); "
        "off = {'TAURL_CPU_ISA': 'native'}; print(env['MKL_CBWR'], pin_cpu_isa(off), len(off))"
    )
    assert got == "AUTO {} 1"


def test_nothing_is_pinned_once_torch_is_loaded():
    import torch  # noqa: F401  (the libraries have read their variables: too late to pin)

    env: dict[str, str] = {}
    assert pin_cpu_isa(env) == {} and env == {}


@x86
def test_the_pinned_variables_reach_torch():
    # ATen reports the capability it dispatches to; AVX2 is what the pin asks for
    got = run_child(
        "from taurl.cpu_isa import pin_cpu_isa; pin_cpu_isa(); import torch; "
        "print(torch.backends.cpu.get_cpu_capability())"
    )
    assert got == "AVX2"


@x86
def test_the_demo_command_pins_before_torch_loads():
    code = (
        "import os, sys\nfrom taurl.cli import main as m, commands\n"
        "def fake(*a, **k):\n"
        "    import torch\n"
        "    print(os.environ.get('MKL_CBWR'), torch.backends.cpu.get_cpu_capability())\n"
        "    raise SystemExit(0)\n"
        "commands.train = fake\nm.main(['demo', '--run-dir', 'unused'])\n"
    )
    assert run_child(code) == "AVX2 AVX2"
