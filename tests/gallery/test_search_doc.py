"""docs/search.md: every reid-* command of its shell blocks parses, and every config path it names exists."""
import os
import re
import shlex

from reid_engine.cli import export, index, train
from tests.conftest import REPO_ROOT

PARSERS = {"reid-index": index, "reid-export": export, "reid-train": train}


def _commands():
    with open(os.path.join(REPO_ROOT, "docs", "search.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.strip())
            if words:
                yield words[2:] if words[:2] == ["nice", "-n"] else words


def test_commands_parse_and_config_paths_exist():
    seen = 0
    for words in _commands():
        for word in words:
            if word.startswith("configs/"):
                assert os.path.isfile(os.path.join(REPO_ROOT, word)), word
        if words[0] in PARSERS:
            args = PARSERS[words[0]].build_parser().parse_args(words[1:])  # exits (fails) on a bad flag
            opts = getattr(args, "opts", None) or []
            # the trailing overrides are KEY VALUE pairs of config keys (no flag value swallowed them)
            assert len(opts) % 2 == 0 and all(k.split(".")[0].isupper() for k in opts[::2]), words
            seen += 1
    assert seen >= 10
