"""The defaults of ``retrofit.evaluate`` in one light module (no torch): ``evaluate()`` and the
``retrofit eval`` command line both read them."""

LENGTHS = ("1x", "2x", "4x", "8x")  # multiples of the evaluated model's native length
DATA = "stdlib"
BUDGET = 65536  # tokens scored per length
BATCH_SIZE = 1
POSITION_BUCKETS = 32
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
PASSKEY_TRIALS = 5
SEED = 0  # passkey keys; recall spans and text offsets
RECALL_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
RECALL_TRIALS = 10  # one forward pass each
RECALL_SPAN = 12  # tokens of the random span (k)
RECALL_CUE = 4  # of which the first m repeat at the end; the model continues with the other k - m
