"""The event writers of file formats: metrics.json (:class:`JSONWriter`) and TensorBoard event files
(:class:`TensorboardXWriter`). The engine knows them only as ``utils.events.EventWriter``s
(``engine.setup.default_writers`` builds them)."""
import json
import os
import socket
import struct
import time
from typing import Dict, Iterable, List, Optional

from ..utils.events import EventStorage, EventWriter, collect_new_scalars, get_event_storage
from ..utils.file_io import RecordFile, write_failure

__all__ = ["JSONWriter", "TensorboardXWriter"]


def _not_written(iterations: Iterable[int]) -> str:
    """What a failed write leaves out and how to get it back, for its error message."""
    its = sorted(iterations)
    named = f"iteration {its[0]}" if len(its) == 1 else f"iterations {', '.join(map(str, its))}"
    # A resumed run repeats every step after the last checkpoint, and so writes these again.
    return f"then continue with --resume (the records of {named} are not in it)"


class JSONWriter(EventWriter):
    """Append one JSON object per iteration (with an ``iteration`` key) holding the
    scalars written since the previous write; flushed after every write."""

    def __init__(self, json_file: str, window_size: int = 20):
        """
        Args:
            json_file: path of the file; appended to when it exists.
            window_size: smoothing window (iterations) for scalars with a smoothing hint.

        Raises:
            FileWriteError: the file cannot be created or opened (one line).
        """
        self._path = json_file
        try:
            os.makedirs(os.path.dirname(os.path.abspath(json_file)), exist_ok=True)
            # Whole lines or nothing: a failed write never leaves half a line for the
            # resumed run to append after (the file would no longer parse).
            self._file_handle = RecordFile(json_file, "metrics to")
        except OSError as e:
            raise write_failure(json_file, e, "metrics to") from None
        self._window_size = window_size
        self._last_write = -1

    def write(self) -> None:
        """Append the lines for every iteration with new scalars (all of them, or none).

        Raises:
            FileWriteError: the disk is full (or another write failure): one line naming
                the file, the free space and the iterations whose records are not in it.
        """
        new = collect_new_scalars(get_event_storage(), self._window_size, self._last_write)
        if not new:
            return
        lines = "".join(json.dumps({**scalars, "iteration": itr}, sort_keys=True) + "\n" for itr, scalars in new.items())
        try:
            self._file_handle.write(lines)
            self._file_handle.flush()
        except OSError as e:
            raise write_failure(self._path, e, "metrics to", then=_not_written(new)) from None
        self._last_write = max(new)

    def close(self) -> None:
        """Close the file."""
        self._file_handle.close()


def _tfrecord(data: bytes) -> bytes:
    """One record of a tensorboard event file (TFRecord framing: length, CRCs, data)."""
    from tensorboardX.record_writer import masked_crc32c

    header = struct.pack("Q", len(data))
    return header + struct.pack("I", masked_crc32c(header)) + data + struct.pack("I", masked_crc32c(data))


class TensorboardXWriter(EventWriter):
    """Write new scalars, queued images and histograms to a tensorboard event file.

    The file (``events.out.tfevents.<time>.<host>``, tensorboard's format, built with
    tensorboardX's summary functions) is created on the first write. Each write appends
    its events whole and at once, in the calling thread: a failed write (disk full, size
    limit) raises here, at the iteration it happened, and never leaves half an event in
    the file. (tensorboardX's ``SummaryWriter`` writes from a background thread that
    dies on such an error, after which the training hangs on its full queue.)
    """

    def __init__(self, log_dir: str, window_size: int = 20, filename_suffix: str = ""):
        """
        Args:
            log_dir: directory of the event files.
            window_size: smoothing window (iterations) for scalars with a smoothing hint.
            filename_suffix: appended to the event file's name.
        """
        # Imported here, not at module level (slow; only tensorboard users pay it) and not
        # on first write (that would land inside the training loop).
        from tensorboardX import summary
        from tensorboardX.proto.event_pb2 import Event

        self._summary, self._event = summary, Event
        self._log_dir = log_dir
        self._window_size = window_size
        self._suffix = filename_suffix
        self._file: Optional[RecordFile] = None
        self._last_write = -1

    def _events(self, storage: EventStorage, new: Dict[int, Dict[str, float]]) -> List:
        """The events of this write: new scalars, then the queued images and histograms."""
        now, summary, event = time.time(), self._summary, self._event
        events = [event(wall_time=now, step=itr, summary=summary.scalar(name, value))
                  for itr, scalars in new.items() for name, value in scalars.items()]
        events += [event(wall_time=now, step=itr, summary=summary.image(name, img, dataformats="CHW"))
                   for name, img, itr in storage.images]
        for params in storage.histograms:
            params = dict(params)
            step = params.pop("global_step")
            events.append(event(wall_time=now, step=step, summary=summary.histogram_raw(params.pop("tag"), **params)))
        return events

    def write(self) -> None:
        """Publish new scalars, then the queued images and histograms (and clear them).

        Raises:
            FileWriteError: the disk is full (or another write failure): one line naming
                the file, the free space and the iterations whose events are not in it.
        """
        storage = get_event_storage()
        new = collect_new_scalars(storage, self._window_size, self._last_write)
        if not (new or storage.images or storage.histograms):
            return
        events = self._events(storage, new)
        path = self._file.name if self._file is not None else os.path.join(
            self._log_dir, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{self._suffix}")
        try:
            if self._file is None:
                os.makedirs(self._log_dir, exist_ok=True)
                self._file = RecordFile(path, "tensorboard events to")
                events.insert(0, self._event(wall_time=time.time(), file_version="brain.Event:2"))
            self._file.write(b"".join(_tfrecord(e.SerializeToString()) for e in events))
        except OSError as e:
            lost = set(new) | {itr for _, _, itr in storage.images} | {h["global_step"] for h in storage.histograms}
            raise write_failure(path, e, "tensorboard events to", then=_not_written(lost)) from None
        if new:
            self._last_write = max(new)
        storage.clear_images()
        storage.clear_histograms()

    def close(self) -> None:
        """Close the event file (if one was created)."""
        if self._file is not None:
            self._file.close()
            self._file = None
