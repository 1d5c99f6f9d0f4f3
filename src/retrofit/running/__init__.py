"""Layer 6, run: model cards, ``retrofit push``, the pipeline recipe and ``retrofit run``; beside
``study/`` (docs/ARCHITECTURE.md). Named ``running`` because ``retrofit.run`` is the facade's function."""
