"""Shell completion for ``tpu-info``, generated from its argparse tree.

``tpu-info --completion bash`` prints a bash script (zsh: the same through
``bashcompinit``). It completes the subcommands, each one's flags, the
values of flags with choices, ``--query``'s fields after each comma,
``--format``'s forms, ``--metric``'s names, and file names where a flag takes
a file; after ``run`` (or ``--``) the shell's own completion takes over. The
script is static: pressing Tab never starts Python.

Example:
    >>> from tpu_info.commands.args import build_parser
    >>> "_tpu_info()" in bash_script(build_parser())
    True
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable

SHELLS = ("bash", "zsh")
_FILE_METAVARS = {"FILE", "DIR"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public walk of its tree
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions if a.help != argparse.SUPPRESS
            for s in a.option_strings]


def _valued(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Flags that take a value (nargs not 0), by spelling."""
    return {s: a for a in parser._actions for s in a.option_strings
            if a.nargs != 0 and not isinstance(a, (argparse._HelpAction,
                                                    argparse._StoreTrueAction))}


def _words(values: Iterable[str]) -> str:
    return shlex.quote(" ".join(values))


def _value_cases(parser: argparse.ArgumentParser, fields: list[str], formats: list[str],
                 metrics: list[str]) -> list[str]:
    """``case "$prev"`` arms for the flags of ``parser`` that take a value."""
    arms = []
    for flag, action in sorted(_valued(parser).items()):
        dest = action.dest
        if dest == "query_fields":
            arms.append(f"      {flag}) _tpu_info_list {_words(fields)}; return 0 ;;")
        elif dest == "csv_format":
            arms.append(f"      {flag}) _tpu_info_list {_words(formats)}; return 0 ;;")
        elif dest == "metric_name":
            arms.append(f"      {flag}) _tpu_info_words {_words(metrics)}; return 0 ;;")
        elif action.choices:
            arms.append(f"      {flag}) _tpu_info_words {_words(map(str, action.choices))}; "
                        "return 0 ;;")
        elif action.metavar in _FILE_METAVARS or dest in ("output", "targets_file",
                                                          "sd_file", "runtime_dir"):
            arms.append(f"      {flag}) COMPREPLY=( $(compgen -f -- \"$cur\") ); return 0 ;;")
        else:  # a number, an address, a name: nothing to offer, and no flag either
            arms.append(f"      {flag}) return 0 ;;")
    return arms


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion script for ``parser`` (``tpu-info``'s)."""
    from tpu_info.outputs.query import FIELDS

    fields = sorted({f.name for f in FIELDS} | {a for f in FIELDS for a in f.aliases})
    formats = ["csv", "noheader", "nounits"]
    try:
        from tpu_info.views.metrics import metric_list

        metrics = sorted({m["name"] for m in metric_list()})
    except Exception:  # noqa: BLE001 - completion without metric names is still completion
        metrics = []
    subs = _subparsers(parser)
    top_valued = sorted(_valued(parser))
    out = [
        "# bash completion for tpu-info (tpu-info --completion bash; generated from its",
        "# argparse tree). zsh: tpu-info --completion zsh.",
        "_tpu_info_words() { COMPREPLY=( $(compgen -W \"$1\" -- \"$cur\") ); }",
        "# A comma-separated list: complete the part after the last comma.",
        "_tpu_info_list() {",
        "  local head=\"\" last=\"$cur\"",
        "  if [[ \"$cur\" == *,* ]]; then head=\"${cur%,*},\"; last=\"${cur##*,}\"; fi",
        "  COMPREPLY=( $(compgen -P \"$head\" -W \"$1\" -- \"$last\") )",
        "  compopt -o nospace 2>/dev/null",
        "}",
        "_tpu_info() {",
        "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"",
        "  local cmd=\"\" i w",
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        "    w=\"${COMP_WORDS[i]}\"",
        "    case \"$w\" in",
        f"      {'|'.join(top_valued)}) ((i++)) ;;  # its value is not a subcommand",
        f"      {'|'.join(sorted(subs))}) cmd=\"$w\"; break ;;",
        "      --) return 0 ;;",
        "    esac",
        "  done",
        "  if [[ \"$cmd\" == run ]]; then return 0; fi  # the program's own words: the shell's",
        "  case \"$cmd\" in",
    ]
    for name, sub in sorted(subs.items()):
        if name == "run":
            continue
        out += [f"    {name})", "      case \"$prev\" in"]
        out += ["  " + arm for arm in _value_cases(sub, fields, formats, metrics)]
        out += ["      esac", f"      _tpu_info_words {_words(_flags(sub))} ;;"]
    out += ["    *)", "      case \"$prev\" in"]
    out += ["  " + arm for arm in _value_cases(parser, fields, formats, metrics)]
    out += ["      esac",
            "      if [[ \"$cur\" == -* ]]; then",
            f"        _tpu_info_words {_words(_flags(parser))}",
            "      else",
            f"        _tpu_info_words {_words(sorted(subs))}",
            "      fi ;;",
            "  esac",
            "}",
            "complete -o default -F _tpu_info tpu-info",
            ""]
    return "\n".join(out)


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of :data:`SHELLS`)."""
    if shell == "zsh":
        return ("# zsh completion for tpu-info, through bash's (bashcompinit)\n"
                "autoload -U +X compinit && compinit\n"
                "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser))
    return bash_script(parser)


class CompletionAction(argparse.Action):
    """``--completion SHELL``: prints the script and exits 0, as ``--help`` does."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        import sys

        sys.stdout.write(script(str(values), parser))
        parser.exit(0)
