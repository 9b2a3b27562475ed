"""``AUTO_CLASSES``: each transformers Auto class and the model of ours registered with it (loads both stacks)."""

import transformers

from nystrom._registration import AUTO_MODELS
from nystrom.model.modeling_heads import MODEL_CLASSES

#: transformers Auto class -> our model registered with it
AUTO_CLASSES = {getattr(transformers, auto): MODEL_CLASSES[name] for auto, name in AUTO_MODELS.items()}
