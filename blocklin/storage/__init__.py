"""Storage layer: zarr arrays, atomic outputs, file formats. Never does math."""

from blocklin.storage.atomic import AtomicOutput, check_output_path
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
    "check_output_path",
    "codec_chain",
    "create_array",
    "create_group",
    "describe_codecs",
    "open_zarr",
    "read_block",
    "store_path",
    "write_array",
    "write_block",
]
