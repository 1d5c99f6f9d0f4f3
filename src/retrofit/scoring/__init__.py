"""Scoring a model on tokens, shared by the evaluation and the training (layer 3: neither imports the other).

- ``tokens``: a data spec's documents and the token stream every model of a run scores.
- ``windows``: the windows a long stream is read through (sliding, centred).
- ``losses``: a causal LM's per-token losses (non-overlapping and sliding windows) and last logits.
- ``masking``: the masked-LM draw (BERT's 80/10/10, seeded); ``masked``: a masked LM's per-token losses.
- ``copying``: one copy trial of retrieval at distance, its score and a cell's summary.
"""
