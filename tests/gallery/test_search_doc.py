"""docs/search.md: every reid-index command of its shell blocks parses, and every config path it names exists."""
import os
import re
import shlex

from reid_engine.cli import index as index_cli
from tests.conftest import REPO_ROOT


def _commands():
    with open(os.path.join(REPO_ROOT, "docs", "search.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.strip())
            if words:
                yield words[2:] if words[:2] == ["nice", "-n"] else words


def test_reid_index_commands_parse_and_config_paths_exist():
    seen = 0
    for words in _commands():
        for word in words:
            if word.startswith("configs/"):
                assert os.path.isfile(os.path.join(REPO_ROOT, word)), word
        if words[0] == "reid-index":
            args = index_cli.build_parser().parse_args(words[1:])  # exits (fails the test) on an unknown flag
            assert args.action in index_cli.ACTIONS
            assert all(o.isupper() or "/" in o or o.replace(".", "").isdigit() for o in getattr(args, "opts", []) or [])
            seen += 1
    assert seen >= 8
