"""`pagedeck completion bash|zsh`: a completion script for the commands, their flags and model names
(`pagedeck ls --json` names, asked when completing `run` and `rm`). Use: `source <(pagedeck completion bash)`."""
from __future__ import annotations

from app.cli.commands import COMMANDS

BASH = r'''_pagedeck() {
    local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]}
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "%(commands)s --help --model --data-dir --cache-tokens --install-desktop --uninstall-desktop" -- "$cur"))
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(pagedeck "$cmd" --help 2>/dev/null | grep -o -- '--[a-z-]*' | sort -u)" -- "$cur"))
    elif [ "$cmd" = run ] || [ "$cmd" = rm ]; then
        local names
        names=$(pagedeck ls --json 2>/dev/null | python3 -c 'import json,sys; print("\n".join(m["name"] for m in json.load(sys.stdin)))')
        local IFS=$'\n'
        COMPREPLY=($(compgen -W "default"$'\n'"$names" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -F _pagedeck pagedeck
'''


def add_parser(parser, name: str) -> None:
    parser.add_argument("shell", choices=("bash", "zsh"), help="zsh reads the bash script (bashcompinit)")


def script(shell: str) -> str:
    text = BASH % {"commands": " ".join(COMMANDS)}
    return ("autoload -U +X bashcompinit && bashcompinit\n" + text) if shell == "zsh" else text


def run(args) -> int:
    print(script(args.shell), end="")
    return 0
