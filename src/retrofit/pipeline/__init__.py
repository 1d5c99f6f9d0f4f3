"""Layer 6: ``retrofit run``, the pipeline: its recipe (``recipe``: a fine-tune recipe plus eval, export, card and push
sections) and its stages, resumable (``stages``); beside ``study/`` (docs/ARCHITECTURE.md)."""
