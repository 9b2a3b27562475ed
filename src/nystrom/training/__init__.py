"""The one training loop (pretraining, fine-tuning, LRA), its config, schedule, checkpoints and logs."""

from nystrom.training.config import TrainConfig
from nystrom.training.evaluate import evaluate
from nystrom.training.loop import global_batch, shutdown_distributed, train
from nystrom.training.schedule import linear_warmup_decay
from nystrom.training.task import Task

__all__ = ["Task", "TrainConfig", "evaluate", "global_batch", "linear_warmup_decay", "shutdown_distributed", "train"]
