"""Storage layer: naming and opening stores on any backend, atomic outputs, file formats. Never does math."""

from blocklin.storage.atomic import AtomicOutput, check_output_path
from blocklin.storage.backend import Backend, backend, remove, zarr_store
from blocklin.storage.cleanup import Leftover, clean
from blocklin.storage.location import Location, as_location
from blocklin.storage.zarr_store import (
    codec_chain,
    create_array,
    create_group,
    describe_codecs,
    open_zarr,
    read_block,
    store_path,
    write_array,
    write_block,
)

__all__ = [
    "AtomicOutput",
    "Backend",
    "Leftover",
    "Location",
    "as_location",
    "backend",
    "check_output_path",
    "clean",
    "codec_chain",
    "create_array",
    "create_group",
    "describe_codecs",
    "open_zarr",
    "read_block",
    "remove",
    "store_path",
    "write_array",
    "write_block",
    "zarr_store",
]
