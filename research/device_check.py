"""The GPU check, prepared to run once on a lent CUDA machine (no network there): every scheme in bf16 through
the kernel the table picks against the fp32 CPU reference (the chunked kernel), forward and training-step time
against stock SDPA at 4k, 16k and 32k tokens (2 layers of GPT-2-small width), and a LoRA fine-tune of a
GPT-2-small-shaped model at 4k for a few dozen steps with its peak memory. Writes ``device_check.json`` and
``device_check.md`` into --out.

    bash research/device_check.sh                 # on the GPU machine: OUT=... (the device tool's folder)
    python research/device_check.py --dry-run     # here: the same code on the CPU at tiny sizes, fp32

Without a CUDA GPU and without --dry-run it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from harness import stamp, write_record


def _time(fn, device: str, repeats: int) -> float:
    import torch

    fn()  # warm up (compiles, caches)
    out = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _model(layers: int, width: int, heads: int, positions: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        n_positions=positions,
        vocab_size=50257,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(cfg).eval()


OPTIONS = {"extend": {"length": "4x"}}  # a scheme that needs an option to convert


def correctness(schemes, device, dtype, length, width, heads) -> list[dict]:
    """Each scheme's logits on ``device`` in ``dtype`` (the auto kernel) against fp32 on the CPU (chunked)."""
    import torch

    import retrofit

    out = []
    for scheme in schemes:
        torch.manual_seed(0)
        base = _model(2, width, heads, 1024)
        ref = retrofit.convert(_model(2, width, heads, 1024), scheme, kernel="chunked", **OPTIONS.get(scheme, {}))
        ref.load_state_dict(base.state_dict(), strict=False)
        ids = torch.randint(0, 50257, (1, length))
        with torch.inference_mode():
            want = ref(input_ids=ids).logits.float()
        fast = retrofit.convert(base, scheme, **OPTIONS.get(scheme, {}))
        fast.load_state_dict(ref.state_dict())
        fast.to(device=device, dtype=dtype)
        with torch.inference_mode():
            got = fast(input_ids=ids.to(device)).logits.float().cpu()
        scale = want.abs().max().item()
        out.append(
            {
                "scheme": scheme,
                "length": length,
                "kernel": retrofit.describe(fast).get("last_kernel"),
                "max_abs_diff": (got - want).abs().max().item(),
                "relative": (got - want).abs().max().item() / scale,
            }
        )
    return out


def speed(schemes, device, dtype, lengths, width, heads, repeats) -> list[dict]:
    """Forward and forward+backward of 2 layers, each scheme over stock SDPA (learned table as long as the input)."""
    import torch

    import retrofit

    rows = []
    for L in lengths:
        ids = torch.randint(0, 50257, (1, L), device=device)
        stock = _model(2, width, heads, L).to(device=device, dtype=dtype)
        stock.config._attn_implementation = "sdpa"
        for mode in ("forward", "train"):
            base_t = _time(lambda: _step(stock, ids, mode), device, repeats)
            for scheme in schemes:
                m = retrofit.convert(_model(2, width, heads, 1024), scheme, **OPTIONS.get(scheme, {}))
                m.to(device=device, dtype=dtype)
                t = _time(lambda: _step(m, ids, mode), device, repeats)
                rows.append(
                    {
                        "scheme": scheme,
                        "length": L,
                        "mode": mode,
                        "seconds": t,
                        "stock_seconds": base_t,
                        "x_stock": t / base_t,
                        "kernel": retrofit.describe(m).get("last_kernel"),
                    }
                )
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def _step(model, ids, mode: str) -> None:
    import torch

    if mode == "forward":
        with torch.inference_mode():
            model.transformer(input_ids=ids)
        return
    model.train()
    out = model.transformer(input_ids=ids).last_hidden_state
    out.float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    model.eval()


def finetune(device, dtype, length, layers, width, heads, steps) -> dict:
    """LoRA (PEFT, r 8 on c_attn) on a converted GPT-2-small-shaped model: tokens/s and peak memory."""
    import torch
    from peft import LoraConfig, get_peft_model

    import retrofit

    model = retrofit.convert(_model(layers, width, heads, 1024), "alibi").to(device=device, dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    model.train()
    t0, losses = time.perf_counter(), []
    for _ in range(steps):
        ids = torch.randint(0, 50257, (1, length), device=device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {
        "scheme": "alibi",
        "method": "lora r8",
        "length": length,
        "layers": layers,
        "steps": steps,
        "tokens_per_s": steps * length / seconds,
        "peak_memory_mib": peak / 2**20 if peak else None,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "kernel": retrofit.describe(model.get_base_model()).get("last_kernel"),
    }


def markdown(record: dict) -> str:
    lines = [
        f"Device: {record['device']} ({record['dtype']}), torch {record['torch']}",
        "",
        "| scheme | kernel | max abs diff vs fp32 CPU | relative |",
        "|---|---|---:|---:|",
    ]
    lines += [
        f"| {r['scheme']} | {r['kernel']} | {r['max_abs_diff']:.3g} | {r['relative']:.3g} |"
        for r in record["correctness"]
    ]
    lines += ["", "| scheme | mode | length | x stock SDPA | seconds | kernel |", "|---|---|---:|---:|---:|---|"]
    lines += [
        f"| {r['scheme']} | {r['mode']} | {r['length']:,} | {r['x_stock']:.2f} | {r['seconds']:.4f} | {r['kernel']} |"
        for r in record["speed"]
    ]
    f = record["finetune"]
    mem = f"{f['peak_memory_mib']:,.0f} MiB" if f["peak_memory_mib"] else "–"
    lines += [
        "",
        f"LoRA fine-tune ({f['layers']} layers, {f['length']:,} tokens, {f['steps']} steps, {f['kernel']}): "
        f"{f['tokens_per_s']:,.0f} tokens/s, peak {mem}, loss {f['loss_first']:.3f} -> {f['loss_last']:.3f}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="the same code on the CPU at tiny sizes (fp32)")
    p.add_argument("--out", default="device_check", help="folder for device_check.json and device_check.md")
    p.add_argument("--schemes", default=None, help="comma-separated (default: every registered scheme)")
    a = p.parse_args(argv)
    import torch

    from retrofit.foundation.versions import cpu_info
    from retrofit.scheme import SCHEMES

    cuda = torch.cuda.is_available()
    if not cuda and not a.dry_run:
        print("device_check: no CUDA GPU here: nothing to check (--dry-run runs the same code on the CPU)")
        return 0
    device, dtype = ("cuda", torch.bfloat16) if cuda and not a.dry_run else ("cpu", torch.float32)
    schemes = a.schemes.split(",") if a.schemes else sorted(SCHEMES.names())
    small = device == "cpu"
    width, heads = (64, 4) if small else (768, 12)
    t0 = time.perf_counter()
    record = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu (dry run): {cpu_info()['processor']}",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        **stamp(),
    }
    record["correctness"] = correctness(schemes, device, dtype, 64 if small else 1024, width, heads)
    print(json.dumps(record["correctness"], indent=1), flush=True)
    record["speed"] = speed(
        schemes, device, dtype, [128, 256] if small else [4096, 16384, 32768], width, heads, 1 if small else 3
    )
    record["finetune"] = finetune(
        device, dtype, 128 if small else 4096, 2 if small else 12, width, heads, 3 if small else 40
    )
    record["seconds"] = time.perf_counter() - t0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_record(out / "device_check.json", record)
    (out / "device_check.md").write_text(markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
