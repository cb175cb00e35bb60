"""shadowsync: distributed training of recommendation models with pluggable synchronization.

    import shadowsync
    result = shadowsync.train(trainers=2, sync="s-bmuf", examples=200_000)
    model = result.model()  # or shadowsync.load("runs/..."): a plain torch.nn.Module

`import shadowsync` stays light: torch is imported when `train` runs.
"""

from __future__ import annotations

# The name `train` is both the subpackage shadowsync/train/ and the API function. Importing a
# subpackage for the first time binds it as an attribute of its parent, which would replace
# the function the first time a run imports shadowsync.train.*; so the (docstring-only)
# subpackage is loaded here first, and the function bound after it. `from shadowsync.train.X
# import Y` is unaffected: it finds the subpackage in sys.modules.
from shadowsync import train as _train_package  # noqa: F401  (see above)
from shadowsync.lifecycle.stop import install_in_job_process

# A process of a job takes over Ctrl-C / SIGTERM before it imports anything slow.
install_in_job_process()

from shadowsync.api import RunResult, train  # noqa: E402
from shadowsync.config import TrainConfig  # noqa: E402
from shadowsync.inference import export, load  # noqa: E402

__version__ = "0.1.0"
__all__ = ["RunResult", "TrainConfig", "__version__", "export", "load", "train"]
