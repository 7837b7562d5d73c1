"""A study in MLflow (MLFLOW.ENABLED): one parent run, whose id the study keeps, so that every worker
nests its trials under it; a trial's run is named after its folder, so a retry continues it."""
import logging
import os
from typing import Any, List, Sequence

from ..config import CfgNode
from ..integrations.mlflow import end_run, resolve_tracking_uri, start_parent_run
from ..utils.urls import mask_password

__all__ = ["PARENT_RUN_ATTR", "study_tracking_opts", "end_study_run"]

logger = logging.getLogger(__name__)

PARENT_RUN_ATTR = "mlflow_parent_run_id"


def _study_uri(cfg: CfgNode, study_dir: str) -> str:
    """The store of the study: the base config's, with the default store in the study folder."""
    where = cfg.clone()
    where.defrost()
    where.OUTPUT_DIR = study_dir
    return resolve_tracking_uri(where)


def study_tracking_opts(study: Any, cfg: CfgNode, study_dir: str, space: Any) -> List[str]:
    """The KEY VALUE overrides that nest each trial under the study's parent run, opened (params: the
    search space, objective, trial count) when the study has none; [] without MLFLOW.ENABLED."""
    if not cfg.MLFLOW.ENABLED:
        return []
    uri, parent = _study_uri(cfg, study_dir), study.user_attrs.get(PARENT_RUN_ATTR)
    if not parent:
        params = {"objective": f"{space.objective.direction} {space.objective.metric}",
                  "n_trials": study.user_attrs.get("n_trials", ""), "search_space": space.source,
                  **{key: str(dist) for key, dist in space.params.items()}}
        created = start_parent_run(uri, cfg.MLFLOW.EXPERIMENT, study.study_name, params,
                                   tags={"reid_engine.study": study.study_name})
        study.set_user_attr(PARENT_RUN_ATTR, created)
        parent = study.user_attrs.get(PARENT_RUN_ATTR, created)  # another worker may have set it at the same time
        if parent != created:
            end_run(uri, created, "KILLED")  # the other worker's run is the study's
    logger.info("MLflow: the trials are nested runs of run %s in %s", parent, mask_password(uri))
    return ["MLFLOW.TRACKING_URI", uri, "MLFLOW.PARENT_RUN_ID", parent]


def end_study_run(study: Any, cfg: CfgNode, study_dir: str, artifacts: Sequence[str]) -> None:
    """Attach the study's summary files to its parent run and end it FINISHED; a failure is one warning."""
    parent = study.user_attrs.get(PARENT_RUN_ATTR) if cfg.MLFLOW.ENABLED else None
    try:
        if parent:
            end_run(_study_uri(cfg, study_dir), parent, "FINISHED", [os.path.join(study_dir, a) for a in artifacts])
    except Exception as e:  # noqa: BLE001 - tracking must not fail a finished study
        logger.warning("MLflow: could not finish the study's run %s (%s)", parent, " ".join(str(e).split())[:200])
