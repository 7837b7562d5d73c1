"""The README's main job: the config its command names exists, is the job the README describes
(data set, epochs, output folder, results row) and draws ranks.png (TEST.RANK_VIS)."""
import os
import re

import pytest

from reid_engine.config import get_cfg
from reid_engine.engine.config_checks import check_config_values
from tests.conftest import REPO_ROOT


def _readme() -> str:
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        return f.read()


def _main_command(readme: str) -> str:
    """The command in the fenced block after the `<!-- main-command -->` marker."""
    match = re.search(r"<!-- main-command -->\s*```bash\n(.*?)\n```", readme, re.S)
    assert match, "README.md has no main-command block"
    return match.group(1)


@pytest.fixture(scope="module")
def main_job():
    """(README text, config path relative to the repository, loaded config)."""
    readme = _readme()
    match = re.search(r"--config-file (\S+)", _main_command(readme))
    assert match, _main_command(readme)
    path = match.group(1)
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, path))
    return readme, path, cfg


def test_the_readme_main_command_names_a_config_that_passes_the_run_checks(main_job):
    _, path, cfg = main_job
    assert path.startswith("configs/SyntheticReID/")
    check_config_values(cfg)
    assert cfg.DATASETS.NAMES == ("SyntheticReID",) and cfg.DATASETS.TESTS == ("SyntheticReID",)


def test_the_main_job_draws_ranks_png(main_job):
    assert main_job[2].TEST.RANK_VIS is True


def test_the_readme_describes_that_config(main_job):
    readme, path, cfg = main_job
    intro = readme.split("<!-- test-command -->")[0]
    epochs = re.search(r"The main job runs [\d,]+ iterations \((\d+) epochs\)", intro)
    assert epochs and int(epochs.group(1)) == cfg.SOLVER.MAX_EPOCH, intro[-1500:]
    assert f"`{cfg.OUTPUT_DIR}/`" in intro
    results_rows = [line for line in readme.splitlines() if line.startswith("|") and f"`{path}`" in line]
    assert results_rows, f"the README's results table has no row for {path}"
