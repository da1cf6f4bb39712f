"""Where a sweep's ``{name}`` placeholder meets shell code, and what it
becomes there (``infra/sweeps/spec.py`` puts values in a command's words).

A command runs as its words, never through a shell: a value put in a
plain word is data. But some words *are* shell code: the script of
``bash -c SCRIPT``, or what ``env -S``, ``flock ... -c``, ``fish -c`` or
``ssh host`` hand to a shell. A value pasted there as text would run
(``--param lr='0.1; touch pwned'``). So a placeholder in shell code is
either put as a reference to the trial's variable (``"${LR}"``), which a
POSIX shell expands but never reads as code, or refused (ConfigError,
exit 2, one line). Only the forms read here are rewritten: the script
after ``-c`` of a POSIX shell whose every option is understood. Anywhere
else after a program that runs its arguments as shell code (another
shell, an option of a known shell that is not understood, ``env -S``,
``flock -c``, ``su -c``, ``ssh``, ``watch``...) a placeholder is refused,
and so is one inside a script where the script itself runs text again
(a nested ``bash -c``, ``eval``, ``trap``) or evaluates it as arithmetic
(``$((...))``, ``((...))``, ``[[...]]``, ``let``, ``${x:N}``, ``${a[N]}``,
``$[...]``, ``a[N]=``, a variable declared ``-i``: bash runs ``a[$(cmd)]``
there, quoted or not). A shell by another name (``ksh93``, ``rbash``) is
that shell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from infra.errors import ConfigError

# `${NAME}` is the shell's reference to a variable (the trial's, as the
# README says to write it in `bash -c`), never a placeholder.
PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")

# POSIX shells: the argument after -c is their script, and "${NAME}" there
# expands to the variable's value as data.
POSIX_SHELLS = frozenset({"sh", "bash", "dash", "ash", "ksh", "mksh", "zsh"})
# Option letters of those shells that take no argument (set -o's letters,
# -c, -s, -i, -l, bash's -B -E -H -P -T -k -t); `o` and `O` take the next
# word. Any other letter (mksh's -T takes a word; bash's -D prints) is an
# option not understood: the script cannot be told from its arguments.
_FLAG_LETTERS = frozenset("abCefhiklmnprstuvxcBEHP")
_ARG_LETTERS = frozenset("oO")
_LONG_FLAGS = frozenset(
    {"--login", "--noprofile", "--norc", "--posix", "--restricted", "--verbose", "--noediting"}
)
_LONG_WITH_ARG = frozenset({"--rcfile", "--init-file"})  # bash: the file is the next word
# Shells whose quoting is not POSIX's ("${NAME}" is an error in fish, and
# csh expands `!` in double quotes): no placeholder after them at all.
OTHER_SHELLS = frozenset(
    {"fish", "csh", "tcsh", "rc", "es", "nu", "pwsh", "powershell", "elvish", "xonsh",
     "ion", "osh", "ysh", "yash", "posh", "lksh", "pdksh", "oksh", "busybox", "toybox"}
)  # fmt: skip
# Programs that hand an argument to a shell, with the options that make
# them do so (an empty set: always).
_RUNNERS: Mapping[str, frozenset[str]] = {
    "env": frozenset({"-S", "--split-string"}),
    "flock": frozenset({"-c", "--command"}),
    "su": frozenset({"-c", "--command", "--session-command"}),
    "runuser": frozenset({"-c", "--command", "--session-command"}),
    "script": frozenset({"-c", "--command"}),
    "sudo": frozenset({"-s", "-i", "--shell", "--login"}),
    "ssh": frozenset(),
    "watch": frozenset(),
    "parallel": frozenset(),
    "rsh": frozenset(),  # a remote shell (or a restricted sh): code either way
    "remsh": frozenset(),
    "tmux": frozenset(),  # its commands are shell commands
    "sg": frozenset(),  # sg GROUP COMMAND: run by /bin/sh -c
}
# A shell by another name: a version (ksh93, zsh-5.9, bash5.2), a static
# build (dash.static) or a restricted one (rbash, rksh, rzsh). Its script
# is that shell's; pasted as text into `ksh93 -c`, a value ran.
_SHELL_VARIANT = re.compile(
    r"^(?:r(?=(?:ba|k|z)sh))?(?P<shell>[a-z]+?)(?:[-_.]?[0-9][0-9a-z._-]*|[-.]static)?\Z"
)
# Builtins after which a script runs (or computes) text as code again.
_RERUN = frozenset({"eval", "trap", "let", "alias"})


@dataclass(frozen=True)
class ShellForms:
    """What the shell code of a command is: ``scripts``, the indexes of
    words that are a POSIX shell's script (placeholders there become
    variable references); ``opaque``, for each word whose placeholders are
    refused, the program that would run it as code."""

    scripts: frozenset[int]
    opaque: Mapping[int, str]


def _program(word: str) -> str:
    """The program a word names, a shell by another name as that shell."""
    name = PurePosixPath(word).name
    if name in POSIX_SHELLS or name in OTHER_SHELLS or name in _RUNNERS:
        return name
    found = _SHELL_VARIANT.match(name)
    if found and (found["shell"] in POSIX_SHELLS or found["shell"] in OTHER_SHELLS):
        return found["shell"]
    return name


def _posix_script(argv: Sequence[str], at: int) -> int | None:
    """Where the script of the POSIX shell ``argv[at]`` is: the index of
    its script (-c), len(argv) when it has none (a script file, stdin),
    None when an option is not understood."""
    j, command = at + 1, False
    while j < len(argv) and argv[j][:1] in ("-", "+") and len(argv[j]) > 1:
        option = argv[j]
        j += 1
        if option == "--":
            break
        if option.startswith("--"):
            if option in _LONG_WITH_ARG:
                j += 1
            elif option not in _LONG_FLAGS:
                return None
            continue
        letters = option[1:]
        if any(c not in _FLAG_LETTERS | _ARG_LETTERS for c in letters):
            return None
        command = command or (option[0] == "-" and "c" in letters)
        # Each letter that takes a word takes the next one (`-oO a b`).
        j += sum(c in _ARG_LETTERS for c in letters)
    if command:
        return j if j < len(argv) else len(argv)
    return len(argv)


def _runs_code(argv: Sequence[str], at: int) -> bool:
    """Whether the wrapper ``argv[at]`` hands a later word to a shell."""
    options = _RUNNERS[_program(argv[at])]
    if not options:
        return True
    for word in argv[at + 1 :]:
        name = word.split("=", 1)[0]
        if name in options:
            return True
        # A cluster of short options (`env -iS`, `flock -xc`).
        if word[:1] == "-" and word[1:2] != "-" and any(f"-{c}" in options for c in word[1:]):
            return True
    return False


def shell_forms(argv: Sequence[str]) -> ShellForms:
    """Which words of ``argv`` are shell code (see the module's doc)."""
    scripts: set[int] = set()
    opaque: dict[int, str] = {}
    for i, word in enumerate(argv):
        program = _program(word)
        why: str | None = None
        if program in POSIX_SHELLS:
            script = _posix_script(argv, i)
            if script is None:
                why = f"{program} with an option tfcluster cannot read"
            elif script < len(argv):
                scripts.add(script)
        elif program in OTHER_SHELLS or (program in _RUNNERS and _runs_code(argv, i)):
            why = program
        if why is not None:
            # Every later word may be (or reach) its code.
            for j in range(i + 1, len(argv)):
                opaque.setdefault(j, why)
    return ShellForms(frozenset(scripts - set(opaque)), opaque)


def refuse(name: str, why: str) -> ConfigError:
    return ConfigError(
        f"COMMAND: {{{name}}} is in shell code run by {why}, where no value can be put "
        f"safely; read the trial's variable ${name.upper()} there instead"
    )


def in_script(script: str, values: Mapping[str, str]) -> str:
    """``script`` (a POSIX shell's) with its placeholders as variable
    references, by the quotes around each (plain, '...' or "..."); a
    placeholder where the script runs or computes text again is refused."""
    out: list[str] = []
    quote = ""
    i = 0
    docs: list[tuple[str, bool, bool]] = []  # here-documents whose bodies start at the next line
    while i < len(script):
        if not quote and script.startswith("<<<", i):  # a here-string: a word as any
            out.append("<<<")
            i += 3
            continue
        if not quote and (doc := _HEREDOC.match(script, i)):
            word = doc["word"]
            docs.append((re.sub(r"['\"\\]", "", word), word != re.sub(r"['\"\\]", "", word),
                         bool(doc["tabs"])))  # fmt: skip
            out.append(doc.group(0))
            i = doc.end()
            continue
        if script[i] == "\n" and not quote and docs:
            out.append("\n")
            i += 1
            for delimiter, quoted, tabs in docs:
                i = _heredoc_body(script, i, delimiter, quoted, tabs, values, out)
            docs = []
            continue
        match = PLACEHOLDER.match(script, i)
        if match and match.group(1) in values:
            name = match.group(1)
            if (why := _rerun_before(script, i)) is not None:
                raise refuse(name, why)
            if quote == "'":
                raise ConfigError(
                    f"COMMAND: {{{name}}} is inside '...' in a shell script, where no value "
                    f'can be put safely; put it outside the quotes or in "..."'
                )
            ref = "${" + name.upper() + "}"
            out.append(ref if quote == '"' else f'"{ref}"')
            i = match.end()
            continue
        char = script[i]
        if char == "\\" and quote != "'":
            out.append(script[i : i + 2])
            i += 2
            continue
        if char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        out.append(char)
        i += 1
    return "".join(out)


# `<<WORD`, `<<-WORD`, `<< 'WORD'` (not `<<<`): a here-document's operator.
_HEREDOC = re.compile(r"<<(?!<)(?P<tabs>-?)[ \t]*(?P<word>[^\s;&|()<>]+)")


def _heredoc_body(
    script: str,
    i: int,
    delimiter: str,
    quoted: bool,
    tabs: bool,
    values: Mapping[str, str],
    out: list[str],
) -> int:
    """A here-document's body from ``i`` to its delimiter's line, into
    ``out``; where it ends. Quotes are text there (``"${NAME}"`` would give
    the program the quotes too): a placeholder is ``${NAME}``, expanded as
    data. Under a quoted delimiter (``<<'EOF'``) nothing expands: refused,
    as in '...'."""
    while i < len(script):
        end = script.find("\n", i)
        end = len(script) if end < 0 else end + 1
        line = script[i:end]
        if (line.rstrip("\n").lstrip("\t") if tabs else line.rstrip("\n")) == delimiter:
            out.append(line)
            return end
        for match in PLACEHOLDER.finditer(line):
            name = match.group(1)
            if name not in values:
                continue
            if quoted:
                raise ConfigError(
                    f"COMMAND: {{{name}}} is in a here-document with a quoted delimiter "
                    f"(<<'{delimiter}'), where no value expands; read ${name.upper()} there"
                )
            if (why := _rerun_before(script, i + match.start())) is not None:
                raise refuse(name, why)
        out.append(PLACEHOLDER.sub(lambda m: _ref(m, values), line))
        i = end
    return i


def _ref(match: re.Match[str], values: Mapping[str, str]) -> str:
    name = match.group(1)
    return "${" + name.upper() + "}" if name in values else match.group(0)


# A word of a script, roughly: what a shell would split it at, quotes dropped.
_WORD = re.compile(r"[^\s;&|()<>`'\"$]+")
# An array's subscript still open (`a[`, zsh's `$a[`).
_SUBSCRIPT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\[[^\]]*\Z")
# A declaration of integer variables (bash, ksh, zsh), whose assignments compute.
_INTEGER = re.compile(
    r"(?:^|[\s;&|(])(?:(?:declare|typeset|local|readonly|export)\s+(?:-[A-Za-z]*\s+)*"
    r"-[A-Za-z]*i|integer\s)"
)


def _unclosed(text: str, opener: str, closer: str) -> bool:
    """Whether ``text`` ends inside ``opener``...``closer`` (nested ones counted)."""
    depth, i = 0, 0
    while i < len(text):
        if text.startswith(opener, i):
            depth, i = depth + 1, i + len(opener)
            continue
        if text[i] == closer and depth:
            depth -= 1
        i += 1
    return depth > 0


def _rerun_before(script: str, at: int) -> str | None:
    """Why the text at ``at`` of a script would be run or computed again:
    it is inside an arithmetic or ``[[`` region, or after a word that runs
    text (a nested shell, whose quoting nests in this one's; a runner;
    eval...). None: it is data."""
    before = script[:at]
    for opener, closer, what in (("((", "))", "((...))"), ("[[", "]]", "[[...]]")):
        if before.count(opener) > before.count(closer):
            return f"the script's {what}"
    # Arithmetic that bash also evaluates, where "${NAME}" is no help (the
    # value is computed, and `a[$(cmd)]` in it runs): inside `${...}`
    # (`${x:N}`, `${a[N]}`), `$[...]`, an array's subscript (`a[N]=`), or
    # in a script that declares integer variables (`declare -i n; n=V`).
    if _unclosed(before, "${", "}") or _unclosed(before, "$[", "]"):
        return "the script's ${...}"
    if _SUBSCRIPT.search(before):
        return "the script's array subscript"
    if _INTEGER.search(before):
        return "the script's integer variables"
    words = _WORD.findall(before)
    for k, word in enumerate(words):
        program = _program(word)
        if program in POSIX_SHELLS or program in OTHER_SHELLS:
            return f"a {program} inside the script"
        if program in _RUNNERS and _runs_code(words, k):
            return f"a {program} inside the script"
        if program in _RERUN:
            return f"the script's {program}"
    return None
