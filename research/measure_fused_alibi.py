"""Precision of ALiBi's fused kernel (``sdpa-alibi-dims``, ``src/retrofit/kernels/sdpa_alibi_dims.py``) against an
fp64 reference of the paper's equation, per length: max |output - reference| of one attention call over random q, k, v (12 heads of 64,
GPT-2 small's ALiBi slopes), the last ``--rows`` query rows of each length (where the keys are most), a few
seeds; the chunked kernel beside it. The bound stated in the README and ``sdpa_alibi_dims.py`` comes from this run.

    python research/measure_fused_alibi.py --out benchmarks/fused_alibi_precision.json
"""

from __future__ import annotations

import argparse
import json

import torch

from harness import command, stamp, write_record
from retrofit.kernels import Call, attend, sdpa_alibi_dims
from retrofit.scheme.alibi import alibi_slopes


def errors(T: int, heads: int, dim: int, rows: int, seed: int, dtype=torch.float32) -> dict[str, float]:
    """max |fused - fp64| and max |chunked - fp64| over the last ``rows`` queries of one call of length T."""
    slopes = torch.tensor(alibi_slopes(heads))
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, T, dim, generator=g) for _ in range(3))
    R, scaling = min(rows, T), dim**-0.5
    bias = lambda h, i, j: -slopes.double()[h.long()] * (i - j)  # noqa: E731
    with torch.no_grad():
        ref, _ = attend(
            Call(q[:, :, -R:].double(), k.double(), v.double(), scaling, bias=bias, q_start=T - R), "chunked"
        )
        out = sdpa_alibi_dims.attend_alibi(Call(q.to(dtype), k.to(dtype), v.to(dtype), scaling, slopes=slopes))[
            :, :, -R:
        ]
        chunked, _ = attend(
            Call(
                q[:, :, -R:].to(dtype),
                k.to(dtype),
                v.to(dtype),
                scaling,
                bias=lambda h, i, j: -slopes[h.long()] * (i - j),
                q_start=T - R,
            ),
            "chunked",
        )
    return {"fused": float((out.double() - ref).abs().max()), "chunked": float((chunked.double() - ref).abs().max())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,2048,4096,8192")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1024, help="query rows compared per length (the last ones)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/fused_alibi_precision.json")
    a = ap.parse_args(argv)
    rows = []
    for T in (int(x) for x in a.lengths.split(",")):
        per_seed = [errors(T, a.heads, a.dim, a.rows, s) for s in range(a.seeds)]
        row = {"length": T, **{k: max(e[k] for e in per_seed) for k in ("fused", "chunked")}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    record = {
        "command": command(__file__, argv),
        "setup": {
            "heads": a.heads,
            "dim": a.dim,
            "rows": a.rows,
            "seeds": a.seeds,
            "dtype": "float32",
            "max_span": sdpa_alibi_dims.MAX_SPAN,
        },
        **stamp(),
        "rows": rows,
    }
    write_record(a.out, record)


if __name__ == "__main__":
    main()
