"""Shell completion for ``tpu-info``: shtab's scripts for its argparse tree.

``tpu-info --completion bash`` (or ``zsh``) prints the script shtab
generates from the parser: the subcommands, each one's flags, the values of
flags with choices, and file or folder names where a flag takes one. What the
parser cannot tell shtab is added here: ``--query``'s fields after each comma
(nvidia-smi's names too, for ``--query-gpu`` and ``--query-compute-apps``),
``--format``'s forms and ``--metric``'s names. After ``run`` (or ``--``) the
shell's own completion takes over. The script is static: pressing Tab never
starts Python. shtab is imported only when a script is asked for.

Example:
    >>> from tpu_info.commands.args import build_parser
    >>> "_tpu_info()" in script("bash", build_parser())
    True
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable

SHELLS = ("bash", "zsh")
_FORMATS = ("csv", "noheader", "nounits")

# bash: shtab calls a value's function with the word typed and takes its lines.
_BASH = """\
_tpu_info_list() {  # $1: the word, $2: the choices; a list completes after its last comma
  local head="" last="$1"
  if [[ "$1" == *,* ]]; then head="${1%%,*},"; last="${1##*,}"; fi
  compgen -P "$head" -W "$2" -- "$last"
}
_tpu_info_fields() { _tpu_info_list "$1" %(fields)s; }
_tpu_info_formats() { _tpu_info_list "$1" %(formats)s; }
_tpu_info_metrics() { compgen -W %(metrics)s -- "$1"; }
"""
# shtab runs the functions above in a subshell, where compopt cannot reach:
# a list stays open (no space after a field) from this wrapper.
_BASH_TAIL = """
_tpu_info() {
  _shtab_tpu_info
  case "${COMP_WORDS[COMP_CWORD-1]}" in
    %(lists)s) compopt -o nospace 2>/dev/null ;;
  esac
}
complete -o bashdefault -o default -F _tpu_info tpu-info
"""
# zsh: compinit loaded where it is not yet (as bash's script needs nothing),
# and ``source <(tpu-info --completion zsh)`` registers the function as
# ``eval`` does (shtab's script would call it outside completion).
_ZSH_HEAD = "(( $+functions[compdef] )) || { autoload -U +X compinit && compinit; }"
_ZSH_SOURCED = ("[[ $zsh_eval_context[-1] == eval ]]",
                "[[ $zsh_eval_context[-1] == (eval|file) ]]")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public walk of its tree
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(values: Iterable[str]) -> str:
    return shlex.quote(" ".join(values))


def _values() -> tuple[list[str], list[str]]:
    """``--query``'s field names (ours, their aliases, nvidia-smi's) and the metric names."""
    from tpu_info.outputs.nvsmi_fields import APPS, GPU
    from tpu_info.outputs.query import FIELDS

    fields = sorted({f.name for f in FIELDS} | {a for f in FIELDS for a in f.aliases}
                    | set(GPU) | set(APPS))
    try:
        from tpu_info.views.metrics import metric_list

        metrics = sorted({m["name"] for m in metric_list()})
    except Exception:  # noqa: BLE001 - completion without metric names is still completion
        metrics = []
    return fields, metrics


def _mark(parser: argparse.ArgumentParser, shell: str, fields: list[str],
          metrics: list[str]) -> list[str]:
    """Sets shtab's ``.complete`` on the actions of ``parser`` and its
    subcommands whose values it cannot tell; returns the list flags' spellings."""
    import shtab

    by_dest = {"query_fields": {"bash": "_tpu_info_fields",
                                "zsh": "_sequence compadd - " + " ".join(fields)},
               "csv_format": {"bash": "_tpu_info_formats",
                              "zsh": "_sequence compadd - " + " ".join(_FORMATS)},
               "metric_name": {"bash": "_tpu_info_metrics", "zsh": f"({' '.join(metrics)})"}}
    by_metavar = {"FILE": shtab.FILE, "DIR": shtab.DIRECTORY}
    lists: list[str] = []
    for p in [parser, *_subparsers(parser).values()]:
        for a in p._actions:
            complete = by_dest.get(a.dest) or by_metavar.get(str(a.metavar))
            if complete:
                a.complete = complete  # type: ignore[attr-defined]
            if a.dest in ("query_fields", "csv_format"):
                lists += a.option_strings
            if shell == "zsh" and isinstance(a.metavar, str):  # its specs are ':'-separated
                a.metavar = a.metavar.replace(":", "\\:")
    return lists


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of :data:`SHELLS`). It marks
    ``parser``'s actions for shtab, so ``parser`` is for this use only."""
    import shtab

    fields, metrics = _values()
    lists = _mark(parser, shell, fields, metrics)
    if shell == "zsh":
        return shtab.complete(parser, "zsh", preamble=_ZSH_HEAD).replace(*_ZSH_SOURCED)
    head = _BASH % {"fields": _words(fields), "formats": _words(_FORMATS),
                    "metrics": _words(metrics)}
    return (shtab.complete(parser, "bash", preamble=head)
            + _BASH_TAIL % {"lists": "|".join(sorted(set(lists)))})


class CompletionAction(argparse.Action):
    """``--completion SHELL``: prints the script and exits 0, as ``--help`` does."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        import sys

        sys.stdout.write(script(str(values), parser))
        parser.exit(0)
