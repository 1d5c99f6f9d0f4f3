"""Layer 2, patch: converting a model (``core``: convert / revert / describe), its state and attention
functions, its saved config, the lossless probe, the weight-decay rule; beside ``adapters/``
(docs/ARCHITECTURE.md)."""
