"""docs/reference/cli.md, generated from the `finetune` command's own argparse parser (`./hack/generate.sh`)."""

import argparse
import sys
from pathlib import Path

from .main import _parser


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().split()).removeprefix("usage: ")


def cli_reference() -> str:
    parser = _parser()
    lines = ["# The finetune CLI", "",
             "Generated from the command's argparse parser by `./hack/generate.sh`; `finetune COMMAND --help` "
             "prints the same. No cluster is needed for any command. Exit codes: 0 ok; 1 `validate`/`render` found "
             "an invalid spec; 2 a file cannot be read or is not YAML (or the command line is wrong); 3 `validate` "
             "found a valid spec that cannot run by the model's config (--model-config, or a local model "
             "directory): it does not fit its GPUs or its pods' memory, or the stack cannot build it; `run` exits "
             "with the trainer's code ([exit codes](exit-codes.md)), 78 for an invalid spec.", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, command in sub.choices.items():
        lines += [f"## finetune {name}", "", helps.get(name) or "", "", f"```\n{_usage(command)}\n```", "",
                  "| argument | default | description |", "|---|---|---|"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
            default = "" if action.default in (None, argparse.SUPPRESS, [], False) else f"`{action.default}`"
            lines.append(f"| {flags} | {default} | {(action.help or '').replace('|', chr(92) + '|')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    (Path(sys.argv[1]) / "docs" / "reference" / "cli.md").write_text(cli_reference())
