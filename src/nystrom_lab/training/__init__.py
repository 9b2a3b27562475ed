"""The one training loop (pretraining, fine-tuning, LRA), its config, schedule, checkpoints and logs."""

from nystrom_lab.training.config import TrainConfig
from nystrom_lab.training.evaluate import evaluate
from nystrom_lab.training.loop import global_batch, shutdown_distributed, train
from nystrom_lab.training.schedule import linear_warmup_decay
from nystrom_lab.training.task import Task

__all__ = ["Task", "TrainConfig", "evaluate", "global_batch", "linear_warmup_decay", "shutdown_distributed", "train"]
