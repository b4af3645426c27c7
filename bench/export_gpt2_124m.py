#!/usr/bin/env python3
"""Exports a GPT-2 124M (nanoGPT-style: vocab 50257, 12 layers, 12 heads, d 768, block 1024, tied
lm_head, causal F.scaled_dot_product_attention, GELU tanh) with random seeded weights as a PT2
archive (torch.export.save), batch dynamic 1..64, sequence 1024. Run on the GPU machine with PyTorch
2.11: python3 bench/export_gpt2_124m.py OUTDIR [--dtype float32|bfloat16]; also writes the state_dict
as OUTDIR/gpt2_124m_<dtype>.pt (torch.save) for bench-engine --weights. Not committed (big)."""
import argparse, math, os, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln_1 = nn.LayerNorm(d)
        s.c_attn = nn.Linear(d, 3 * d)
        s.c_proj = nn.Linear(d, d)
        s.ln_2 = nn.LayerNorm(d)
        s.fc = nn.Linear(d, 4 * d)
        s.proj = nn.Linear(4 * d, d)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, s.h, C // s.h).transpose(1, 2)
        k = k.view(B, T, s.h, C // s.h).transpose(1, 2)
        v = v.view(B, T, s.h, C // s.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.proj(F.gelu(s.fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, vocab=50257, block=1024, n_layer=12, n_head=12, d=768):
        super().__init__()
        s.wte = nn.Embedding(vocab, d)
        s.wpe = nn.Embedding(block, d)
        s.h = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        s.ln_f = nn.LayerNorm(d)
        s.lm_head = nn.Linear(d, vocab, bias=False)
        s.lm_head.weight = s.wte.weight

    def forward(s, idx):
        B, T = idx.shape
        x = s.wte(idx) + s.wpe(torch.arange(0, T, dtype=torch.long, device=idx.device))
        for b in s.h:
            x = b(x)
        return s.lm_head(s.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    torch.manual_seed(0)
    m = GPT().eval().to(getattr(torch, a.dtype))
    idx = torch.randint(0, 50257, (2, 1024))
    t0 = time.time()
    ep = torch.export.export(m, (idx,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    path = os.path.join(a.outdir, f"gpt2_124m_{a.dtype}.train.pt2")
    torch.export.save(ep, path)
    print(f"exported {path} in {time.time() - t0:.1f} s ({os.path.getsize(path) / 2**20:.0f} MiB)")
    # The same weights as an ordinary checkpoint (torch.save of the
    # state_dict; the tied wte/lm_head storage once), for bench-engine
    # --weights (load_to_device and the streaming start rows).
    sd_path = os.path.join(a.outdir, f"gpt2_124m_{a.dtype}.pt")
    torch.save(m.state_dict(), sd_path)
    print(f"saved {sd_path} ({os.path.getsize(sd_path) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
