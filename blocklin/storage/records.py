"""Names of the records blocklin keeps beside the data it writes (one place, read by every module that
writes or checks them: the commit protocol, ownership, cleanup, resume)."""

#: Deferred zarr metadata of a node inside an uncommitted output (object-store commit protocol).
DEFERRED_META = ".blocklin-meta.json"
#: Record of an output being written in place; its removal is the commit (see storage.atomic).
PENDING_RECORD = ".blocklin-pending.json"
#: The owner record of a partial output or work folder (:mod:`blocklin.storage.ownership`).
OWNER_RECORD = ".blocklin-owner.json"
#: The content stamps of a resumable output's inputs, in its partial (:mod:`blocklin.storage.stamps`).
INPUTS_RECORD = ".blocklin-inputs.json"
#: The largest magnitudes a writer saw, with the content stamp they hold for
#: (:mod:`blocklin.storage.recorded_peaks`); not part of any content stamp.
PEAKS_RECORD = ".blocklin-peaks.json"
#: Each column's peak of that record, raw little-endian float64 (read only where asked for).
PEAKS_COLUMNS = ".blocklin-peaks.f8"
#: In a resumable output's marker folder: the URL of the work folder that holds the steps of the run
#: it records (:class:`blocklin.runtime.stages.Stages`), so that the work folder goes with that run
#: wherever the temp dir of the run that replaces it is (:func:`blocklin.storage.cleanup.remove_named_work`).
WORK_FOLDER_RECORD = "work-folder"
#: Suffix of the record beside a file export ``NAME``: ``.NAME`` + this (:mod:`blocklin.storage.file_records`).
FILE_RECORD_SUFFIX = ".blocklin"
