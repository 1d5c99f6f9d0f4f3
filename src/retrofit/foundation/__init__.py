"""Layer 0, foundation: what every other layer may use (errors, registries, the strict config loader,
atomic writes, versions, the run-folder layout, the import hooks). Imports nothing above it
(docs/ARCHITECTURE.md)."""
