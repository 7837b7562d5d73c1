"""The synthetic tracking sequence: deterministic frames, boxes inside them, pairs that meet and hide each other."""
import dataclasses

import numpy as np
import pytest

from reid_engine.data.synthetic import TINY_SPEC
from reid_engine.data.synthetic.sequence import TINY_SEQUENCE_SPEC, plan_walkers, render_sequence

SPEC = dataclasses.replace(TINY_SEQUENCE_SPEC, people=TINY_SPEC)


@pytest.fixture(scope="module")
def sequence():
    return render_sequence(SPEC)


def test_frames_and_ground_truth(sequence):
    height, width = SPEC.frame_size
    assert len(sequence.frames) == len(sequence.boxes) == len(sequence.ids) == SPEC.num_frames
    assert all(f.shape == (height, width, 3) and f.dtype == np.uint8 for f in sequence.frames)
    boxes = np.concatenate(sequence.boxes)
    assert boxes.min() >= 0 and boxes[:, 2].max() <= width and boxes[:, 3].max() <= height + 2
    np.testing.assert_allclose(boxes[:, 3] - boxes[:, 1], 2 * (boxes[:, 2] - boxes[:, 0]), rtol=1e-5)  # 2:1 crops
    assert set(np.concatenate(sequence.ids).tolist()) == {1, 2}
    assert all(len(set(ids.tolist())) == len(ids) for ids in sequence.ids)


def test_the_pair_meets_turns_back_and_one_hides_the_other(sequence):
    first, second = plan_walkers(SPEC)
    gap = np.abs(first.xs - second.xs)
    meet = int(np.argmin(gap))
    assert gap[meet] < 0.1 * gap[0] and 0 < meet < SPEC.num_frames - 1
    # turning back: after the meeting each goes back to its own side
    assert first.xs[-1] < first.xs[meet] < second.xs[-1]
    assert len(sequence.ids[meet]) == 1 and len(sequence.ids[0]) == 2  # the farther one is hidden at the meeting
    hidden = ({1, 2} - set(sequence.ids[meet].tolist())).pop()
    assert hidden == min((first, second), key=lambda w: w.feet_y).track_id
    # people are drawn: the frame differs from frame to frame where they walk
    assert np.abs(sequence.frames[0].astype(int) - sequence.frames[meet]).mean() > 1.0


def test_the_same_spec_renders_the_same_sequence(sequence):
    again = render_sequence(SPEC)
    assert all(np.array_equal(a, b) for a, b in zip(sequence.frames, again.frames))
    assert all(np.array_equal(a, b) for a, b in zip(sequence.boxes, again.boxes))
    other = render_sequence(dataclasses.replace(SPEC, seed=1))
    assert not np.array_equal(other.boxes[0], sequence.boxes[0])
