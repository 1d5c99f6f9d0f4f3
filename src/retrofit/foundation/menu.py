"""The schemes by name with a one-line summary each, without importing torch: ``retrofit --help`` lists
them at once. The registry (``retrofit.encodings.SCHEMES``) is the truth; tests/cli/test_errors_cli.py
checks that this menu names every registered scheme and nothing else."""

from __future__ import annotations

SCHEMES = {
    "alibi": "score bias linear in the distance, one slope per head (Press et al.)",
    "extend": "the learned table stretched to a longer one: rows copied (Longformer) or interpolated",
    "fire": "learned MLP of the log-transformed, length-normalised distance (Li et al. 2023)",
    "nezha": "fixed sinusoidal relative vectors of the clipped offset, query-dependent (NEZHA)",
    "nope": "no positions: the causal mask alone carries order",
    "rope": "rotary q/k, optionally rescaled: PI, NTK, YaRN, dynamic",
    "shaw": "learned per-offset bias clipped at max_distance (Shaw et al.)",
    "sinusoidal": "fixed absolute sinusoids added to the embeddings",
    "t5": "learned bucketed relative bias (T5)",
    "xl": "Transformer-XL relative positions: query-dependent sinusoid projection, u and v biases",
}


def schemes_help() -> str:
    width = max(map(len, SCHEMES))
    lines = ["schemes (retrofit convert MODEL --to SCHEME; options: retrofit convert --help):"]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in SCHEMES.items()]
    return "\n".join(lines)
