"""Check the commands, imports and links of Markdown pages against the code, so that docs cannot rot silently.

What is checked (docs/development.md, "Docs that are tested"):

- every fenced shell block (```bash, ```sh, ```shell): each `reid-*` command and each
  `python tools/<script>.py` / `torchrun ... tools/<script>.py` line parses with the command's real
  argument parser (the `build_parser()` of its module in reid_engine.cli, found from setup.py's
  console scripts and the tools/ wrappers; unknown flags are errors); scripts that are no command
  (tools/benchmarks/*.py, tools/gpu_acceptance.py, ...) must exist and use only flags their source
  declares; every config file a line names (`--config-file`, `configs/...`) exists; every `KEY VALUE`
  override names a real config key (`reid_engine.config.get_cfg()`);
- every ```python block: its imports resolve (reid_engine names down to the attribute);
- every relative link `[text](path)` resolves to a file or folder, and its `#anchor` to a heading there.

A block that is deliberately not runnable (a placeholder, a user's own file) is preceded by the line
``<!-- docs-test: skip (why) -->``; the reason is required.
"""
import ast
import contextlib
import glob
import importlib
import importlib.util
import io
import os
import re
import shlex
import textwrap
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Set

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHELL_LANGS = {"bash", "sh", "shell"}
PYTHON_LANGS = {"python", "py"}
SKIP_MARKER = re.compile(r"<!--\s*docs-test:\s*skip\s*\((.+?)\)\s*-->")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CONFIG_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
# a shell word a command line may start with before the command itself (a loop body, a wrapper)
_PREFIX_WORDS = {"do", "then", "else", "time", "exec", "env", "sudo"}
# files a run or the reader makes: a config path there need not exist in the checkout
_MADE_BY_A_RUN = ("output/", "/")


@dataclass
class Block:
    """One fenced block of a Markdown file."""

    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    skip_reason: Optional[str] = None

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def markdown_files(root: str = REPO_ROOT) -> List[str]:
    """README.md, the other top-level pages and every page under docs/ (recursively), relative to `root`."""
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "*.md")))
    files += sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "**", "*.md"),
                                                                   recursive=True))
    return files


def fenced_blocks(text: str, path: str = "<text>") -> List[Block]:
    """The fenced blocks of a Markdown text, each with the skip reason of a marker on the line before it."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match or not match.group(2) and not _opens_block(lines, i):
            i += 1
            continue
        start, lang, body = i, match.group(2).lower(), []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = SKIP_MARKER.search(previous)
        blocks.append(Block(path, start + 1, lang, textwrap.dedent("\n".join(body)), marker.group(1) if marker else None))
        i += 1
    return blocks


def _opens_block(lines: List[str], i: int) -> bool:
    """A bare ``` line opens a block when a closing fence follows (it is never a stray closing one)."""
    return any(line.strip().startswith("```") for line in lines[i + 1:])


def shell_commands(text: str) -> List[List[str]]:
    """The simple commands of a shell block: continuations joined, comments, redirections and separators removed."""
    joined = re.sub(r"\\\n", " ", text)
    commands = []
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        try:
            tokens = list(lexer)
        except ValueError as error:  # an unclosed quote
            raise DocError(f"cannot split the shell line {line.strip()!r}: {error}") from None
        current: List[str] = []
        skip_next = False
        for token in tokens:
            if skip_next:  # the target of a redirection
                skip_next = False
            elif token in _SEPARATORS:
                commands.append(current)
                current = []
            elif set(token) <= set("<>&") and any(c in token for c in "<>"):
                skip_next = True
                if current and current[-1].isdigit():  # the file descriptor of `2>&1`
                    current.pop()
            else:
                current.append(token)
        commands.append(current)
    return [c for c in commands if c]


class DocError(Exception):
    """One problem found in a page."""


class CommandTable:
    """The documented commands: console scripts, tools/ wrappers and scripts, and their parsers."""

    def __init__(self, root: str = REPO_ROOT):
        self.root = root
        with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
            self.console = dict(re.findall(r'"(reid-[\w-]+)=reid_engine\.cli\.(\w+):main"', f.read()))
        self.wrappers: Dict[str, str] = {}  # tools/x.py -> cli module name
        for path in glob.glob(os.path.join(root, "tools", "*.py")):
            with open(path, encoding="utf-8") as f:
                match = re.search(r"from reid_engine\.cli\.(\w+) import main", f.read())
            if match:
                self.wrappers[os.path.relpath(path, root)] = match.group(1)
        self._flags: Dict[str, Set[str]] = {}

    def parser_for(self, script: str):
        """The real parser of a command or script, or None for a script without a `build_parser()`."""
        module = self.console.get(script) or self.wrappers.get(script)
        if module is not None:
            return importlib.import_module(f"reid_engine.cli.{module}").build_parser()
        path = os.path.join(self.root, script)
        with open(path, encoding="utf-8") as f:
            if not re.search(r"^def build_parser\(", f.read(), re.M):
                return None
        spec = importlib.util.spec_from_file_location(f"_doccheck_{os.path.basename(script)[:-3]}", path)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)  # its import lines only: scripts run their work under __main__
        return loaded.build_parser()

    def script_flags(self, script: str) -> Set[str]:
        """The option strings a script's source passes to add_argument (a script that is no command)."""
        if script not in self._flags:
            with open(os.path.join(self.root, script), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            flags = {"-h", "--help"}
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                    flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                              and a.value.startswith("-")}
            self._flags[script] = flags
        return self._flags[script]


def _strip_prefix(words: List[str]) -> List[str]:
    """The command without leading environment assignments, loop keywords and `nice -n N`."""
    while words:
        if _ENV_ASSIGNMENT.match(words[0]) or words[0] in _PREFIX_WORDS:
            words = words[1:]
        elif words[0] == "nice":
            words = words[3:] if len(words) > 2 and words[1] == "-n" else words[1:]
        else:
            break
    return words


def _parse(parser, argv: Sequence[str]):
    """Parse with the real parser; its error message (not a SystemExit) on a bad command line."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parser.parse_args(list(argv))
        except SystemExit as stop:
            if stop.code in (0, None):  # --help
                return None
            message = err.getvalue().strip().splitlines()
            raise DocError(message[-1] if message else f"exit {stop.code}") from None


class Checker:
    """Checks blocks and pages; `problems` collects one line per problem."""

    def __init__(self, root: str = REPO_ROOT, commands: Optional[CommandTable] = None):
        self.root = root
        self.commands = commands or CommandTable(root)
        self.problems: List[str] = []
        self._keys: Optional[Set[str]] = None
        self.checked_commands = 0

    # -- config ----------------------------------------------------------------------------------------------
    @property
    def config_keys(self) -> Set[str]:
        if self._keys is None:
            from reid_engine.config import get_cfg

            self._keys = set(_flatten(get_cfg()))
        return self._keys

    def _check_config_path(self, path: str) -> None:
        if "$" in path or path.startswith(_MADE_BY_A_RUN):
            return
        if not os.path.exists(os.path.join(self.root, path)):
            raise DocError(f"config file {path} does not exist")

    def _check_key(self, key: str) -> None:
        if key not in self.config_keys:
            raise DocError(f"unknown config key {key}")

    # -- commands --------------------------------------------------------------------------------------------
    def check_command(self, words: List[str]) -> None:
        """Check one simple shell command (a command that is none of ours is left alone)."""
        words = _strip_prefix(words)
        if not words:
            return
        script, argv = self._target(words)
        if script is None:
            return
        self.checked_commands += 1
        for i, word in enumerate(argv):
            if word == "--config-file" and i + 1 < len(argv):
                self._check_config_path(argv[i + 1])
            elif word.startswith("--config-file="):
                self._check_config_path(word.split("=", 1)[1])
            elif word.startswith("configs/"):
                self._check_config_path(word)
        parser = self.commands.parser_for(script)
        if parser is not None:
            args = _parse(parser, argv)
            opts = list(getattr(args, "opts", None) or [])
            if len(opts) % 2:
                raise DocError(f"config overrides must be KEY VALUE pairs, got {' '.join(opts)}")
            for key in opts[::2]:
                self._check_key(key)
            return
        flags = self.commands.script_flags(script)
        for word in argv:
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and flag not in flags:
                raise DocError(f"{script} has no flag {flag}")
            if _CONFIG_KEY.match(word):
                self._check_key(word)

    def _target(self, words: List[str]):
        """(script or command name, its argv), or (None, None) for a command that is none of ours."""
        first = words[0]
        if first.startswith("reid-"):
            if first not in self.commands.console:
                raise DocError(f"no command {first} (setup.py installs {', '.join(sorted(self.commands.console))})")
            return first, words[1:]
        if first in ("python", "python3", "torchrun") or first.endswith("/python"):
            for i, word in enumerate(words[1:], start=1):
                if word == "-m":
                    return None, None
                if word.startswith("tools/") and word.endswith(".py"):
                    if not os.path.exists(os.path.join(self.root, word)):
                        raise DocError(f"no script {word}")
                    return word, words[i + 1:]
        return None, None

    # -- blocks and pages ------------------------------------------------------------------------------------
    def check_block(self, block: Block) -> None:
        if block.skip_reason is not None:
            return
        try:
            if block.lang in SHELL_LANGS:
                for words in shell_commands(block.text):
                    try:
                        self.check_command(words)
                    except DocError as error:
                        raise DocError(f"{error} in `{shlex.join(words)[:160]}`") from None
            elif block.lang in PYTHON_LANGS:
                self.check_python(block.text)
        except DocError as error:
            self.problems.append(f"{block.where()}: {error}")

    def check_python(self, code: str) -> None:
        try:
            tree = ast.parse(code)
        except SyntaxError as error:
            raise DocError(f"Python block does not parse: {error}") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _check_module(alias.name)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                _check_module(node.module)
                if node.module.split(".")[0] == "reid_engine":
                    module = importlib.import_module(node.module)
                    for alias in node.names:
                        if not hasattr(module, alias.name) and \
                                importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                            raise DocError(f"cannot import {alias.name} from {node.module}")

    def check_links(self, path: str, text: str) -> None:
        base = os.path.dirname(os.path.join(self.root, path))
        in_fence = False
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip().startswith("```"):
                in_fence = not in_fence
            if in_fence:
                continue
            for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):  # not in code spans
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                linked = os.path.normpath(os.path.join(base, file_part)) if file_part else os.path.join(self.root, path)
                if not os.path.exists(linked):
                    self.problems.append(f"{path}:{number}: link to {target}, which does not exist")
                elif anchor and linked.endswith(".md") and anchor not in heading_anchors(linked):
                    self.problems.append(f"{path}:{number}: link to {target}: no such heading in {file_part or path}")

    def check_page(self, path: str, text: Optional[str] = None) -> None:
        if text is None:
            with open(os.path.join(self.root, path), encoding="utf-8") as f:
                text = f.read()
        for block in fenced_blocks(text, path):
            self.check_block(block)
        self.check_links(path, text)


def heading_anchors(path: str) -> Set[str]:
    """The anchors GitHub gives the headings of a Markdown file (lower case, punctuation dropped, spaces -> -)."""
    anchors, in_fence = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip().startswith("```"):
                in_fence = not in_fence
            match = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if match:
                anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-"))
    return anchors


def _check_module(name: str) -> None:
    try:
        found = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        found = None
    if found is None:
        raise DocError(f"cannot import {name}")


def _flatten(node, prefix: str = "") -> Iterator[str]:
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, name + ".")
        else:
            yield name


def docstring_as_written(module) -> str:
    """The module docstring's source text between its quotes (escapes not interpreted)."""
    with open(module.__file__, encoding="utf-8") as f:
        source = f.read()
    node = ast.parse(source).body[0]
    literal = ast.get_source_segment(source, node.value)
    literal = literal.lstrip("rRuU")
    quote = literal[:3] if literal[:3] in ('"""', "'''") else literal[0]
    return literal[len(quote):-len(quote)]


def help_examples(help_text: str) -> str:
    """The example command lines of a --help text (with their continuation lines), as one shell block."""
    lines, keep, continued = [], [], False
    for line in help_text.splitlines():
        stripped = line.strip()
        if continued or re.match(r"^(reid-|torchrun |python3? tools/)", stripped):
            keep.append(stripped)
            continued = stripped.split("#", 1)[0].rstrip().endswith("\\")
            if not continued:
                lines.append("\n".join(keep))
                keep = []
    return "\n".join(lines)
