"""Conversion and I/O around the models: from and to transformers' Nystromformer (``interop_hf``,
``export_hf``, the shared key mapping ``interop_keys``), BERT/RoBERTa import (``interop_bert``), folders
written before the models were transformers models (``legacy``), long conversion (``long``), moving an
encoder between heads and attention variants (``transfer``), safe checkpoint reading (``weights``) and
tokenizer folders (``tokenizer``). Built on :mod:`nystrom.model`; the public path for all of it stays
``nystrom.model`` (and ``nystrom``), which re-exports the entry points."""
