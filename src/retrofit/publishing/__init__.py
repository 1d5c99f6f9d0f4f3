"""Layer 6: what a run shows the world: its model card (``cards``, the facts it states in ``card_facts``) and
``retrofit push`` to the Hub (``hub``)."""
