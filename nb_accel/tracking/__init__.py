"""``nb_accel.tracking``: where Accelerate's ``accelerate.tracking`` names are (the tracker
classes, :class:`GeneralTracker` for trackers of your own, ``on_main_process``)."""

from ..runtime.tracking.base import GeneralTracker, on_main_process
from ..runtime.tracking.hosted_trackers import (
    ClearMLTracker,
    CometMLTracker,
    SwanLabTracker,
    TrackioTracker,
)
from ..runtime.tracking.live_chart import LiveChartTracker
from ..runtime.tracking.local_trackers import AimTracker, DVCLiveTracker
from ..runtime.tracking.mlflow_tracker import MLflowTracker
from ..runtime.tracking.registry import (
    LOGGER_TYPE_TO_CLASS,
    MissingTrackerLibraryError,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from ..runtime.tracking.tensorboard_tracker import TensorBoardTracker
from ..runtime.tracking.wandb_tracker import WandBTracker

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "LiveChartTracker",
    "MLflowTracker",
    "MissingTrackerLibraryError",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
]
