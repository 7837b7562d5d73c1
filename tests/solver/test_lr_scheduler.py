"""build_lr_scheduler: lr at chosen iterations of each schedule, ratios, state round trip."""
import io
import math

import pytest
import torch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.solver import build_lr_scheduler
from reid_engine.solver.lr_scheduler import check_lr_scheduler_config
from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.registry import UnknownChoiceError

BASE_LR = 0.1
IPE = 10  # iterations per epoch


def _optimizer():
    params = [nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))]
    # the second group stands for a head with HEADS_LR_FACTOR 10
    return torch.optim.SGD([{"params": [params[0]], "lr": BASE_LR},
                            {"params": [params[1]], "lr": BASE_LR * 10}], lr=BASE_LR)


def _cfg(**solver):
    cfg = get_cfg()
    cfg.SOLVER.update(dict(BASE_LR=BASE_LR, MAX_EPOCH=10, WARMUP_ITERS=20, WARMUP_FACTOR=0.1,
                           WARMUP_METHOD="linear", SCHED="MultiStepLR", STEPS=[4, 7], GAMMA=0.1,
                           DELAY_EPOCHS=0, ETA_MIN_LR=1e-4))
    cfg.SOLVER.update(solver)
    return cfg


def _lrs(scheduler, optimizer, iterations):
    """lr of both groups at iterations 0..iterations-1 (as the trainer would use them)."""
    out = []
    for _ in range(iterations):
        out.append(tuple(group["lr"] for group in optimizer.param_groups))
        optimizer.step()
        scheduler.step()
    return out


def _flat(lrs):
    return [lr for step in lrs for lr in step]


def _schedule(**solver):
    optimizer = _optimizer()
    scheduler = build_lr_scheduler(_cfg(**solver), optimizer, IPE)
    return _lrs(scheduler, optimizer, 10 * IPE + 3)


def test_linear_warmup_then_multistep():
    lrs = [lr[0] for lr in _schedule()]
    assert lrs[0] == pytest.approx(0.01)                   # warmup start: BASE_LR x WARMUP_FACTOR
    assert lrs[10] == pytest.approx(0.1 * (0.1 + 0.9 * 0.5))  # half way, linear
    assert lrs[19] == pytest.approx(0.1 * (0.1 + 0.9 * 19 / 20))
    assert lrs[20] == pytest.approx(0.1)                   # warmup end
    assert lrs[39] == pytest.approx(0.1)                   # last iteration before epoch 4
    assert lrs[40] == pytest.approx(0.01)                  # after the first step
    assert lrs[69] == pytest.approx(0.01)
    assert lrs[70] == pytest.approx(0.001)                 # after the second step
    assert lrs[99] == pytest.approx(0.001)
    assert lrs[102] == pytest.approx(0.001)                # stepped past the end: stays


def test_groups_keep_their_ratio():
    for lr0, lr1 in _schedule(SCHED="CosineAnnealingLR", DELAY_EPOCHS=3):
        assert lr1 == pytest.approx(10 * lr0)


def test_constant_warmup():
    lrs = [lr[0] for lr in _schedule(WARMUP_METHOD="constant")]
    assert lrs[0] == lrs[19] == pytest.approx(0.01)
    assert lrs[20] == pytest.approx(0.1)


def test_exp_warmup():
    lrs = [lr[0] for lr in _schedule(WARMUP_METHOD="exp")]
    assert lrs[0] == pytest.approx(0.01)
    assert lrs[10] == pytest.approx(0.1 * 0.1 ** 0.5)      # WARMUP_FACTOR ** (1 - 10/20)
    assert lrs[20] == pytest.approx(0.1)


def test_delayed_cosine():
    lrs = [lr[0] for lr in _schedule(SCHED="CosineAnnealingLR", DELAY_EPOCHS=4, WARMUP_ITERS=0)]
    eta = 1e-4
    assert lrs[0] == lrs[39] == lrs[40] == pytest.approx(0.1)   # flat until the delay ends
    # cosine over iterations 40..100
    assert lrs[70] == pytest.approx(eta + 0.5 * (0.1 - eta))
    assert lrs[55] == pytest.approx(eta + 0.5 * (0.1 - eta) * (1 + math.cos(math.pi * 15 / 60)))
    assert lrs[99] == pytest.approx(eta + 0.5 * (0.1 - eta) * (1 + math.cos(math.pi * 59 / 60)))
    assert lrs[100] == pytest.approx(eta, rel=1e-6)             # cosine end: ETA_MIN_LR


def test_cosine_without_delay_warms_up_to_the_cosine_value():
    lrs = [lr[0] for lr in _schedule(SCHED="CosineAnnealingLR", WARMUP_ITERS=20)]
    eta = 1e-4
    at_20 = eta + 0.5 * (0.1 - eta) * (1 + math.cos(math.pi * 20 / 100))
    assert lrs[0] == pytest.approx(0.01)
    assert lrs[20] == pytest.approx(at_20)
    assert lrs[19] == pytest.approx(0.01 + (at_20 - 0.01) * 19 / 20)  # continuous ramp


def test_warmup_longer_than_the_run_keeps_its_slope():
    optimizer = _optimizer()
    scheduler = build_lr_scheduler(_cfg(MAX_EPOCH=1, WARMUP_ITERS=20), optimizer, IPE)
    lrs = [lr[0] for lr in _lrs(scheduler, optimizer, IPE)]
    assert lrs[9] == pytest.approx(0.1 * (0.1 + 0.9 * 9 / 20))


def test_steps_beyond_the_run_are_ignored():
    lrs = [lr[0] for lr in _schedule(STEPS=[5, 12], WARMUP_ITERS=0)]
    assert lrs[49] == pytest.approx(0.1) and lrs[50] == pytest.approx(0.01) and lrs[100] == pytest.approx(0.01)


def test_state_round_trip_continues_the_same_sequence():
    cfg = _cfg(SCHED="CosineAnnealingLR", DELAY_EPOCHS=2)
    optimizer = _optimizer()
    scheduler = build_lr_scheduler(cfg, optimizer, IPE)
    _lrs(scheduler, optimizer, 35)
    buffer = io.BytesIO()
    torch.save({"scheduler": scheduler.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    expected = _lrs(scheduler, optimizer, 30)

    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # plain numbers only
    restored_optimizer = _optimizer()
    restored = build_lr_scheduler(cfg, restored_optimizer, IPE)
    restored_optimizer.load_state_dict(state["optimizer"])
    restored.load_state_dict(state["scheduler"])
    assert restored.last_epoch == 35
    assert _flat(_lrs(restored, restored_optimizer, 30)) == pytest.approx(_flat(expected))


def test_scheduler_restored_alone_sets_the_next_lr():
    cfg = _cfg()
    optimizer = _optimizer()
    scheduler = build_lr_scheduler(cfg, optimizer, IPE)
    _lrs(scheduler, optimizer, 45)
    fresh_optimizer = _optimizer()
    fresh = build_lr_scheduler(cfg, fresh_optimizer, IPE)
    fresh.load_state_dict(scheduler.state_dict())
    # the lr in use right now comes from the optimizer state; every later one from the scheduler
    assert _flat(_lrs(fresh, fresh_optimizer, 30)[1:]) == pytest.approx(_flat(_lrs(scheduler, optimizer, 30)[1:]))


@pytest.mark.parametrize("solver, pattern", [
    (dict(SCHED="StepLR"), "SOLVER.SCHED.*MultiStepLR"),
    (dict(WARMUP_METHOD="cosine"), "WARMUP_METHOD.*linear"),
    (dict(STEPS=[7, 4]), "STEPS"),
    (dict(SCHED="CosineAnnealingLR", DELAY_EPOCHS=10), "DELAY_EPOCHS"),
])
def test_bad_settings_are_clear_errors(solver, pattern):
    with pytest.raises(ReidUserError, match=pattern):
        build_lr_scheduler(_cfg(**solver), _optimizer(), IPE)


@pytest.mark.parametrize("solver, message", [
    (dict(SCHED="Foo"), "unknown SOLVER.SCHED 'Foo': choose one of MultiStepLR, CosineAnnealingLR$"),
    (dict(SCHED="cosineannealinglr"), "did you mean CosineAnnealingLR[?]"),
    (dict(WARMUP_METHOD="lin"), "unknown SOLVER.WARMUP_METHOD 'lin'.*did you mean linear[?]"),
])
def test_check_rejects_unknown_names_before_building(solver, message):
    with pytest.raises(UnknownChoiceError, match=message):
        check_lr_scheduler_config(_cfg(**solver))
    check_lr_scheduler_config(_cfg())  # the defaults pass


def test_empty_epoch_is_a_clear_error():
    with pytest.raises(ReidUserError, match="iters_per_epoch.*IMS_PER_BATCH"):
        build_lr_scheduler(_cfg(), _optimizer(), 0)
