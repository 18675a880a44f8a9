"""Habits an ops engineer brings: nvidia-smi's spellings tpu-info has no flag
for get a one-line hint naming ours (exit 2), and NO_COLOR / FORCE_COLOR are
honoured."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.terminal import on_a_pty
from tpu_info.commands import cli
from tpu_info.commands.args import build_parser, check_combination

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("argv, says", [
    # -L, -i, -q, --query-gpu and --query-compute-apps are flags (test_nvidia_smi_spellings)
    (["--query-accounted-apps=pid,used_memory", "--format=csv"],
     "nvidia-smi's --query-accounted-apps lists processes that ended: tpu-info runs"),
    (["-q", "-x"], "nvidia-smi's -x (XML) is --json here: tpu-info --json"),
    (["--xml-format"], "nvidia-smi's --xml-format (XML) is --json here"),
    (["--query"], "--query takes fields here"),
    (["--query"], "nvidia-smi's --query (every detail) is -q here: tpu-info -q"),
])
def test_nvidia_smi_spellings_get_a_hint_naming_ours(argv, says, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert "invalid choice" not in err and "unrecognized" not in err
    # The command the hint names is one tpu-info accepts.
    for suggested in re.findall(r"tpu-info (--query-compute-apps=[\w.,]+ --format=[a-z,]+)",
                                err):
        args = build_parser().parse_args(suggested.split())
        check_combination(args)


@pytest.mark.parametrize("argv", [["run", "--", "python", "train.py", "-q", "-i", "0", "-L"],
                                  ["exporter", "--listen", "127.0.0.1:0"]])
def test_a_line_that_parses_is_never_hinted(argv):
    args = build_parser().parse_args(argv)
    check_combination(args)


def test_other_usage_errors_keep_their_words(capsys):
    assert cli.main(["--bogus"]) == cli.EXIT_USAGE
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert cli.main(["--query", "index", "--format", "tsv"]) == cli.EXIT_USAGE
    assert "nvidia-smi" not in capsys.readouterr().err


# Colour -----------------------------------------------------------------------

# A red word and whether rich takes stdout for a terminal, printed by the CLI's console.
_PRINT = ("from rich.text import Text\n"
          "from tpu_info.outputs.console import make_console\n"
          "import sys\n"
          "c = make_console('--no-color' in sys.argv)\n"
          "c.print(Text('word', style='red'))\n"
          "print('terminal' if c.is_terminal else 'not-terminal')\n")
RED = b"\x1b[31m"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR",
                                                             "TTY_COMPATIBLE", "COLUMNS")}
    return dict(env, TERM="xterm-256color", PYTHONPATH=str(ROOT), **extra)


def _on_a_terminal(env: dict[str, str], *argv: str) -> bytes:
    return on_a_pty([sys.executable, "-c", _PRINT, *argv], env, ROOT, timeout=30)


def _in_a_pipe(env: dict[str, str]) -> bytes:
    return subprocess.run([sys.executable, "-c", _PRINT], env=env, cwd=ROOT,
                          capture_output=True, timeout=30, check=True).stdout


@pytest.mark.slow
def test_no_color_turns_colour_off_on_a_terminal():
    assert RED in _on_a_terminal(_env())  # a terminal gets colour ...
    for env in (_env(NO_COLOR="1"), _env(NO_COLOR="1", FORCE_COLOR="1")):
        out = _on_a_terminal(env)
        assert RED not in out and b"word" in out  # ... unless NO_COLOR says not
        assert out == _on_a_terminal(_env(), "--no-color")  # the same as --no-color
    assert RED in _on_a_terminal(_env(NO_COLOR=""))  # empty: not set (no-color.org)


@pytest.mark.slow
def test_force_color_colours_a_pipe_that_stays_a_pipe():
    assert RED not in _in_a_pipe(_env())
    for level in ("1", "2", "3"):
        out = _in_a_pipe(_env(FORCE_COLOR=level))
        assert RED in out or b"\x1b[38;" in out, out
        assert b"not-terminal" in out  # streaming appends frames: no redraw in a file
    assert RED not in _in_a_pipe(_env(FORCE_COLOR=""))


@pytest.mark.slow
def test_force_color_streaming_to_a_pipe_appends_frames():
    """`FORCE_COLOR=1 tpu-info -l S | less -R`: colour, and no cursor movement
    (before: rich took FORCE_COLOR for a terminal and redrew in place)."""
    try:
        out = subprocess.run([sys.executable, "-m", "tpu_info", "--no-discovery", "-l", "0.2"],
                             env=_env(FORCE_COLOR="1", COLUMNS="100"), cwd=ROOT,
                             capture_output=True, timeout=3).stdout
    except subprocess.TimeoutExpired as e:  # streaming runs until stopped
        out = e.stdout or b""
    assert out.count(b"\x1b[") > 0, out  # coloured ...
    assert b"\x1b[1A" not in out and b"\x1b[2K" not in out and b"\x1b[?25l" not in out


# -l / --streaming frames of -p and --metric say when they were taken ---------------

STAMP = re.compile(r"^\S+   \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", re.M)


@pytest.mark.parametrize("flags, stamped", [(["-p", "-l", "1"], True),
                                            (["--metric", "hbm_usage", "--streaming"], True),
                                            (["-p"], False), (["--metric", "hbm_usage"], False)])
def test_streamed_process_and_metric_frames_carry_the_time(flags, stamped):
    from io import StringIO

    from rich.console import Console

    from tpu_info.commands.gather import Gathered
    from tpu_info.commands.show import renderable
    from tpu_info.host.devices import scan_local

    args = build_parser().parse_args(["--no-discovery", *flags])
    check_combination(args)
    g = Gathered(views=[], local=scan_local("/nonexistent", nvml_loader=None))
    out = StringIO()
    Console(file=out, width=100, color_system=None).print(renderable(args, g, 100))
    assert bool(STAMP.search(out.getvalue())) is stamped, out.getvalue()


@pytest.mark.slow
def test_minus_l_minus_p_to_a_pipe_stamps_every_frame():
    # Streaming runs until stopped: read until two frames came (a loaded machine
    # takes its time starting the command), then stop it.
    proc = subprocess.Popen([sys.executable, "-m", "tpu_info", "--no-discovery", "-p", "-l",
                             "0.2"], env=_env(), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    text, deadline = "", time.monotonic() + 120
    try:
        while text.count("Processes") < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            text += line
    finally:
        proc.kill()
        proc.wait()
    frames = text.count("Processes")
    assert frames >= 2 and len(STAMP.findall(text)) >= frames, text  # the stamp comes first


# Shell completion -------------------------------------------------------------------

def _complete(words: list[str], shell: str = "bash") -> list[str]:
    """What real bash offers for ``tpu-info WORDS`` (the last word is being typed)."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not installed")
    script = subprocess.run([sys.executable, "-m", "tpu_info", "--completion", shell],
                            capture_output=True, text=True, cwd=ROOT, env=_env(),
                            timeout=60, check=True).stdout
    line = " ".join(shlex.quote(w) for w in ["tpu-info", *words])
    probe = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _tpu_info; "
             "printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = subprocess.run([bash, "--norc", "-c", probe], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


@pytest.mark.parametrize("words, offered", [
    ([""], {"report", "doctor", "exporter", "profile", "run"}),
    (["--q"], {"--query"}),
    (["--query", "index,memory.u"], {"index,memory.used"}),
    (["--format", "csv,no"], {"csv,noheader", "csv,nounits"}),
    (["--metric", "hbm_u"], {"hbm_usage"}),
    (["--completion", ""], {"bash", "zsh"}),
    (["exporter", "--li"], {"--listen"}),
    (["--timeout", "3", "report", "--pid", "12", "--j"], {"--json"}),
])
@pytest.mark.slow
def test_completion_offers_what_the_parser_takes(words, offered):
    assert offered <= set(_complete(words)), _complete(words)


@pytest.mark.slow
def test_completion_leaves_the_program_after_run_to_the_shell():
    assert _complete(["run", "--", "python", "-"]) == []
    assert _complete(["--query", ""]) and not any(w.startswith("-") for w in
                                                  _complete(["--query", ""]))


@pytest.mark.slow
def test_completion_knows_every_flag_of_every_subcommand():
    """Generated from the argparse tree: a new flag needs no edit here."""
    parser = build_parser()
    top = {s for a in parser._actions for s in a.option_strings}
    assert top <= set(_complete(["-"]))
    from tpu_info.commands.completion import _subparsers

    subs = _subparsers(parser)
    assert {"report", "doctor", "exporter"} <= set(subs)
    for name, sub in subs.items():
        if name != "run":  # its words are the program's
            flags = {s for a in sub._actions for s in a.option_strings}
            assert flags <= set(_complete([name, "-"])), name


def test_zsh_gets_shtabs_native_script(capsys):
    assert cli.main(["--completion", "zsh"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("#compdef tpu-info") and "compdef _shtab_tpu_info" in out
    assert "_sequence compadd - " in out and "hbm_usage" in out  # --query's list, --metric's names
    # A ':' in a metavar would end zsh's spec there ("command not found: PORT").
    assert ":HOST\\:PORT:" in out and ":HOST:PORT:" not in out
    assert cli.main(["--completion", "fish"]) == cli.EXIT_USAGE


@pytest.mark.parametrize("load", ["source <(cat {f})", 'eval "$(cat {f})"'])
@pytest.mark.slow
def test_zsh_registers_the_completion_sourced_or_evaluated(load, tmp_path):
    """``source <(tpu-info --completion zsh)`` in ~/.zshrc, compinit or not."""
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh not installed")
    f = tmp_path / "tpu-info.zsh"
    f.write_text(subprocess.run([sys.executable, "-m", "tpu_info", "--completion", "zsh"],
                                capture_output=True, text=True, cwd=ROOT, env=_env(),
                                timeout=60, check=True).stdout)
    r = subprocess.run([zsh, "-f", "-c", load.format(f=f) + "; print -r -- $_comps[tpu-info]"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**_env(), "HOME": str(tmp_path)})
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "_shtab_tpu_info", "")


# 80 columns: shorter cells before cut names -----------------------------------------

def _processes_at(width: int) -> str:
    from io import StringIO

    from rich.console import Console

    from tpu_info.outputs import render
    from tpu_info.outputs.table_layout import Alt, table

    cols = [c for c, _ in render.PROCESS_COLUMNS]
    row = ["123456", "train.py", "alice", "jax 0.10.2", "127.0.0.1:8431", "2h 03m",
           Alt("10,561 (inferred: jit(step))", "~10,561"), "12", "1.2 GiB", "tpu0"]
    out = StringIO()
    Console(file=out, width=width, color_system=None).print(table("Processes", cols, [row],
                                                                  width))
    return out.getvalue()


def test_at_80_columns_steps_shorten_before_names_are_cut():
    """Before: 'tr…', 'jax…', '127…' beside '10,561 (inferred: jit(step))'."""
    narrow = _processes_at(80)
    assert all(len(line.rstrip()) <= 80 for line in narrow.splitlines())
    for whole in ("train.py", "jax 0.10.2", "127.0.0.1:8431", "~10,561"):
        assert whole in narrow, narrow
    assert "…" not in narrow and "inferred" not in narrow
    wide = _processes_at(160)  # room for all: the long form, and the User column
    assert "10,561 (inferred: jit(step))" in wide and "alice" in wide


def test_the_processes_table_declares_its_short_steps():
    from types import SimpleNamespace

    from tpu_info.outputs import render
    from tpu_info.outputs.table_layout import Alt
    from tpu_info.views.derived import Derived

    (get,) = [get for col, get in render.PROCESS_COLUMNS if col.header == "Steps"]
    cell = get(SimpleNamespace(steps=Derived.of("10,561 (inferred: jit(step))", ""),
                               steps_short=Derived.of("~10,561", "")))
    assert isinstance(cell, Alt) and cell.short == "~10,561"
