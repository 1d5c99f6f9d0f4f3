"""Layer 3, models: save / load, model sources, the classes transformers loads a checkpoint as,
built-in names, offline assets, data specs, the stand-ins (docs/ARCHITECTURE.md)."""
