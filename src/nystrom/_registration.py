"""Registering our models with transformers' Auto classes without importing transformers (or torch).

``import nystrom`` must stay cheap (``nystrom --help`` answers in a fraction of a second) and still make
``AutoConfig``/``AutoModel*``/``pipeline`` load our folders. So registration runs when transformers' own
Auto modules are imported (a post-import hook on ``transformers.models.auto.configuration_auto`` and
``...modeling_auto``), or at once if they already are. Until the model stack is imported, the Auto
mappings hold stand-ins (:class:`LazyModelClass`) that import it on first use, as transformers' own
mappings hold class *names*; ``nystrom.model.modeling_heads`` swaps in the real classes when it loads.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings
from collections.abc import Callable

MODEL_TYPE = "nystrom-nystromformer"
#: transformers Auto class name -> the name of our class registered with it
AUTO_MODELS: dict[str, str] = {
    "AutoModel": "NystromformerModel",
    "AutoModelForMaskedLM": "NystromformerForMaskedLM",
    "AutoModelForPreTraining": "NystromformerForPreTraining",
    "AutoModelForSequenceClassification": "NystromformerForSequenceClassification",
    "AutoModelForTokenClassification": "NystromformerForTokenClassification",
    "AutoModelForQuestionAnswering": "NystromformerForQuestionAnswering",
    "AutoModelForMultipleChoice": "NystromformerForMultipleChoice",
}
_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODEL_AUTO = "transformers.models.auto.modeling_auto"
_HEADS = "nystrom.model.modeling_heads"


class LazyModelClass:
    """Stands for one of our model classes in an Auto mapping: attribute access and calls go to the real
    class, imported on first use. ``__name__`` and ``config_class`` answer without importing it."""

    def __init__(self, name: str, config_class: type) -> None:
        self.__name__ = self.__qualname__ = name
        self.config_class = config_class

    def real(self) -> type:
        return getattr(importlib.import_module(_HEADS), self.__name__)

    def __getattr__(self, attr: str):
        return getattr(self.real(), attr)

    def __call__(self, *args, **kwargs):
        return self.real()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<lazy {_HEADS}.{self.__name__}>"


def register_config() -> None:
    from transformers.models.auto.configuration_auto import AutoConfig

    from nystrom.model.configuration_nystromformer import NystromformerConfig

    AutoConfig.register(MODEL_TYPE, NystromformerConfig, exist_ok=True)


def register_models() -> None:
    """Our classes with every Auto class: the real ones when the model stack is loaded, else stand-ins."""
    from transformers.models.auto import modeling_auto

    from nystrom.model.configuration_nystromformer import NystromformerConfig

    heads = sys.modules.get(_HEADS)
    for auto, name in AUTO_MODELS.items():
        cls = getattr(heads, name, None) or LazyModelClass(name, NystromformerConfig)
        getattr(modeling_auto, auto).register(NystromformerConfig, cls, exist_ok=True)


def models_loaded() -> None:
    """Called by ``modeling_heads`` once its classes exist: replace the stand-ins where transformers'
    Auto classes are already loaded (otherwise the hook registers the real classes later)."""
    if _MODEL_AUTO in sys.modules:
        register_models()


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the callbacks (a failing callback warns instead of breaking the import)."""

    def __init__(self, loader, callbacks: list[Callable[[], None]]) -> None:
        self.loader, self.callbacks = loader, callbacks

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its real loader
        self.loader.exec_module(module)
        for callback in self.callbacks:
            try:
                callback()
            except Exception as err:  # transformers must import even if registering ours fails
                warnings.warn(f"nystrom could not register its models with transformers: {err!r}", stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader another finder returns for a watched module."""

    def __init__(self) -> None:
        self.watch: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watch:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.watch.pop(fullname))
        return spec


_HOOK = _AfterImport()


def install() -> None:
    """Register now with whatever of transformers' Auto modules is loaded; hook the rest."""
    for module, callback in ((_CONFIG_AUTO, register_config), (_MODEL_AUTO, register_models)):
        if module in sys.modules:
            callback()
        else:
            _HOOK.watch.setdefault(module, []).append(callback)
    if _HOOK.watch and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
