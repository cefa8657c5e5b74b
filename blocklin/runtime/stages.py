"""Resumable steps: an operation as a sequence of steps whose results are recorded as they finish.

One mechanism, two uses:

* :class:`StepRecords`: the result of each finished step (a pass's reductions, a norm, the outcome of
  a refinement step), written whole under a folder once the step is complete and read back instead
  of running the step again. A solve whose output is written at the end keeps them beside its
  output's resume markers, named by the pass (and by a token of the pass's input where it depends on
  an earlier result, as a refinement pass on ``x`` does).
* :class:`Stages`: an operation of many steps over intermediate stores (the inverse; the square and
  stored-Gram solves), whose records are numbered in the order the steps run.

An operation resumes after SIGKILL or Ctrl-C by running the same steps again in the same order and
skipping those already recorded. :class:`Stages` keeps, in a work folder with a deterministic name
(:meth:`blocklin.runtime.job.Job.work_dir`):

* the intermediate stores, named ``NAME-N.zarr`` in creation order (the same on every rerun);
* one record per finished step, ``stages/NNNNN-NAME.pkl``, holding what the step returned. A record
  is written (atomically) only after the step's output is complete, so a step counts as done only
  when its output is committed; an interrupted step is run again from the start.

Two rules make a rerun produce the same bits as an uninterrupted run: every step is deterministic
in its inputs (tile sums and pass reductions in a fixed order), and no step writes a region it
reads, so a step run again finds its inputs as the first attempt did.

The work folder is tied to the operation's output: a run identity is written to both, and a rerun
continues only when they agree (an output partial removed by hand, or a work folder removed by a
cleanup, starts the operation over instead of mixing old and new intermediates). Its name holds the
inputs' content stamps (:meth:`~blocklin.runtime.job.Job.work_dir`), and an output whose inputs
changed starts over (:mod:`blocklin.storage.stamps`), so an input rewritten since the interrupted
run never meets that run's steps. :class:`StepRecords` beside the output's markers go with them.
The output also records where its work folder is: a rerun under another temp dir finds no steps
in its own folder and starts over there (the temp dir it is given holds its intermediates), removing
the folder the interrupted run kept in the first temp dir, which no rerun could continue any more
(a rerun without ``resume`` removes it with the partial output, :class:`~blocklin.storage.atomic.AtomicOutput`).
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Callable
from typing import Any

from blocklin.storage.atomic import is_done, mark_done
from blocklin.storage.backend import backend, remove
from blocklin.storage.location import Location
from blocklin.storage.records import OWNER_RECORD, WORK_FOLDER_RECORD
from blocklin.storage.zarr_store import create_array

_RUN = "run-id"


class StepRecords:
    """Results of finished steps recorded under ``folder`` (a :class:`Location`), or nowhere (None).

    Parameters
    ----------
    folder : Location or None
        Where the records go (through the storage backend: object stores too). ``None``: nothing is
        recorded and every step runs.
    replay : bool
        Use the records found there (a rerun that continues); without it every step runs and its
        record is (re)written.

    Attributes
    ----------
    loaded : list of str
        Names of the steps whose recorded result was used instead of running them.
    """

    def __init__(self, folder: Location | None, *, replay: bool = True) -> None:
        self.folder, self.replay = folder, replay
        self._be = backend(folder) if folder is not None else None
        self.loaded: list[str] = []

    def run(self, name: str, step: Callable[[], Any]) -> Any:
        """``step()``, or its recorded result; the result is recorded (atomically) once the step returns.

        A record is the step's return value, pickled: the run's own data, read back only by a rerun of
        the same operation on the same inputs."""
        if self._be is None:
            return step()
        key = f"{name.replace('/', '_').replace(' ', '_')[:60]}.pkl"
        if self.replay:
            raw = self._be.try_read(key)
            if raw is not None:
                self.loaded.append(name)
                return pickle.loads(raw)
        result = step()
        self._be.write_bytes(key, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return result


class Stages:
    """The recorded steps and intermediate stores of one operation.

    Parameters
    ----------
    folder : Location
        The work folder (:meth:`~blocklin.runtime.job.Job.work_dir`).
    marker_dir : Location
        Folder of the output's resume markers (``AtomicOutput.done``): the run identity is
        recorded there too.
    resume : bool
        Continue the steps recorded in ``folder`` when the output carries the same run identity.
    codec : str, optional
        Codec of the intermediate stores.
    start : callable, optional
        Run on a fresh start before the run identity is recorded (create the output there: creating
        it may clear the output's folder, markers included).

    Attributes
    ----------
    resumed : bool
        Whether an earlier run's steps are being continued.
    skipped : int
        Steps whose recorded result was used instead of running them.
    """

    def __init__(self, folder: Location, marker_dir: Location, *, resume: bool, codec: str | None = None,
                 start: Callable[[], Any] | None = None) -> None:
        self.folder, self.codec = folder, codec
        self._be = backend(folder)
        raw = self._be.try_read(_RUN)
        run = raw.decode() if raw is not None else None
        self.resumed = bool(resume and run and is_done(marker_dir, f"run-{run}"))
        if not self.resumed:
            self._drop_previous(marker_dir)
            self._clear()
            if start is not None:
                start()
            run = uuid.uuid4().hex[:16]
            self._be.write_bytes(_RUN, run.encode())
            mark_done(marker_dir, f"run-{run}")
            backend(marker_dir).write_bytes(WORK_FOLDER_RECORD, folder.url.encode())
        self._stores = 0
        self._steps = 0
        self.records = StepRecords(folder / "stages", replay=self.resumed)

    def _drop_previous(self, marker_dir: Location) -> None:
        """Remove the work folder the output names as its earlier run's when it is another one than
        this run's (that run kept it under another temp dir): starting over, no rerun can continue
        it. Before ``start``, which may clear the output's markers, and before this run records its own,
        so a kill at any point leaves no folder that no output names."""
        from blocklin.storage.cleanup import named_work, remove_named_work
        from blocklin.storage.ownership import read_record

        output = (read_record(self.folder) or {}).get("for_output")
        if output:
            remove_named_work(named_work(marker_dir), output=output, keep=self.folder,
                              why=f"kept in another temp dir; this run starts its steps over in {self.folder.url}")

    @property
    def skipped(self) -> int:
        """Steps whose recorded result was used instead of running them."""
        return len(self.records.loaded)

    def _clear(self) -> None:
        """Empty the work folder of what an earlier run left, keeping this run's owner record."""
        if self.folder.is_local:
            os.makedirs(self.folder.url, exist_ok=True)
            for entry in os.listdir(self.folder.url):
                if entry != OWNER_RECORD:
                    self._be.remove(entry)
        else:
            self._be.delete_many([k for k in self._be.keys("") if k != OWNER_RECORD])

    def store(self, name: str, shape: tuple[int, int], dtype: Any, chunks: tuple[int, int]) -> Location:
        """The next intermediate store ``NAME-N.zarr`` (created, or kept when a resumed run made it)."""
        self._stores += 1
        path = self.folder / f"{name}-{self._stores}.zarr"
        if not (self.resumed and backend(path).exists("zarr.json")):
            create_array(path, shape=shape, dtype=dtype, chunks=chunks, codec=self.codec, overwrite=True)
        return path

    def run(self, name: str, step: Callable[[], Any]) -> Any:
        """``step()``, or its recorded result when a resumed run finished it; the result is recorded."""
        self._steps += 1
        return self.records.run(f"{self._steps:05d}-{name.replace('/', '_').replace(' ', '_')[:40]}", step)

    @staticmethod
    def drop(path: Location) -> None:
        """Remove an intermediate store no later step reads."""
        remove(path)


__all__ = ["StepRecords", "Stages"]
