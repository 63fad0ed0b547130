"""``vramscope completion bash|zsh|fish``: a completion script for the shell, made from the CLI's own parser.

Like ``pip completion`` and ``rustup completions``, it prints a script to source; nothing is installed:

    vramscope completion bash > ~/.local/share/bash-completion/completions/vramscope
    vramscope completion zsh > "${fpath[1]}/_vramscope"
    vramscope completion fish > ~/.config/fish/completions/vramscope.fish

The subcommands and their flags come from the parser itself, so the script never lists a flag that is not there.
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh", "fish")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    parser.epilog = (
        "examples:\n"
        "  vramscope completion bash > ~/.local/share/bash-completion/completions/vramscope\n"
        "  vramscope completion zsh > \"${fpath[1]}/_vramscope\"\n"
        "  vramscope completion fish > ~/.config/fish/completions/vramscope.fish"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def command_flags() -> dict[str, list[str]]:
    """Each subcommand's long flags, read from the CLI's parser (the top level's under "")."""
    from vramscope.cli import build_parser

    parser = build_parser()
    def shown(p: argparse.ArgumentParser) -> list[str]:  # an old spelling (help=SUPPRESS) is not offered
        return sorted(f for f, a in p._option_string_actions.items()
                      if f.startswith("--") and a.help is not argparse.SUPPRESS)

    found = {"": shown(parser)}
    for name, sub in getattr(parser, "subcommands", {}).items():
        found[name] = shown(sub)
    return found


def bash_script(flags: dict[str, list[str]]) -> str:
    commands = " ".join(name for name in flags if name)
    cases = "\n".join(f"        {name}) opts={shlex.quote(' '.join(opts))} ;;" for name, opts in flags.items() if name)
    return f"""# bash completion for vramscope (vramscope completion bash)
_vramscope() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} sub="" i opts
    for ((i = 1; i < COMP_CWORD; i++)); do
        [[ ${{COMP_WORDS[i]}} == "--" ]] && {{ COMPREPLY=(); return; }}  # the user's command: the shell's own
        [[ ${{COMP_WORDS[i]}} != -* && -z $sub ]] && sub=${{COMP_WORDS[i]}}
    done
    if [[ -z $sub ]]; then
        COMPREPLY=($(compgen -W "{commands} {' '.join(flags[''])}" -- "$cur"))
        return
    fi
    case $sub in
{cases}
        *) opts="" ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _vramscope vramscope
"""


def zsh_script(flags: dict[str, list[str]]) -> str:
    # zsh runs bash completions through bashcompinit: one script, the same answers.
    return "#compdef vramscope\n# zsh completion for vramscope (vramscope completion zsh)\n" \
        "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(flags).split("\n", 1)[1]


def fish_script(flags: dict[str, list[str]]) -> str:
    lines = ["# fish completion for vramscope (vramscope completion fish)"]
    commands = [name for name in flags if name]
    lines.append(f"complete -c vramscope -f -n '__fish_use_subcommand' -a '{' '.join(commands)}'")
    for name, opts in flags.items():
        condition = "__fish_use_subcommand" if not name else f"__fish_seen_subcommand_from {name}"
        for opt in opts:
            lines.append(f"complete -c vramscope -n '{condition}' -l {opt[2:]}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    flags = command_flags()
    script = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[args.shell](flags)
    print(script, end="")
    return 0
