"""``nb_accel.utils.operations``: where ``accelerate.utils.operations`` names are."""

from ..runtime.collectives.ops import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_for_metrics,
    gather_object,
    pad_across_processes,
    reduce,
)
from ..runtime.collectives.tensor_sharing import copy_tensor_to_devices
from ..runtime.device_backends.shape_checks import DistributedOperationException
from ..runtime.training.precision import convert_outputs_to_fp32, convert_to_fp32
from ..runtime.tree import (
    concatenate,
    find_batch_size,
    find_device,
    get_data_structure,
    initialize_tensors,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

__all__ = [
    "DistributedOperationException",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_for_metrics",
    "gather_object",
    "get_data_structure",
    "initialize_tensors",
    "listify",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
]
