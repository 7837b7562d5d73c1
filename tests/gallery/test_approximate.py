"""The approximate index: chosen by size, tuned to the recall target, recall reported against exact search."""
import numpy as np

from reid_engine.gallery import Location, approximate_recall, create_index, open_index, plan_index

from .conftest import contract_of, gallery_records, reid_like


def test_plan_follows_size_and_target():
    assert plan_index(10_000).kind == "flat"
    big = plan_index(1_000_000)
    assert big.kind == "ivf" and big.nlist == 8000
    assert plan_index(1_000_000, recall_target=1.0).kind == "flat"


def test_ivf_reaches_its_recall_target_and_survives_a_reopen(tmp_path):
    features, pids, camids = reid_like(num_ids=300, per_id=10, seed=3)
    location = Location(str(tmp_path / "g.rindex"))
    index = create_index(location, contract_of(features), len(features), kind="ivf", recall_target=0.95)
    index.add(features, gallery_records(pids, camids))
    index.save()
    plan = open_index(location).manifest.plan
    assert plan.kind == "ivf" and plan.nlist == min(int(8 * np.sqrt(len(features))), len(features) // 39)
    assert 1 <= plan.search_param < plan.nlist and plan.calibrated_recall >= 0.95
    queries = reid_like(num_ids=300, per_id=1, seed=3, spread=0.6)[0]  # unseen images of the same identities
    assert approximate_recall(open_index(location), queries, k=10) >= 0.9
